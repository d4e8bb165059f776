"""REORDER: exchange two adjacent loops of a definition, or two directly nested reductions.

Loops (Gens) always commute: every iteration writes its own element.

    before:  for i < M, j < N: C[i, j] = e
    after:   for j < N, i < M: C[i, j] = e

Reductions of the same operator commute when the inner extent does not depend on the
outer index (finite Fubini):

    before:  sum(a < A: sum(b < B: e))
    after:   sum(b < B: sum(a < A: e))

Refused: a reduction and a fold (the fold carries state in order), sum with max, a loop with a
reduction, non-adjacent loops, or a mapped loop moved inside an unmapped one.
Theorem: sumTo_swap (reductions; maxTo via the same proof), loops need none beyond the
definition of a Gen.
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import Fold, Program, Reduce, Softmax
from . import register
from .base import Facts, Rule, StepParams, find_binder, replace_node


class ReorderParams(StepParams):
    def_: str = Field(alias="def")
    """the definition whose loops or reductions are exchanged"""
    outer: str
    """the outer of the two adjacent loops (or directly nested reductions)"""
    inner: str
    """the inner one: it becomes the outer"""


class Reorder(Rule):
    name = "reorder"
    kind = "REORDER"
    theorem = "sumTo_swap"
    Params = ReorderParams

    def check(self, prog: Program, p: ReorderParams) -> Facts:
        d = self.get_def(prog, p.def_)
        self.require_index(d, p.outer, "outer")
        self.require_index(d, p.inner, "inner")
        loop_vars = [lp.var for lp in d.loops]
        if p.outer in loop_vars and p.inner in loop_vars:
            a, b = loop_vars.index(p.outer), loop_vars.index(p.inner)
            if b != a + 1:
                raise self.fail(f"loops {p.outer} and {p.inner} of {p.def_} are not adjacent (order: {', '.join(loop_vars)})")
            lo, li = d.loops[a], d.loops[b]
            if p.outer in li.ext.names():
                raise self.fail(f"the extent of {p.inner} ({li.ext}) depends on {p.outer}")
            if lo.mapping is not None and li.mapping is None:
                raise self.fail(f"{p.outer} is mapped to {lo.mapping}; it cannot move inside the unmapped loop {p.inner}")
            rank = {"grid": 0, "warp": 1, "thread": 2}
            if lo.mapping is not None and li.mapping is not None and rank[lo.mapping.level] < rank[li.mapping.level]:
                raise self.fail(f"{p.outer} ({lo.mapping}) would move inside {p.inner} ({li.mapping})")
            return {"target": "loops", "position": a}
        if (p.outer in loop_vars) != (p.inner in loop_vars):
            raise self.fail(f"{p.outer} and {p.inner}: a loop of {p.def_} cannot be exchanged with a reduction inside its body")
        outer = find_binder(d, p.outer)
        inner = find_binder(d, p.inner)
        for name, node in ((p.outer, outer), (p.inner, inner)):
            if node is None:
                raise self.fail(f"index {name} is not bound in {p.def_}")
            if isinstance(node, Fold):
                raise self.fail(
                    f"{name} is a fold carrying state ({', '.join(node.state)}) in order; "
                    "a loop cannot move across it"
                )
            if isinstance(node, Softmax):
                raise self.fail(f"{name} is a softmax; split it (split_softmax) before reordering")
        if outer.body is not inner:
            raise self.fail(f"reduction {p.inner} is not directly inside reduction {p.outer}")
        if outer.op != inner.op:
            raise self.fail(f"cannot exchange a {outer.op} over {p.outer} with a {inner.op} over {p.inner}")
        if p.outer in inner.ext.names():
            raise self.fail(f"the extent of {p.inner} ({inner.ext}) depends on {p.outer} (triangular nest)")
        if outer.mma or inner.mma:
            raise self.fail("a reduction mapped to tensor cores cannot be reordered")
        return {"target": f"{outer.op} reductions", "site": outer}

    def rewrite(self, prog: Program, p: ReorderParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        if facts["target"] == "loops":
            a = facts["position"]
            loops = list(d.loops)
            loops[a], loops[a + 1] = loops[a + 1], loops[a]
            return prog.with_def(replace(d, loops=tuple(loops)))
        outer: Reduce = facts["site"]
        inner: Reduce = outer.body
        swapped = replace(inner, body=replace(outer, body=inner.body))
        return prog.with_def(replace(d, body=replace_node(d.body, outer, swapped)))


register(Reorder())
