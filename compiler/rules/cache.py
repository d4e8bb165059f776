"""CACHE: stage a tile of a tensor in a faster memory, or keep an accumulator in registers.

Tile staging (D3, F5): every read of `tensor` inside the scope of binder `at` (a reduction or
fold index; omitted: the whole body) has the form tensor[base₀ + v₀, …] where the vᵢ are the
`over` indices (each with a fixed extent) and the bases use only indices bound outside the
scope.  The rule binds a buffer holding that tile and reads through it:

    before:  sum(ko < ceil(K/32): sum(ki < 32: A[128*io + ii, 32*ko + ki] * …))
    after:   sum(ko < ceil(K/32): let A_s[r0 < 128, r1 < 32] @shared
                                    = [128*io + r0 < M && 32*ko + r1 < K] ? A[128*io + r0, 32*ko + r1] : 0
                                  in sum(ki < 32: A_s[ii, ki] * …))

Out-of-range elements of a tail tile are zero-filled (what a guarded cp.async does).  Reads of the
tile may use different tile indices of equal extents (dK reads Q[i, e5] in its score and Q[i, e]
in its product: one tile, `over: [ii, e5, e]`), each read then goes through the buffer at its
own indices.  The tile
must be reused: some enclosing index the tile does not depend on must have extent ≥ 2.
`stages` > 1 asks for a multi-buffered pipeline when `at` is a sequential index.  Several sums
binding `at` over one extent (FUSE-SUMS `inner`: GQA's dV and dK sums over the query tiles io,
siblings under the group sum) form one scope: each stages the tile alike, under one buffer name.

Accumulator (D5): `accumulator: ko` marks the sum over ko as accumulated at `level` in `dtype`.

Theorem: cache_read / cache_read2 (lean/Derivc/Rules/Cache.lean, proofs_ci/coq).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import Field, model_validator

from ..ir import (
    AccFact, Aff, Binding, Cond, Const, Def, Expr, Ext, Fold, Let, Program, Read, Reduce, Select, Softmax,
    fresh, map_children, names_in_program, replace_reads, walk,
)
from ..errors import did_you_mean
from . import register
from .base import Facts, Rule, StepParams, const_aff, const_extent, enclosing_binders, find_binder, replace_node


class CacheParams(StepParams):
    def_: str = Field(alias="def")
    """the definition whose reads are staged, or whose sum is accumulated"""
    tensor: str | None = None
    """the tensor whose tile is staged (give tensor or accumulator, not both)"""
    at: str | None = None
    """the reduction or fold index the tile is staged per (omitted: once for the whole body)"""
    over: tuple[str, ...] = ()
    """the indices the tile spans, one per staged dimension (each of a fixed extent)"""
    level: Literal["shared", "register"] = "shared"
    """where the tile or accumulator lives: shared memory or registers"""
    stages: int = Field(default=1, ge=1, le=4)
    """buffers of a shared tile staged per `at` step: > 1 asks for a multi-buffered pipeline"""
    name: str | None = None
    """the staged buffer's name (default: <tensor>_s or <tensor>_r)"""
    accumulator: str | None = None
    """a sum index whose running sum is kept at `level` in `dtype` (instead of `tensor`)"""
    dtype: Literal["f32", "f16"] = "f32"
    """the accumulator's dtype"""
    new_names = ("name",)

    @model_validator(mode="after")
    def _one_kind(self) -> "CacheParams":
        if (self.tensor is None) == (self.accumulator is None):
            raise ValueError("give either tensor (tile staging) or accumulator (a sum index)")
        if self.tensor is not None and not self.over:
            raise ValueError("tile staging needs over: the indices the tile spans")
        return self


def _scope(d: Def, at: str | None) -> tuple[Expr, list[Expr]]:
    """(the node whose body is the scope, the expressions forming the scope)."""
    if at is None:
        return d.body, [d.body]
    node = find_binder(d, at)
    if isinstance(node, Reduce):
        return node, [x.body for x in sibling_sums(d, node)]
    if isinstance(node, Fold):
        return node, [b.value for b in node.binds] + list(node.update)
    return None, []


def sibling_sums(d: Def, node: Reduce) -> list[Reduce]:
    """The sums of d binding node's index over its extent: node alone, or the sums FUSE-SUMS gave one
    index inside a shared outer sum (GQA's dV / dK tile sums under the group sum), staged alike."""
    return [x for x in walk(d.body) if isinstance(x, Reduce) and x.var == node.var and x.ext == node.ext]


