"""PARALLEL: run a loop of a definition in parallel — over the grid, warps or threads.

    before:  for io < ceil(N/128), ii < 128: O[128*io + ii, …] = e
    after:   for io < ceil(N/128) @grid.x, ii < 128 @warp: O[128*io + ii, …] = e

Sound because a definition's loop is a Gen: iterations only read inputs and write their own
element.  The precondition is that the writes really are disjoint — the store index is
injective on the loop nest (checked as a mixed-radix layout: in each store position the loop
indices' strides cover the inner extents) — and that reductions and folds are never mapped
(they carry a dependence between iterations).  Grid loops come before warp/thread loops.

A grid axis may carry several loops (CUDA has three axes; attention over batch, KV heads, query
heads of a group and query tiles has four grid loops):

    before:  for hk < HK @grid.y, g < G, …
    after:   for hk < HK @grid.y, g < G @grid.y, …     blockIdx.y = hk * G + g

The axis then enumerates the product of its loops' extents, row-major in loop-nest order.  Grid
loops are mapped outside-in (a grid loop may not sit inside an unmapped loop), so a loop joining
an axis is nested inside every loop already on it: it becomes the axis's fastest-varying part,
and the order the steps were written in is the order the kernel IR records.  Each such step is the bijection
(x, i) <-> x * E + i between [0, X) x [0, E) and [0, X * E): the printers recover i as
blockIdx mod E and x as blockIdx / E.
Theorems: parallel_writes; grid_axis_product for a shared axis (lean/Derivc/Rules/Parallel.lean,
proofs_ci/coq/Rules/Parallel.v).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import Field

from ..ir import Def, Mapping, Program
from . import register
from .base import Facts, Rule, StepParams, const_extent, find_binder

ORDER = {"grid": 0, "warp": 1, "thread": 2}


class ParallelParams(StepParams):
    def_: str = Field(alias="def")
    """the definition whose loop runs in parallel"""
    index: str
    """the loop to map (a loop of the definition, not a reduction)"""
    to: Literal["grid.x", "grid.y", "grid.z", "warp", "thread"]
    """the grid axis (one block per iteration) or warps / threads of a block"""
    count: int = Field(default=0, ge=0, le=1024)
    """warps or threads along this loop (0: one per iteration); warps must divide a fixed extent"""


def injective_store(prog: Program, d: Def) -> str:
    """Why d's store index is injective on its loop nest; raises ValueError if it is not shown."""
    loops = {lp.var: lp for lp in d.loops}
    seen: dict[str, int] = {}
    for k, a in enumerate(d.store):
        for v, _ in a.terms:
            if v in loops:
                if v in seen:
                    raise ValueError(f"loop {v} appears in store positions {seen[v]} and {k}")
                seen[v] = k
    unused = [v for v in loops if v not in seen]
    if unused:
        raise ValueError(f"loop {unused[0]} does not appear in the store index, so iterations overwrite each other")
    notes = []
    for k, a in enumerate(d.store):
        terms = sorted(((c, v) for v, c in a.terms if v in loops), key=lambda x: x[0])
        covered = 1
        for c, v in terms:
            if c <= 0:
                raise ValueError(f"loop {v} has stride {c} in store position {k}")
            if c < covered:
                raise ValueError(f"store position {k}: stride {c} of {v} overlaps the inner loops' range {covered}")
            n = const_extent(prog, loops[v].ext)
            covered = c * n if n is not None else None
            if covered is None and (c, v) != terms[-1]:
                raise ValueError(f"store position {k}: inner loop {v} has a dynamic extent")
        notes.append(" + ".join(f"{c}*{v}" for c, v in terms) or "const")
    return "mixed radix: " + "; ".join(notes)


class Parallel(Rule):
    name = "parallel"
    kind = "PARALLEL"
    theorem = "parallel_writes"
    Params = ParallelParams

    def check(self, prog: Program, p: ParallelParams) -> Facts:
        d = self.get_def(prog, p.def_)
        self.require_index(d, p.index, "index")
        pos = next((k for k, lp in enumerate(d.loops) if lp.var == p.index), None)
        if pos is None:
            node = find_binder(d, p.index)
            if node is not None:
                raise self.fail(
                    f"{p.index} is a {type(node).__name__.lower()} index: it carries a dependence between "
                    "iterations, only a loop of the definition can run in parallel"
                )
            raise self.fail(f"index {p.index} is not a loop of {p.def_}")
        if d.loops[pos].mapping is not None:
            raise self.fail(f"loop {p.index} is already mapped to {d.loops[pos].mapping}")
        try:
            why = injective_store(prog, d)
        except ValueError as exc:
            raise self.fail(f"writes of {p.def_} are not provably disjoint: {exc}") from None
        level, _, axis = p.to.partition(".")
        shared: list[str] = []
        for k, lp in enumerate(d.loops):
            if lp.mapping is None:
                continue
            if lp.mapping.level == "grid" and level == "grid" and lp.mapping.axis == axis:
                # grid loops are mapped outside-in (below), so lp encloses p.index: the joining loop
                # becomes the axis's fastest part and the kernel IR's loop order is the axis order
                assert k < pos, "a grid loop nested inside an unmapped loop"
                shared.append(lp.var)
            if k < pos and ORDER[lp.mapping.level] > ORDER[level]:
                raise self.fail(f"{p.index} ({p.to}) is inside loop {lp.var} mapped to {lp.mapping}; reorder first")
            if k > pos and ORDER[lp.mapping.level] < ORDER[level]:
                raise self.fail(f"{p.index} ({p.to}) encloses loop {lp.var} mapped to {lp.mapping}; reorder first")
        if level == "grid":
            for lp in d.loops[:pos]:
                if lp.mapping is None:
                    raise self.fail(f"grid loop {p.index} is inside the sequential loop {lp.var}; reorder or map it first")
        if p.count:
            if level == "grid":
                raise self.fail("count applies to warp or thread mappings; a grid loop gets one block per iteration")
            n = const_extent(prog, d.loops[pos].ext)
            # threads stride over the loop (thread t runs t, t + count, …, the last stretch guarded);
            # warps own equal parts of a tile, so their count must divide a fixed extent
            if level != "thread" and (n is None or n % p.count):
                raise self.fail(f"{p.count} {level}s do not split the extent {d.loops[pos].ext} of {p.index} evenly")
        facts = {"loop": p.index, "to": p.to, "count": p.count, "disjoint_writes": why, "extent": str(d.loops[pos].ext)}
        if shared:
            facts["shares_axis_with"] = shared
            facts["block_index"] = f"blockIdx.{axis} = ({' * '.join(shared)} flattened) * {d.loops[pos].ext} + {p.index}"
        return facts

    def rewrite(self, prog: Program, p: ParallelParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        level, _, axis = p.to.partition(".")
        loops = tuple(replace(lp, mapping=Mapping(level, axis, p.count)) if lp.var == p.index else lp for lp in d.loops)
        return prog.with_def(replace(d, loops=loops))


register(Parallel())
