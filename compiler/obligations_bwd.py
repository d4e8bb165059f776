"""Obligations of the backward pass's rewrites (issue 16), in the style of compiler/obligations.py.

  RECOMPUTE        one element of the (masked) softmax = [mask] ? exp(s - LSE) : 0 with LSE and M
                   inlined from their new definitions (LSE = M + log L, exported `eadd M (log L)`),
                   via softmax_recompute at the shift M (derivc_valid: M is -inf only where every
                   key is masked)
  SOFTMAX-ROWTERM  sum(j: P · dP) with dP inlined = sum(d: G · O) with O inlined, via
                   softmax_bwd_rowterm at the instance read from the IR (the rule's P, G, V)
"""
from __future__ import annotations

from typing import Callable

from .ir import Aff, Bin, Def, Program, Read, Reduce, Softmax, all_binders, names_in_program
from .obligations_base import Obligation, Thm, _c, _eq_thm, _l, _ob, _thm_name
from .obligations_terms import ExportError

Finish = Callable[..., Obligation]


def ob_recompute(rec, before: Program, after: Program, site_of, finish: Finish) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    site: Softmax = f["site"]
    lse_def, m_def = after.def_named(f["lse"]), after.def_named(f["max"])
    ex, b, a, hyps = site_of(rec, before, after, p.def_, site, {lse_def.name: lse_def, m_def.name: m_def})
    row = tuple(Aff.of(v) for v in f["row_loops"])
    m_read = ex.expr(Read(f["max"], row), {})
    g = "_" if site.mask else "(fun _ => true)"
    lemma, lemma_l = f"softmax_recompute {g} _ _ ({_c(m_read)})", f"softmax_recompute {g} _ _ ({_l(m_read)})"
    # unmasked: the IR's softmaxAt is softmaxAtG at the constant mask (softmaxAtG_true)
    pre = "" if site.mask else "rewrite <- softmaxAtG_true.\n  "
    pre_l = "" if site.mask else "rw [← softmaxAtG_true]\n  "
    proof = (f"intros.\n  {pre}etransitivity.\n  {{ apply ({lemma}); [ lia | intros k_ Hk_; derivc_valid k_ ]. }}\n"
             "  derivc_congr.")
    lean = (f"by\n  intros\n  {pre_l}refine Eq.trans ({lemma_l} _ (by omega) (fun k_ _ => by derivc_valid k_)) ?_\n"
            "  derivc_congr")
    ob = _ob(rec, "softmax_recompute", checked=(
        f"one element of the {'masked ' if site.mask else ''}softmax equals "
        f"{'[mask] ? ' if site.mask else ''}exp(s - {f['lse']}){' : 0' if site.mask else ''} with "
        f"{f['lse']} = {f['max']} + log(sum exp(s - {f['max']})) and {f['max']} inlined from their new "
        f"definitions; exact for any shift that is -inf only where every key is masked (fully masked "
        f"rows: 0 on both sides)"), uses_log=True)
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof, lean))
    ob.before, ob.after = _c(b), _c(a)
    return finish(ob, ex)


def _product_reads(e) -> tuple[Read, Read]:
    if not (isinstance(e, Bin) and e.op == "*" and isinstance(e.a, Read) and isinstance(e.b, Read)):
        raise ExportError(f"not a product of two reads: {e}")
    return e.a, e.b


def ob_rowterm(rec, before: Program, after: Program, site_of, finish: Finish) -> Obligation:
    """sum(j: P[..j] * dP[..j]) = sum(d: G[..d] * O[..d]) with dP and O inlined (generated tensors
    read in range), through softmax_bwd_rowterm's two sides at the IR's P, G, V: the step is exact
    for every P, G, V, so the theorem's instance is read off the before term (P, and dP's body
    G · V at P's index) and the after term must agree with the theorem's other side."""
    from .rules.fuse import value_at

    p, f = rec.parsed, rec.raw_facts
    site: Reduce = f["site"]
    dp_def, out_def = before.def_named(f["adjoint"]), before.def_named(f["output"])
    ex, b, a, hyps = site_of(rec, before, after, p.def_, site, {dp_def.name: dp_def, out_def.name: out_def})
    x, y = _product_reads(site.body)
    p_read = x if x.tensor == f["probs"] else y
    taken = set(names_in_program(before)) | all_binders(site) | {site.var}
    inst = value_at(dp_def, p_read.idx, taken)
    if not (isinstance(inst, Reduce) and inst.op == "sum"):
        raise ExportError(f"{dp_def.name} is not a sum over d")
    r1, r2 = _product_reads(inst.body)
    g_read, v_read = (r1, r2) if not any(site.var in x.names() for x in r1.idx) else (r2, r1)
    lhs = Reduce("sum", site.var, site.ext, Bin("*", p_read, Reduce("sum", inst.var, inst.ext, Bin("*", g_read, v_read))))
    rhs = Reduce("sum", inst.var, inst.ext, Bin("*", g_read, Reduce("sum", site.var, site.ext, Bin("*", p_read, v_read))))
    tl, tr = ex.expr(lhs, {}), ex.expr(rhs, {})
    proof = (f"intros.\n  transitivity ({_c(tl)}).\n  {{ derivc_congr. }}\n"
             f"  transitivity ({_c(tr)}).\n  {{ apply softmax_bwd_rowterm. }}\n  derivc_congr.")
    lean = (f"by\n  intros\n  refine Eq.trans (b := {_l(tl)}) (by derivc_congr) ?_\n"
            f"  refine Eq.trans (b := {_l(tr)}) (softmax_bwd_rowterm _ _ _ _ _) ?_\n  derivc_congr")
    ob = _ob(rec, "softmax_bwd_rowterm", checked=(
        f"the row term sum({site.var}: {f['probs']} * {dp_def.name}) with {dp_def.name} inlined equals "
        f"sum(d: G * {out_def.name}) with {out_def.name} inlined (a finite-sum exchange)"))
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof, lean))
    ob.before, ob.after = _c(b), _c(a)
    return finish(ob, ex)