class Cache(Rule):
    name = "cache"
    kind = "CACHE"
    theorem = "cache_read"
    also = ("cache_read2",)
    Params = CacheParams

    def check(self, prog: Program, p: CacheParams) -> Facts:
        d = self.get_def(prog, p.def_)
        if p.accumulator is not None:
            self.require_index(d, p.accumulator, "accumulator")
            node = find_binder(d, p.accumulator)
            if not isinstance(node, Reduce) or node.op != "sum":
                raise self.fail(f"accumulator {p.accumulator} of {p.def_} is not a sum")
            if p.level != "register":
                raise self.fail("an accumulator lives in registers (level: register)")
            if node.acc is not None:
                raise self.fail(f"the sum over {p.accumulator} already has an accumulator ({node.acc.level} {node.acc.dtype})")
            return {"accumulator": p.accumulator, "level": p.level, "dtype": p.dtype, "site": node,
                    "theorem": "cache_read"}
        t = p.tensor
        if t not in prog.input_map() and not prog.has_def(t):
            known = [n for n, _ in prog.inputs] + [x.name for x in prog.defs]
            raise self.unknown(f"parameter tensor: unknown tensor {t!r}{did_you_mean(t, known)} (tensors: {', '.join(known)})")
        if p.at is not None:
            self.require_index(d, p.at, "at")
        for k, v in enumerate(p.over):
            self.require_index(d, v, f"over[{k}]")
        scope_node, scope = _scope(d, p.at)
        if scope_node is None:
            raise self.fail(f"index {p.at} of {p.def_} is not a reduction or fold index")
        reads = [r for e in scope for r in walk(e) if isinstance(r, Read) and r.tensor == t]
        total = sum(1 for r in walk(d.body) if isinstance(r, Read) and r.tensor == t)
        if not reads:
            raise self.fail(f"{t} is not read inside the scope of {p.at or p.def_}")
        if len(reads) != total:
            raise self.fail(f"{t} is also read outside the scope of {p.at}; cache it at an outer index")
        extents = self._extents(prog, d)
        for v in p.over:
            if v not in extents:
                raise self.fail(f"index {v} in over is not bound in {p.def_}")
            if extents[v] is None:
                raise self.fail(f"index {v} has a dynamic extent; a tile must have a fixed size (tile it first)")
        inner = self._bound_inside(d, scope_node, scope)
        pattern = None
        spanned_all: set[str] = set()
        for r in reads:
            pat = []
            for a in r.idx:
                vs = [v for v in p.over if a.coef(v)]
                if len(vs) > 1:
                    raise self.fail(f"{t}[{', '.join(map(str, r.idx))}]: position {a} spans two tile indices")
                v = vs[0] if vs else None
                if v is not None and a.coef(v) != 1:
                    raise self.fail(f"{t}[{', '.join(map(str, r.idx))}]: {v} must appear with stride 1")
                base = a.subst(v, Aff()) if v else a
                leak = base.names() & inner
                if leak:
                    raise self.fail(
                        f"{t}[{', '.join(map(str, r.idx))}] depends on {sorted(leak)}, bound inside the "
                        f"scope but not in over; the tile would not be one block"
                    )
                pat.append((v, base))
            if pattern is None:
                pattern = pat
            elif not _same_tile(pat, pattern, extents):
                raise self.fail(f"reads of {t} use different tiles; cache each one separately")
            vs = [v for v, _ in pat if v]
            if len(set(vs)) != len(vs):
                raise self.fail(f"{t}[{', '.join(map(str, r.idx))}] reads two tile positions at one index")
            spanned_all.update(vs)
        spanned = [v for v, _ in pattern if v]
        if sorted(spanned_all) != sorted(p.over):
            raise self.fail(f"over {list(p.over)} does not match the indices of {t} ({sorted(spanned_all)})")
        base_names = set().union(*(b.names() for _, b in pattern))
        enclosing = [lp.var for lp in d.loops] + [
            x.var for x in enclosing_binders(d.body, reads[0]) if hasattr(x, "var")
        ]
        reuse_vars = [v for v in enclosing if v not in base_names and v not in p.over]
        reuse = 1
        for v in reuse_vars:
            reuse *= extents[v] if extents[v] is not None else 2
        if reuse < 2:
            raise self.fail(f"each element of the {t} tile is read once (reuse 1); caching it gains nothing")
        name = p.name or fresh(f"{t}_{'s' if p.level == 'shared' else 'r'}", names_in_program(prog))
        if name in names_in_program(prog):
            raise self.unknown(f"parameter name: name {name} is already used in the program")
        tshape = prog.tensor_type(t).dims
        guards = []
        for (v, base), dim in zip(pattern, tshape):
            if v is None:
                continue
            n = const_aff(prog, dim)
            if n is None or n % extents[v] != 0:
                guards.append(str(dim))
        return {
            "tensor": t, "buffer": name, "level": p.level, "stages": p.stages,
            "tile": [extents[v] for v in spanned], "reuse": reuse, "reuse_over": reuse_vars,
            "zero_fill_dims": guards, "pattern": pattern, "site": scope_node, "theorem": "cache_read2",
        }

    def _extents(self, prog: Program, d: Def) -> dict[str, int | None]:
        out = {lp.var: const_extent(prog, lp.ext) for lp in d.loops}
        for e in walk(d.body):
            if isinstance(e, (Reduce, Fold, Softmax)):
                out[e.var] = const_extent(prog, e.ext) if len(e.ext.parts) == 1 else None
            if isinstance(e, Fold):
                for b in e.binds:
                    for v, x in b.dims:
                        out[v] = const_extent(prog, x)
            if isinstance(e, Let):
                for v, x in e.bind.dims:
                    out[v] = const_extent(prog, x)
        return out

    def _bound_inside(self, d: Def, node: Expr, scope: list[Expr]) -> set[str]:
        from ..ir import bound_here

        out: set[str] = set()
        for e in scope:
            for x in walk(e):
                out |= bound_here(x)
        return out

    def rewrite(self, prog: Program, p: CacheParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        node = facts["site"]
        if p.accumulator is not None:
            new = replace(node, acc=AccFact(p.level, p.dtype))
            return prog.with_def(replace(d, body=replace_node(d.body, node, new)))
        t, name = facts["tensor"], facts["buffer"]
        pattern = facts["pattern"]
        taken = set(names_in_program(prog))
        dims: list[tuple[str, Ext]] = []
        idx: list[Aff] = []
        conds: list[Cond] = []
        tshape = prog.tensor_type(t).dims
        extents = self._extents(prog, d)
        for k, ((v, base), dim) in enumerate(zip(pattern, tshape)):
            if v is None:
                idx.append(base)
                continue
            r = fresh(f"r{len(dims)}", taken)
            taken.add(r)
            dims.append((r, Ext.of(extents[v])))
            idx.append(base + Aff.of(r))
            if str(dim) in facts["zero_fill_dims"]:
                conds.append(Cond(base + Aff.of(r), "<", dim))
        value: Expr = Read(t, tuple(idx))
        if conds:
            value = Select(tuple(conds), value, Const(0.0))
        bind = Binding(name, tuple(dims), value, p.level, p.stages, source=t)
        positions = [k for k, (v, _) in enumerate(pattern) if v]

        def via_buffer(r: Read) -> Expr:  # each read at its own tile indices (the same tile, _same_tile)
            return Read(name, tuple(Aff.of(next(v for v in p.over if r.idx[k].coef(v))) for k in positions))

        if p.at is None:
            body = Let(bind, replace_reads(d.body, t, via_buffer))
        elif isinstance(node, Reduce):
            sites = sibling_sums(d, node)

            def staged(e: Expr) -> Expr:
                if any(e is x for x in sites):
                    return replace(e, body=Let(bind, replace_reads(e.body, t, via_buffer)))
                return map_children(e, staged)

            body = staged(d.body)
        elif isinstance(node, Fold):
            new = replace(
                node,
                binds=(bind,) + tuple(replace(b, value=replace_reads(b.value, t, via_buffer)) for b in node.binds),
                update=tuple(replace_reads(u, t, via_buffer) for u in node.update),
            )
            body = replace_node(d.body, node, new)
        return prog.with_def(replace(d, body=body))


def _same_tile(pat: list, first: list, extents: dict[str, int | None]) -> bool:
    """Two reads of one tile: the same base at every position and, where the first spans a tile
    index, an index of the same fixed extent (dK's Q[i, e5] in the score, Q[i, e] in the product)."""
    if len(pat) != len(first):
        return False
    for (v, base), (w, base0) in zip(pat, first):
        if base != base0 or (v is None) != (w is None):
            return False
        if v is not None and extents.get(v) != extents.get(w):
            return False
    return True


register(Cache())
