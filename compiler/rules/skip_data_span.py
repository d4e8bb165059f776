"""MASK-DATA (skip the key tiles a data mask cannot reach): bound an online-aggregation fold's
key tiles by a span derived from the mask's own integer data.

For document masking `Doc[b, i] == Doc[b, j]` with i = 128·io + ii, j = 128·jo + c, every
contribution of the fold over jo carries the comparison in its guard.  The rule adds beside it the
conjunct `jo in span(..)` (compiler.ir_index.DataSpan): with V the document ids of the query tile
(Doc[b, 128·io + r], r < 128) and H the key positions p whose id lies in [min V, max V], the span is
[min H // 128, max H // 128 + 1).  Wherever Doc[b, i] == Doc[b, j] holds, j's id is some row's id,
so j ∈ H and jo = j // 128 lies in the span: the conjunct is implied, every value is unchanged.

    before:  fold(jo < E) … [j <= i && Doc[b, 128*io + ii] == Doc[b, 128*jo + c]] ? s : -inf …
    after:   fold(jo < E) … [j <= i && Doc[b, 128*io + ii] == Doc[b, 128*jo + c]
                             && jo in span(Doc[b, 128*io + _span_r0] for _span_r0 < 128;
                                           Doc[b, _span_k] for _span_k < N; /128)] ? s : -inf …

The conjunct is the same for every element of a key tile, so a tile outside the span is fully
masked: its ONLINE-AGG step leaves (m, l, acc) unchanged (rescale(m, max(m, -inf)) = 1), and the
fold printers visit only the span's tiles (the span computed once per block, in its prologue, from
the data: codegen.mappings.online_fold.span_prologue).  The span is a hull: tiles inside it with no
matching key (documents interleaved) are still visited and masked per element.  Any data is
covered (ids need not be sorted); sorted ids (packed sequences) make the span exact.

Preconditions: the definition's binder `index` is an online-aggregation fold (state m, l, acc);
every contribution (each guarded register tile of the step, the accumulator's guarded sum) is
guarded by the same data comparison A[..] == B[..] (after naming each tile's column alike), one
read (the query side) not reading the fold's index or the tile's column, the other (the key side)
reading the key position `size*index + column` at exactly one position, `size` the tile's fixed
extent, its other indices free of both; no DataSpan is there yet.
Theorems: span_cover (a matching key's tile lies in the span) and foldN_skip_span (a fold whose
steps outside [lo, hi) leave the state unchanged equals the fold over [lo, hi)), in
proofs_ci/coq/Rules/MaskData.v and lean/Derivc/Rules/MaskData.lean.
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import SPAN_KEY, SPAN_ROW, Aff, DataCond, DataRead, DataSpan, Expr, Fold, Program, Reduce, Select, walk
from . import register
from .base import Facts, Rule, StepParams, const_extent, find_binder, replace_node

COLUMN = "_tile_column"  # each contribution's tile column, named alike to compare the guards


class SkipDataSpanParams(StepParams):
    def_: str = Field(alias="def")
    """the definition whose online-aggregation fold is bounded"""
    index: str
    """the fold's key-tile index (e.g. jo)"""


def _contributions(f: Fold) -> list[tuple[Select, str, int | None]]:
    """Each guarded contribution of the fold's step: (its guarded value, its tile column, the
    column's extent or None): the register tiles and the accumulator's sum."""
    out = []
    for b in f.binds:
        if b.dims and b.source == "" and isinstance(b.value, Select):
            v, ext = b.dims[0]
            out.append((b.value, v, ext.const_value()))
    sums = [x for x in walk(f.update[2]) if isinstance(x, Reduce)] if len(f.update) == 3 else []
    if len(sums) == 1 and isinstance(sums[0].body, Select):
        out.append((sums[0].body, sums[0].var, sums[0].ext.const_value()))
    return out


