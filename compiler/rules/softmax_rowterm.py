"""SOFTMAX-ROWTERM: the softmax backward's row term from the output (FlashAttention-2's D).

    before:  def dP[i, j] = sum(d < D: G[i, d] * V[j, d])           def O[i, d] = sum(j < N: P[i, j] * V[j, d])
             def dS[i, j] = P[i, j] * (dP[i, j] - sum(j2 < N: P[i, j2] * dP[i, j2]))
    after:   def dS[i, j] = P[i, j] * (dP[i, j] - sum(d2 < D: G[i, d2] * O[i, d2]))

Σ_j P_ij · Σ_d G_id V_jd = Σ_d G_id · Σ_j P_ij V_jd = Σ_d G_id O_id: the two finite sums
exchange.  The row term then costs D multiply-adds per row instead of N, and reads the forward's
output (saved by the forward) instead of a row of dP.  The matched parts: a sum over j2 of
P[…] · dP[…] at the same index; dP's definition a sum over d of a product G[…] · V[…]; O's
definition a sum over j of P[…] · V[…] reading the same P and V at the indices that make the
exchange exact (found by unifying O's reads with the instantiated dP; O's extents must match).
Theorem: softmax_bwd_rowterm (lean/Derivc/Rules/SoftmaxBwd.lean, proofs_ci/coq/Rules/SoftmaxBwd.v).
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import (
    Aff, Bin, Def, Expr, Program, Read, Reduce, all_binders, fresh, names_in_program, subst_index, walk,
)
from . import register
from .base import Facts, Rule, StepParams, replace_node
from .fuse import value_at


class RowtermParams(StepParams):
    def_: str = Field(alias="def")
    """the definition of the row term Σ_j P·dP"""
    probs: str
    """the probabilities P"""
    output: str
    """the forward output O = Σ_j P·V"""


def _factors(e: Expr) -> tuple[Expr, Expr] | None:
    return (e.a, e.b) if isinstance(e, Bin) and e.op == "*" else None


def _contraction(d: Def) -> tuple[Reduce, tuple[Expr, Expr]] | None:
    body = d.body
    if isinstance(body, Reduce) and body.op == "sum" and _factors(body.body):
        return body, _factors(body.body)  # type: ignore[return-value]
    return None


class SoftmaxRowterm(Rule):
    name = "softmax_rowterm"
    kind = "ASSOC"
    theorem = "softmax_bwd_rowterm"
    Params = RowtermParams

    def check(self, prog: Program, p: RowtermParams) -> Facts:
        d = self.get_def(prog, p.def_)
        out = self.get_def(prog, p.output, "output")
        self.get_def(prog, p.probs, "probs")
        o = _contraction(out)
        if o is None or out.guard or out.store != tuple(Aff.of(lp.var) for lp in out.loops):
            raise self.fail(f"{out.name} is not a plain contraction sum(j: {p.probs}[…] * V[…])")
        taken = set(names_in_program(prog))
        for r in walk(d.body):
            if not (isinstance(r, Reduce) and r.op == "sum" and _factors(r.body)):
                continue
            for x, y in (_factors(r.body), _factors(r.body)[::-1]):  # type: ignore[index]
                if not (isinstance(x, Read) and isinstance(y, Read) and x.tensor == p.probs and x.idx == y.idx):
                    continue
                if not prog.has_def(y.tensor) or y.tensor == p.probs:
                    continue
                found = self._match(prog, r, x, prog.def_named(y.tensor), out, o, taken)
                if found is not None:
                    return {"site": r, "replacement": found, "adjoint": y.tensor, "probs": p.probs,
                            "output": out.name, "row_term": f"sum({r.var}: {p.probs} * {y.tensor})"}
        raise self.fail(f"{d.name} has no sum(j: {p.probs}[…, j] * dP[…, j]) whose dP is a contraction "
                        f"sum(d: G * V) with the V of {out.name} = sum(j: {p.probs} * V)")

    def _match(self, prog: Program, r: Reduce, p_read: Read, dp: Def, out: Def,
               o: tuple[Reduce, tuple[Expr, Expr]], taken: set[str]) -> Expr | None:
        c = _contraction(dp)
        if c is None or dp.guard:
            return None
        inst = value_at(dp, p_read.idx, taken | all_binders(r))
        assert isinstance(inst, Reduce)
        d_var = fresh(inst.var + "2", taken | all_binders(r) | {r.var})
        inst = Reduce("sum", d_var, inst.ext, subst_index(inst.body, inst.var, Aff.of(d_var)))
        o_red, _ = o
        o_body = subst_index(o_red.body, o_red.var, Aff.of(r.var)) if o_red.var != r.var else o_red.body
        if o_red.ext != r.ext:
            return None
        for g, v in (_factors(inst.body), _factors(inst.body)[::-1]):  # type: ignore[index]
            if not (isinstance(g, Read) and isinstance(v, Read)):
                continue
            if any(r.var in a.names() for a in g.idx):
                continue
            for op_read, ov_read in (_factors(o_body), _factors(o_body)[::-1]):  # type: ignore[index]
                if not (isinstance(op_read, Read) and isinstance(ov_read, Read)):
                    continue
                if op_read.tensor != p_read.tensor or ov_read.tensor != v.tensor:
                    continue
                binding = _unify(out, [(op_read.idx, p_read.idx), (ov_read.idx, v.idx)], r.var)
                if binding is None:
                    continue
                d_loop = [lp for lp in out.loops if binding[lp.var] == Aff.of(d_var)]
                if len(d_loop) != 1 or d_loop[0].ext != inst.ext:
                    continue
                if any(r.var in binding[lp.var].names() or (lp is not d_loop[0] and d_var in binding[lp.var].names())
                       for lp in out.loops):
                    continue
                o_at = Read(out.name, tuple(binding[lp.var] for lp in out.loops))
                return Reduce("sum", d_var, inst.ext, Bin("*", g, o_at))
        return None

    def rewrite(self, prog: Program, p: RowtermParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        return prog.with_def(replace(d, body=replace_node(d.body, facts["site"], facts["replacement"])))


def _unify(out: Def, pairs: list[tuple[tuple[Aff, ...], tuple[Aff, ...]]], j: str) -> dict[str, Aff] | None:
    """Values of out's loop variables that make each pattern index (over them and j) equal to
    its target; None when there are none."""
    loops = {lp.var for lp in out.loops}
    binding: dict[str, Aff] = {}
    for pattern, target in pairs:
        if len(pattern) != len(target):
            return None
        for a, t in zip(pattern, target):
            bare = a.terms[0][0] if len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const else None
            if bare in loops:
                if binding.setdefault(bare, t) != t:
                    return None
            elif a != t:
                return None
    return binding if loops <= set(binding) else None


register(SoftmaxRowterm())
