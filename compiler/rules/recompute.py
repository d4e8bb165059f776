"""RECOMPUTE: a softmax as exp(score − LSE), with the row's log-sum-exp LSE a tensor of its own.

    before:  def P[i, j] = softmax(j_ < N | mask: s[i, j_])@[j]
    after:   def M[i]    = max(j_ < N: [mask] ? s[i, j_] : -inf)
             def LSE[i]  = M[i] + log(sum(j_ < N: [mask] ? exp(s[i, j_] - M[i]) : 0))
             def P[i, j] = [mask at j] ? exp(s[i, j] - LSE[i]) : 0

FlashAttention's backward keeps one number per row (LSE, O(N) memory) instead of the N×N
probabilities, and recomputes P tile by tile from the scores: exp(s − LSE) needs no division and
is at most 1 (LSE ≥ every live score), so large logits cannot overflow it.  Exact where the row
has a live element (exp(log L) = L for L > 0, and exp(s − M − log L) = exp(s − M) / L); a fully
masked row gives P = 0 at every position on both sides, whatever LSE is (−inf here).
Preconditions: those of SPLIT-SOFTMAX (one softmax at the top level of the definition, over
untiled, unmapped loops); `order`, when given, is an ordering of the row loops (M's and LSE's
dimensions in that order: the layout of a forward that writes LSE beside its output).
Theorem: softmax_recompute (lean/Derivc/Rules/Recompute.lean, proofs_ci/coq/Rules/Recompute.v).
"""
from __future__ import annotations

from pydantic import Field

from ..ir import Aff, Bin, Const, Def, Program, Read, Reduce, Softmax, TensorType, Un, fresh, names_in_program
from . import register
from .base import Facts, StepParams, guarded
from .split_softmax import SplitSoftmax, softmax_replaced


class RecomputeParams(StepParams):
    def_: str = Field(alias="def")
    """the definition holding the softmax"""
    max_name: str | None = None
    """the row max tensor's name (default: M)"""
    lse_name: str | None = None
    """the row log-sum-exp tensor's name (default: LSE)"""
    order: tuple[str, ...] | None = None
    """the row loops in the order M and LSE are laid out (default: the definition's)"""
    new_names = ("max_name", "lse_name")

    @property
    def sum_name(self) -> str | None:  # the statistic SPLIT-SOFTMAX's check names
        return self.lse_name


class Recompute(SplitSoftmax):
    name = "recompute"
    kind = "RECOMPUTE"
    theorem = "softmax_recompute"
    Params = RecomputeParams

    def check(self, prog: Program, p: RecomputeParams) -> Facts:  # type: ignore[override]
        facts = super().check(prog, p)
        if p.lse_name is None:
            taken = set(names_in_program(prog)) | {facts["max"]}
            facts["sum"] = fresh("LSE", taken)
        facts["lse"] = facts.pop("sum")
        if p.order is not None:
            if sorted(p.order) != sorted(facts["row_loops"]):
                raise self.unknown(f"parameter order: {list(p.order)} is not an ordering of the softmax's row loops "
                                   f"{facts['row_loops']}")
            facts["row_loops"] = list(p.order)
        return facts

    def rewrite(self, prog: Program, p: RecomputeParams, facts: Facts) -> Program:  # type: ignore[override]
        d = prog.def_named(p.def_)
        node: Softmax = facts["site"]
        order = facts["row_loops"]
        loops = tuple(sorted((lp for lp in d.loops if lp.var in order), key=lambda lp: order.index(lp.var)))
        idx = tuple(Aff.of(lp.var) for lp in loops)
        shape = TensorType(tuple(lp.ext.single()[0] for lp in loops), prog.intermediate_dtype())
        m_read, lse_read = Read(facts["max"], idx), Read(facts["lse"], idx)
        zero, ninf = Const(0.0), Const(float("-inf"))

        def masked(body, neutral):
            return guarded(node.mask, body, neutral) if node.mask else body

        m_def = Def(facts["max"], shape, loops, idx, Reduce("max", node.var, node.ext, masked(node.score, ninf)))
        total = Reduce("sum", node.var, node.ext, masked(Un("exp", Bin("-", node.score, m_read)), zero))
        lse_def = Def(facts["lse"], shape, loops, idx, Bin("+", m_read, Un("log", total)))
        return softmax_replaced(prog, d, node, (m_def, lse_def), lambda s: Un("exp", Bin("-", s, lse_read)))


register(Recompute())
