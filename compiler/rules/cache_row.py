"""CACHE of a row: stage the slice of a tensor along its last dimension once, and read it there.

    before:  def Y[r, c] = let M @register = max(k < C: X[r, k]) in exp(X[r, c] - M) / …
    after:   def Y[r, c] = let X_r[r0 < C] @register = X[r, r0]
                           in let M @register = max(k < C: X_r[k]) in exp(X_r[c] - M) / …

`cache` stages a tile read with one pattern of tile indices; a row kernel reads the same row
through different indices (the column loop, the bound index of each row reduction), so the tile
here is the whole last dimension, read at any in-range position.  Every read of the tensor in the
definition must have the same leading indices (all but the last), made of the definition's loop
indices only (the buffer is one row per point of those loops); the last dimension has a fixed
extent D (the buffer's size) and every read's last index is provably in [0, D) from the extents
of the indices it uses (no zero fill is needed).  The row must be reused: read at two places at
least.  At the register level the row stays in the registers of the threads that own it.
Theorem: cache_read / cache_read2 (lean/Derivc/Rules/Cache.lean, proofs_ci/coq): a read through
the staged copy at an in-range offset is the read of the source.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import Field

from ..errors import did_you_mean
from ..ir import (
    Aff, Binding, Expr, Ext, Fold, Let, Program, Read, Reduce, Softmax, all_binders, fresh, names_in_program,
    replace_reads, walk,
)
from . import register
from .base import Facts, Rule, StepParams, const_aff, const_extent


class CacheRowParams(StepParams):
    def_: str = Field(alias="def")
    """the definition that reads the row"""
    tensor: str
    """the input whose row (last dimension) is staged once and read there"""
    level: Literal["register", "shared"] = "register"
    """where the row lives: registers or shared memory"""
    name: str | None = None
    """the staged row's name (default: <tensor>_row)"""
    accumulator: None = None
    """never given: a row is tile staging, not an accumulator"""
    new_names = ("name",)


def index_extents(prog: Program, body: Expr, loops: dict[str, Ext]) -> dict[str, int | None]:
    """The fixed extent of every loop and bound index (None: dynamic)."""
    out = {v: const_extent(prog, x) for v, x in loops.items()}
    for e in walk(body):
        if isinstance(e, (Reduce, Fold, Softmax)):
            out[e.var] = const_extent(prog, e.ext) if len(e.ext.parts) == 1 else None
        binds = e.binds if isinstance(e, Fold) else ((e.bind,) if isinstance(e, Let) else ())
        for b in binds:
            for v, x in b.dims:
                out[v] = const_extent(prog, x)
    return out


def aff_range(a: Aff, extents: dict[str, int | None]) -> tuple[int, int] | None:
    """[lo, hi] of a over every index in [0, extent); None when an extent is unknown."""
    lo = hi = a.const
    for v, c in a.terms:
        n = extents.get(v)
        if n is None or n < 1:
            return None
        lo += min(0, c * (n - 1))
        hi += max(0, c * (n - 1))
    return lo, hi


class CacheRow(Rule):
    name = "cache_row"
    kind = "CACHE"
    theorem = "cache_read"
    also = ("cache_read2",)
    Params = CacheRowParams

    def check(self, prog: Program, p: CacheRowParams) -> Facts:
        d = self.get_def(prog, p.def_)
        t = p.tensor
        # an input, or a tensor another build step writes (the forward's output in a backward)
        written_elsewhere = [x.name for x in prog.defs if x.computed_by]
        if t not in prog.input_map() and t not in written_elsewhere:
            known = [n for n, _ in prog.inputs] + written_elsewhere
            raise self.unknown(f"parameter tensor: {t!r} is not an input{did_you_mean(t, known)} (inputs: {', '.join(known)})")
        reads = [x for x in walk(d.body) if isinstance(x, Read) and x.tensor == t]
        if len(reads) < 2:
            raise self.fail(f"{t} is read {len(reads)} time(s) in {p.def_}; caching its row gains nothing")
        lead = reads[0].idx[:-1]
        if any(r.idx[:-1] != lead for r in reads):
            shown = sorted({f"{t}[{', '.join(map(str, r.idx))}]" for r in reads})
            raise self.fail(f"reads of {t} are not one row: the leading indices differ ({', '.join(shown)})")
        loops = {lp.var for lp in d.loops}
        inner = all_binders(d.body)
        for a in lead:
            stray = a.names() - loops - {n for n, _ in prog.sizes}
            if stray or a.names() & inner:
                raise self.fail(f"the row index {a} of {t} uses {sorted(stray or a.names() & inner)}, not loops of {p.def_}")
        dim = prog.tensor_type(t).dims[-1]
        n = const_aff(prog, dim)
        if n is None:
            raise self.fail(f"the last dimension {dim} of {t} is dynamic; a cached row needs a fixed size")
        extents = index_extents(prog, d.body, {lp.var: lp.ext for lp in d.loops})
        for r in reads:
            rng = aff_range(r.idx[-1], extents)
            if rng is None or rng[0] < 0 or rng[1] >= n:
                raise self.fail(f"{t}[{', '.join(map(str, r.idx))}]: the column {r.idx[-1]} is not provably in "
                                f"[0, {dim}) ({'unknown extent' if rng is None else f'range {rng[0]}..{rng[1]}'})")
        taken = names_in_program(prog)
        if p.name is not None:
            self.require_new_name(prog, p.name, "name")
        name = p.name or fresh(f"{t}_row", taken)
        r0 = fresh("r0", taken | {name})
        return {"tensor": t, "buffer": name, "level": p.level, "row": [str(a) for a in lead], "size": n,
                "theorem": "cache_read2",
                "reads": len(reads), "index": r0, "site": d.body}

    def rewrite(self, prog: Program, p: CacheRowParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        t, name, r0 = facts["tensor"], facts["buffer"], facts["index"]
        lead = next(x.idx[:-1] for x in walk(d.body) if isinstance(x, Read) and x.tensor == t)
        bind = Binding(name, ((r0, Ext.of(facts["size"])),), Read(t, lead + (Aff.of(r0),)), p.level, 1, source=t)
        body = replace_reads(d.body, t, lambda r: Read(name, (r.idx[-1],)))
        return prog.with_def(replace(d, body=Let(bind, body)))


register(CacheRow())
