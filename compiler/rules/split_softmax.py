"""SPLIT-SOFTMAX (F1): softmax into max, subtract, exp, sum, divide.

    before:  def P[i, j] = softmax(j_ < N | mask: s[i, j_])@[j]
    after:   def M[i] = max(j_ < N: [mask] ? s[i, j_] : -inf)
             def L[i] = sum(j_ < N: [mask] ? exp(s[i, j_] - M[i]) : 0)
             def P[i, j] = [mask at j] ? exp(s[i, j] - M[i]) / L[i] : 0

Exact for any M (the max only keeps exp from overflowing); a fully masked row gives 0 (L = 0 and
x / 0 = 0 in the semantics, the field convention inv 0 = 0).  The softmax may use only
untiled loop indices of its definition.
Theorem: softmax_split (lean/Derivc/Rules/SplitSoftmax.lean, proofs_ci/coq).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from pydantic import Field

from ..ir import (
    Aff, Bin, Const, Def, Expr, Program, Read, Reduce, Softmax, TensorType, Un, free_indices, fresh,
    names_in_program, subst_index, walk,
)
from . import register
from .base import Facts, Rule, StepParams, enclosing_binders, guarded, replace_node


class SplitSoftmaxParams(StepParams):
    def_: str = Field(alias="def")
    """the definition holding the softmax"""
    max_name: str | None = None
    """the row max definition's name (default: M)"""
    sum_name: str | None = None
    """the row sum definition's name (default: L)"""
    new_names = ("max_name", "sum_name")


class SplitSoftmax(Rule):
    name = "split_softmax"
    kind = "SPLIT-SOFTMAX"
    theorem = "softmax_split"
    Params = SplitSoftmaxParams

    def check(self, prog: Program, p: SplitSoftmaxParams) -> Facts:
        d = self.get_def(prog, p.def_)
        nodes = [e for e in walk(d.body) if isinstance(e, Softmax)]
        if len(nodes) != 1:
            raise self.fail(f"{p.def_} has {len(nodes)} softmax expressions; expected exactly one")
        node = nodes[0]
        if enclosing_binders(d.body, node):
            raise self.fail("the softmax sits inside a reduction or fold; split it at the top level")
        sizes = {n for n, _ in prog.sizes}
        used = (free_indices(node.score) | frozenset().union(*(c.names() for c in node.mask))) - {node.var} - sizes
        loops = [lp for lp in d.loops if lp.var in used]
        plain = {str(a) for a in d.store}
        for lp in loops:
            if lp.var not in plain or lp.mapping is not None:
                raise self.fail(f"the softmax uses loop {lp.var}, which is tiled or mapped; split the softmax first")
        stray = used - {lp.var for lp in loops}
        if stray:
            raise self.fail(f"the softmax uses indices {sorted(stray)} that are not loops of {p.def_}")
        for field, given in (("max_name", p.max_name), ("sum_name", p.sum_name)):
            if given is not None and (prog.has_def(given) or given in {n for n, _ in prog.inputs}):
                raise self.unknown(f"parameter {field}: name {given} is already a tensor")
            if given is not None:
                self.require_new_name(prog, given, field)
        if p.max_name is not None and p.max_name == p.sum_name:
            raise self.unknown("parameters max_name and sum_name: the names must differ")
        taken = set(names_in_program(prog))
        m = p.max_name or fresh("M", taken)
        taken.add(m)
        l = p.sum_name or fresh("L", taken)
        for nm in (m, l):
            if prog.has_def(nm) or nm in {n for n, _ in prog.inputs}:
                raise self.fail(f"name {nm} is already a tensor")
        return {"over": node.var, "extent": str(node.ext), "masked": bool(node.mask),
                "row_loops": [lp.var for lp in loops], "max": m, "sum": l, "site": node}

    def rewrite(self, prog: Program, p: SplitSoftmaxParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        node: Softmax = facts["site"]
        loops = tuple(lp for lp in d.loops if lp.var in facts["row_loops"])
        row = tuple(Aff.of(lp.var) for lp in loops)
        shape = TensorType(tuple(lp.ext.single()[0] for lp in loops), prog.intermediate_dtype())
        m_read = Read(facts["max"], row)
        score = node.score
        zero, ninf = Const(0.0), Const(float("-inf"))
        mask = node.mask

        def masked(body, neutral):
            return guarded(mask, body, neutral) if mask else body

        m_def = Def(facts["max"], shape, loops, row, Reduce("max", node.var, node.ext, masked(score, ninf)))
        l_def = Def(
            facts["sum"], shape, loops, row,
            Reduce("sum", node.var, node.ext, masked(Un("exp", Bin("-", score, m_read)), zero)),
        )
        return softmax_replaced(prog, d, node, (m_def, l_def),
                                lambda s: Bin("/", Un("exp", Bin("-", s, m_read)), Read(facts["sum"], row)))


def softmax_replaced(prog: Program, d: Def, node: Softmax, stats: tuple[Def, ...],
                     prob: Callable[[Expr], Expr]) -> Program:
    """d with its softmax node replaced by [mask at the position] ? prob(score there) : 0, and
    the row statistics the probability reads defined just before d."""
    at_score = subst_index(node.score, node.var, node.at)
    at_mask = tuple(c.subst(node.var, node.at) for c in node.mask)
    value = guarded(at_mask, prob(at_score), Const(0.0)) if at_mask else prob(at_score)
    new_d = replace(d, body=replace_node(d.body, node, value))
    defs = []
    for x in prog.defs:
        defs += [*stats, new_d] if x.name == d.name else [x]
    return replace(prog, defs=tuple(defs))


register(SplitSoftmax())