class SkipDataSpan(Rule):
    name = "skip_data_span"
    kind = "MASK-DATA"
    theorem = "span_cover"
    Params = SkipDataSpanParams

    def check(self, prog: Program, p: SkipDataSpanParams) -> Facts:
        d = self.get_def(prog, p.def_)
        self.require_index(d, p.index, "index")
        fold = find_binder(d, p.index)
        if not isinstance(fold, Fold) or len(fold.state) != 3:
            raise self.fail(f"index {p.index} of {p.def_} is not an online-aggregation fold (state m, l, acc)")
        contribs = _contributions(fold)
        tiles = [b for b in fold.binds if b.dims and b.source == ""]
        if len(contribs) != len(tiles) + 1:
            raise self.fail(f"not every contribution of the fold over {p.index} (its register tiles and the "
                            "accumulator's sum) is guarded")
        if any(isinstance(c, DataSpan) for sel, _, _ in contribs for c in sel.conds):
            raise self.fail(f"the fold over {p.index} is already bounded by a data span")
        named = [{str(c.subst(col, Aff.of(COLUMN))): c.subst(col, Aff.of(COLUMN)) for c in sel.conds
                  if isinstance(c, DataCond)} for sel, col, _ in contribs]
        common = [k for k in named[0] if all(k in n for n in named[1:])]
        sizes = {n for _, _, n in contribs}
        if len(sizes) != 1 or None in sizes:
            raise self.fail(f"the tiles of the fold over {p.index} have no one fixed size ({sorted(map(str, sizes))})")
        size = sizes.pop()
        reasons = []
        for k in common:
            found = self._span(prog, d, named[0][k], p.index, size, reasons)
            if found is not None:
                span, row = found
                return {"span": span, "comparison": k, "cond": named[0][k], "row": row, "site": fold}
        if not common:
            raise self.fail(f"no data comparison guards every contribution of the fold over {p.index}")
        raise self.fail(reasons[0])

    def _span(self, prog: Program, d, c: DataCond, index: str, size: int,
              reasons: list[str]) -> tuple[DataSpan, str] | None:
        """The span of the comparison c and its first row variable (else None, a reason appended)."""
        if c.op != "==" or not (isinstance(c.lhs, DataRead) and isinstance(c.rhs, DataRead)):
            reasons.append(f"the data comparison {c} is not an equality of two reads (A[..] == B[..])")
            return None
        keyish = {index, COLUMN}
        sides = [s for s in (c.lhs, c.rhs) if not (s.names() & keyish)]
        keys = [s for s in (c.lhs, c.rhs) if s.names() & keyish]
        if len(sides) != 1 or len(keys) != 1:
            reasons.append(f"in {c} one read must index the query rows only and the other the key position")
            return None
        query, key = sides[0], keys[0]
        at = [n for n, a in enumerate(key.idx) if a.names() & keyish]
        want = Aff.build({index: size, COLUMN: 1})
        if len(at) != 1 or key.idx[at[0]] != want:
            reasons.append(f"the key read {key} is not at the key position {size}*{index} + column at one index")
            return None
        # the query rows: the definition's loops of fixed extent the query read uses (the tile rows)
        fixed = {lp.var: const_extent(prog, lp.ext) for lp in d.loops}
        rows = [(v, fixed[v]) for v in sorted(query.names()) if fixed.get(v) is not None]
        if not rows:
            reasons.append(f"the query read {query} uses no fixed-extent row loop of {d.name}: the span would be a "
                           "single row's (not implemented)")
            return None
        q = query
        private = []
        for n, (v, ext) in enumerate(rows):
            q = q.subst(v, Aff.of(f"{SPAN_ROW}{n}"))
            private.append((f"{SPAN_ROW}{n}", ext))
        k = DataRead(key.tensor, tuple(Aff.of(SPAN_KEY) if n == at[0] else a for n, a in enumerate(key.idx)), key.dims)
        return DataSpan(q, tuple(private), k, key.dims[at[0]], Aff.of(index), size), rows[0][0]

    def rewrite(self, prog: Program, p: SkipDataSpanParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        fold: Fold = facts["site"]
        span: DataSpan = facts["span"]

        def bound(sel: Select) -> Select:
            return replace(sel, conds=sel.conds + (span,))

        binds = tuple(replace(b, value=bound(b.value)) if b.dims and b.source == "" and isinstance(b.value, Select)
                      else b for b in fold.binds)
        acc = [x for x in walk(fold.update[2]) if isinstance(x, Reduce)][0]
        update = fold.update[:2] + (replace_node(fold.update[2], acc, replace(acc, body=bound(acc.body))),)
        new: Expr = replace(fold, binds=binds, update=update)
        return prog.with_def(replace(d, body=replace_node(d.body, fold, new)))


register(SkipDataSpan())
