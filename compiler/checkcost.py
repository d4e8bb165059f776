"""What a numeric check costs: the points the float64 reference interpreter evaluates.

The interpreter (compiler/interp.py) evaluates every expression over the indices it depends on,
not over the whole loop nest: an array has size 1 along every index its expression does not use,
so a row reduction inside Y[r, c] whose body does not read c is evaluated once per row (R × C
points, the reduction hoisted out of the column loop), never once per element (R × C × C).
The same holds for a local buffer (`let`): its value is computed once per point of the indices
it uses and read there.  This module counts the same way, so that the limit on a check's work
(MAX_CHECK_POINTS) refuses only what would really be slow: the cost of a definition is the
largest array any node of it materialises, the product of the extents of the indices that node
depends on (its free indices, the index it binds, and for a read of a local buffer or a fold
state the indices that value depends on), and at least the definition's loop nest (its store).
"""
from __future__ import annotations

import math
from typing import Mapping

from .ir import (
    Aff, Bin, Const, Def, Expr, Ext, Fold, IndexValue, Let, Program, Read, Reduce, Select, Softmax, Un,
)


def _upper_aff(a: Aff, sizes: Mapping[str, int], bounds: Mapping[str, int]) -> int:
    """The largest value of a with every index in [0, its extent) and sizes at their values."""
    out = a.const
    for name, c in a.terms:
        if name in bounds:
            out += c * (bounds[name] - 1) if c > 0 else 0
        else:
            out += c * sizes[name]
    return out


def upper_extent(x: Ext, sizes: Mapping[str, int], bounds: Mapping[str, int]) -> int:
    """An upper bound of the extent over the enclosing indices' ranges (a causal j < i + 1 → N)."""
    return max(0, min(-(-_upper_aff(a, sizes, bounds) // d) for a, d in x.parts))


class _Counter:
    def __init__(self, sizes: Mapping[str, int]):
        self.sizes = sizes
        self.largest = 1

    def record(self, deps: frozenset[str], bounds: Mapping[str, int]) -> None:
        self.largest = max(self.largest, math.prod(max(1, bounds[v]) for v in deps if v in bounds))

    def visit(self, e: Expr, bounds: dict[str, int], bufs: dict[str, frozenset[str]]) -> frozenset[str]:
        """The indices e's array depends on (recording the arrays built on the way)."""
        local = frozenset(bounds)
        if isinstance(e, Const):
            return frozenset()
        if isinstance(e, IndexValue):
            return e.aff.names() & local
        if isinstance(e, Read):
            out = bufs.get(e.tensor, frozenset())
            for a in e.idx:
                out |= a.names() & local
            self.record(out, bounds)
            return out
        if isinstance(e, (Bin, Un, Select)):
            kids = (e.a, e.b) if isinstance(e, Bin) else (e.a,) if isinstance(e, Un) else (e.then, e.other)
            out = frozenset().union(*(self.visit(k, bounds, bufs) for k in kids))
            if isinstance(e, Select):
                for c in e.conds:
                    out |= c.names() & local
            self.record(out, bounds)
            return out
        if isinstance(e, (Reduce, Softmax)):
            inner = {**bounds, e.var: upper_extent(e.ext, self.sizes, bounds)}
            body = self.visit(e.body if isinstance(e, Reduce) else e.score, inner, bufs)
            if isinstance(e, Softmax):
                for c in e.mask:
                    body |= c.names() & frozenset(inner)
            self.record(body | {e.var}, inner)
            out = (body - {e.var}) | (e.ext.names() & local)
            if isinstance(e, Softmax):
                out |= e.at.names() & local
            self.record(out, bounds)
            return out
        if isinstance(e, Let):
            dims = {v: upper_extent(x, self.sizes, bounds) for v, x in e.bind.dims}
            value = self.visit(e.bind.value, {**bounds, **dims}, bufs)
            self.record(value | frozenset(dims), {**bounds, **dims})
            return self.visit(e.body, bounds, {**bufs, e.bind.name: value - frozenset(dims)})
        if isinstance(e, Fold):
            return self.fold(e, bounds, bufs)
        raise TypeError(f"not an expression: {e!r}")

    def fold(self, e: Fold, bounds: dict[str, int], bufs: dict[str, frozenset[str]]) -> frozenset[str]:
        state = frozenset().union(*(self.visit(x, bounds, bufs) for x in e.init))
        inner = {**bounds, e.var: upper_extent(e.ext, self.sizes, bounds)}
        for _ in range(2):  # the state's dependence grows at most once: through the updates
            scope = {**bufs, **{s: state for s in e.state}}
            for b in e.binds:
                dims = {v: upper_extent(x, self.sizes, inner) for v, x in b.dims}
                value = self.visit(b.value, {**inner, **dims}, scope)
                self.record(value | frozenset(dims) | {e.var}, {**inner, **dims})  # one step, ext steps
                scope[b.name] = value - frozenset(dims)
            upd = frozenset().union(*(self.visit(u, inner, scope) for u in e.update))
            self.record(upd | {e.var}, inner)
            state |= upd - {e.var}
        scope = {**bufs, **{s: state for s in e.state}}
        return frozenset().union(*(self.visit(x, bounds, scope) for x in (e.result, *e.also)))


def def_points(d: Def, sizes: Mapping[str, int]) -> int:
    """Points of the largest array the interpreter builds for d at these sizes."""
    counter = _Counter(sizes)
    bounds: dict[str, int] = {}
    for lp in d.loops:
        bounds[lp.var] = upper_extent(lp.ext, sizes, bounds)
    counter.visit(d.body, bounds, {})
    counter.record(frozenset(bounds), bounds)  # the store: one value per point of the loop nest
    return counter.largest


def program_points(p: Program, sizes: Mapping[str, int]) -> int:
    return max((def_points(d, sizes) for d in p.defs), default=1)
