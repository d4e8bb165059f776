"""SPLIT: split a reduction's range in two (split-K), or join such a split back.

    before:  sum(k < K: e[k])                      (K fixed, 0 < at < K)
    after:   sum(k < at: e[k]) + sum(k2 < K - at: e[at + k2])

For max the two halves are joined with max(·, ·).  The extent must be a fixed size: a split
point of a dynamic extent could fall outside it.
Theorem: sumTo_split (lean/Derivc/Rules/Split.lean, proofs_ci/coq).
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import Aff, Bin, Ext, Program, Reduce, fresh, names_in_program, subst_index
from . import register
from .base import Facts, Rule, StepParams, const_extent, find_binder, freshen_binders, replace_node


class SplitParams(StepParams):
    def_: str = Field(alias="def")
    """the definition holding the reduction"""
    index: str
    """the reduced index whose range is split (a fixed extent)"""
    at: int = Field(ge=1)
    """the split point, strictly inside the extent"""
    second: str | None = None
    """the index name of the second part (default: <index>2)"""
    new_names = ("second",)


class Split(Rule):
    name = "split"
    kind = "SPLIT"
    theorem = "sumTo_split"
    Params = SplitParams

    def check(self, prog: Program, p: SplitParams) -> Facts:
        d = self.get_def(prog, p.def_)
        self.require_index(d, p.index, "index")
        node = find_binder(d, p.index)
        if not isinstance(node, Reduce):
            raise self.fail(f"index {p.index} of {p.def_} is not a sum/max reduction")
        n = const_extent(prog, node.ext)
        if n is None:
            raise self.fail(f"the extent {node.ext} of {p.index} is dynamic; SPLIT needs a fixed extent")
        if not 0 < p.at < n:
            raise self.fail(f"split point {p.at} must lie strictly inside 0..{n}")
        if node.mma:
            raise self.fail("a reduction mapped to tensor cores cannot be split; split before MAP-MMA")
        if p.second is not None:
            self.require_new_name(prog, p.second, "second")
        second = p.second or fresh(p.index + "2", names_in_program(prog))
        return {"extent": n, "first": p.at, "second_extent": n - p.at, "second": second, "site": node}

    def rewrite(self, prog: Program, p: SplitParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        node: Reduce = facts["site"]
        k2 = facts["second"]
        first = replace(node, ext=Ext.of(p.at))
        taken = set(names_in_program(prog)) | {k2}
        shifted = subst_index(freshen_binders(node.body, taken), p.index, Aff.build({k2: 1}, p.at))
        second = replace(node, var=k2, ext=Ext.of(facts["second_extent"]), body=shifted)
        joined = Bin("+" if node.op == "sum" else "max", first, second)
        return prog.with_def(replace(d, body=replace_node(d.body, node, joined)))


register(Split())
