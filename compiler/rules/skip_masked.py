"""MASK (skip masked tiles): shrink a tiled loop to the tiles a guard can reach.

For a causal mask j ≤ i with j = 64·jo + c and i = 128·io + ii (c < 64, ii < 128), every
position of a key tile jo > (128·io + 127) / 64 is masked:

    before:  fold(jo < ceil(N/64)) …  [64*jo + c <= 128*io + ii && …] ? … : neutral
    after:   fold(jo < min(ceil(N/64), ceil((128*io + 128)/64))) …

Preconditions: the guard conjunct bounds the tile index from above (positive coefficient of
jo); every contribution of an iteration sits under a guard that contains that conjunct (for a
sum/max: its body; for a tiled sum sum(jo: sum(ji < T: t)): every term t, through its zero
guards — the conditions of t's zero-guarded value or of a zero-guarded factor of a product, as
the attention backward's P = [mask] ? exp(..) : 0 multiplies dP - Dsum; for a fold: the online-aggregation step, whose masked iterations leave
(m, l, acc) unchanged since rescale(m, max(m, −∞)) = 1).  The bound minimises the conjunct over
the indices bound inside the iteration and the fixed-extent loops of the definition, so it is
the same for every row of a tile (what a block-uniform loop needs).
Theorem: sumTo_guard_trunc (lean/Derivc/Rules/Mask.lean, proofs_ci/coq).

Lower ends are not rewritten here: a conjunct with a negative coefficient of jo (a sliding
window's i - j < W) bounds the tile index from below, and the IR's Fold has no start.  The wgmma
fold printer starts its key-tile loop at the first tile the kernel IR's mask reaches for the block
(codegen.mappings.cexpr.first_tile_c): the fold steps below it are fully masked and leave (m, l, acc)
unchanged; the sum form of that skip is sumTo_guard_skip_low (checked by coqc, no per-step
obligation yet).
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import Aff, Bin, Cond, Const, DataCond, Expr, Ext, Fold, Or, Program, Reduce, Select, walk
from . import register
from .base import Facts, Rule, StepParams, const_extent, find_binder, replace_node


class SkipMaskedParams(StepParams):
    def_: str = Field(alias="def")
    """the definition whose guarded tile loop is shortened"""
    index: str
    """the tile index (e.g. jo) whose range the guard bounds from above"""


TILE_VAR = "_tile_offset"


def _zero_guards(e: Expr) -> tuple[Cond, ...]:
    """Conditions each of which, false, makes e exactly 0: a zero-guarded value's conditions and
    those of any zero-guarded factor of a product."""
    if isinstance(e, Select) and e.other == Const(0.0):
        return e.conds + _zero_guards(e.then)
    if isinstance(e, Bin) and e.op == "*":
        return _zero_guards(e.a) + _zero_guards(e.b)
    return ()


def _guards(exprs: list[Expr]) -> list[tuple[Cond, ...]]:
    return [x.conds for e in exprs for x in walk(e) if isinstance(x, Select)]


class SkipMasked(Rule):
    name = "skip_masked"
    kind = "MASK"
    theorem = "sumTo_guard_trunc"
    Params = SkipMaskedParams

    def check(self, prog: Program, p: SkipMaskedParams) -> Facts:
        d = self.get_def(prog, p.def_)
        self.require_index(d, p.index, "index")
        node = find_binder(d, p.index)
        tile_sum = isinstance(node, Reduce) and node.op == "sum" and isinstance(node.body, Reduce) \
            and node.body.op == "sum"
        if tile_sum:
            # a tiled sum: every term of the inner tile sum vanishes where a conjunct fails
            inner = node.body
            guard_sets = [tuple(c.subst(inner.var, Aff.of(TILE_VAR)) for c in _zero_guards(inner.body))]
            if not guard_sets[0]:
                raise self.fail(f"no term of the tile sum over {inner.var} is guarded")
            inside = {TILE_VAR} | {x.var for x in walk(inner.body) if isinstance(x, Reduce)}
        elif isinstance(node, Reduce):
            neutral = Const(0.0) if node.op == "sum" else Const(float("-inf"))
            if not isinstance(node.body, Select) or node.body.other != neutral:
                raise self.fail(
                    f"the body of the {node.op} over {p.index} is not guarded with the neutral "
                    f"{'0' if node.op == 'sum' else '-inf'} as the masked value"
                )
            guard_sets = [node.body.conds]
            inside = {x.var for x in walk(node.body) if hasattr(x, "var") and isinstance(x, Reduce)}
        elif isinstance(node, Fold):
            guard_sets = self._fold_guards(node)
            inside = {TILE_VAR}
        else:
            raise self.fail(f"index {p.index} of {p.def_} is not a reduction or fold index")
        extents = {lp.var: const_extent(prog, lp.ext) for lp in d.loops}
        for e in walk(d.body):
            if isinstance(e, Reduce):
                extents[e.var] = const_extent(prog, e.ext)
        for b in (node.binds if isinstance(node, Fold) else ()):
            for v, x in b.dims:
                extents[v] = const_extent(prog, x)
        if isinstance(node, Fold):
            tile = next(b for b in node.binds if b.dims and b.source == "")
            extents[TILE_VAR] = const_extent(prog, tile.dims[0][1])
        if tile_sum:
            extents[TILE_VAR] = const_extent(prog, node.body.ext)
        common = set(map(str, guard_sets[0]))
        for g in guard_sets[1:]:
            common &= set(map(str, g))
        bounds = []
        disjunctions = []
        for c in guard_sets[0]:
            if str(c) not in common:
                continue
            if isinstance(c, DataCond):  # a comparison of data bounds no tile (the mask stays per element)
                continue
            if isinstance(c, Or):  # its tiles are the union of its parts': a max, which no extent is
                if all((p_.lhs - p_.rhs).coef(p.index) > 0 for p_ in c.parts):
                    disjunctions.append(str(c))
                continue
            diff = c.lhs - c.rhs
            t = diff.coef(p.index)
            if t <= 0:
                continue
            k = Aff.build({v: a for v, a in diff.terms if v != p.index}, diff.const)
            low = Aff.build({}, k.const)
            sym: dict[str, int] = {}
            ok = True
            for v, a in k.terms:
                n = extents.get(v)
                minimise = v in inside or (v in extents and n is not None and v in {lp.var for lp in d.loops})
                if minimise and n is not None:
                    low = low + (a * (n - 1) if a < 0 else 0)
                elif v in inside:
                    ok = False
                else:
                    sym[v] = a
            if not ok:
                continue
            kmin = low + Aff.build(sym)
            num = kmin.scale(-1) + (1 if c.op == "<=" else 0)
            if (num, t) not in node.ext.parts and (num, t) not in [(n, k) for _, n, k in bounds]:
                bounds.append((c, num, t))
        if not bounds and disjunctions:
            raise self.fail(
                f"the guard {disjunctions[0]} bounds {p.index} only through a disjunction: the tiles it reaches "
                "are the union of its parts' ranges (a max of bounds), which MASK does not express (not implemented)"
            )
        if not bounds:
            raise self.fail(
                f"no guard of every contribution bounds {p.index} below its extent {node.ext}; nothing can be skipped"
            )
        return {"guards": [str(c) for c, _, _ in bounds],
                "live_tiles": [f"ceil(({n})/{t})" for _, n, t in bounds],
                "bounds": [(n, t) for _, n, t in bounds], "site": node}

    def _fold_guards(self, f: Fold) -> list[tuple[Cond, ...]]:
        """Guards of every contribution of an online-aggregation step (else refuse)."""
        if len(f.state) != 3 or len(f.binds) < 3:
            raise self.fail("only an online-aggregation fold (state m, l, acc) can skip masked iterations")
        tiles = [b for b in f.binds if b.dims and b.source == ""]
        sets = []
        for b in tiles:
            if not isinstance(b.value, Select):
                raise self.fail(f"register tile {b.name} of the fold is not guarded")
            v = b.dims[0][0]
            sets.append(tuple(c.subst(v, Aff.of(TILE_VAR)) for c in b.value.conds))
        acc_sums = [x for x in walk(f.update[2]) if isinstance(x, Reduce)]
        if len(acc_sums) != 1 or not isinstance(acc_sums[0].body, Select):
            raise self.fail("the accumulator update of the fold is not one guarded sum")
        r = acc_sums[0]
        sets.append(tuple(c.subst(r.var, Aff.of(TILE_VAR)) for c in r.body.conds))
        return sets

    def rewrite(self, prog: Program, p: SkipMaskedParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        node = facts["site"]
        new = replace(node, ext=Ext(node.ext.parts + tuple(facts["bounds"])))
        return prog.with_def(replace(d, body=replace_node(d.body, node, new)))


register(SkipMasked())
