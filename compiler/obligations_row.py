"""Per-step obligation of ONLINE-AGG without the V product (row softmax in one streaming pass).

The definition before the step is one softmax element, exp(a - M) / L with L (and M) inlined
from their definitions; after it, the IR's (m, l) fold with result exp(a - m) / l.  The proof
goes through `online_softmax` (proofs_ci/coq/Rules/OnlineAgg.v): the fold's quotient equals the
shifted quotient for any defined shift, given one live key (column 0 of a row that has an
output), then `sumTo_tile` and `derivc_congr` match the tiled L; on the other side
`onlineFold2_foldN` and `derivc_congr` match the pair fold, field by field, with the IR's own
step (running max = the IR's m_new, rescale of l as written).  Called from
`compiler.obligations.ob_online_agg` when the step's facts say `plain`.
"""
from __future__ import annotations

from .ir import Aff, Fold, Program, Select, subst_index
from .obligations_base import Obligation, online_parts, running_max_lam, _c, _def_hyps, _def_pair, _eq_thm, _exporter, _l, _ob, _thm_name
from .obligations_frame import store_frame
from .obligations_terms import ExportError


def ob_online_softmax(rec, before: Program, after: Program, finish) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    bd, ad = _def_pair(before, after, p.def_)
    l_def = before.def_named(f["denominator"])
    inline = {l_def.name: l_def}
    if f["shift"] in {d.name for d in before.defs}:
        inline[f["shift"]] = before.def_named(f["shift"])
    ex = _exporter(before, after, inline)
    hyps = _def_hyps(ex, bd)
    b = ex.expr(bd.body, {})
    a = ex.expr(ad.body, {})
    num, l_read = bd.body.a, bd.body.b
    at_score, m_read = num.a.a, num.a.b
    # L's tiled sum with its loops read at the consumer's row: the flat score and mask
    l_body = l_def.body
    for lp in l_def.loops:
        l_body = subst_index(l_body, lp.var, Aff.of("__row_" + lp.var))
    for lp, idx in zip(l_def.loops, l_read.idx):
        l_body = subst_index(l_body, "__row_" + lp.var, idx)
    outer, inner = l_body, l_body.body
    body, conds = inner.body, ()
    if isinstance(body, Select):
        conds, body = body.conds, body.then
    score = body.a.a
    G, S, M, E, T = online_parts(ex, outer, inner, conds, score, m_read)
    num_score = ex.expr(at_score, {})
    fold = ad.body
    if not isinstance(fold, Fold) or len(fold.state) != 2:
        raise ExportError("the after body is not a fold with state (m, l)")
    mnext = running_max_lam(ex, fold, f["m_new"])
    f2 = f"onlineFold2 ({_c(G)}) ({_c(S)}) {_c(T)} ({_c(mnext)}) ninf ({_c(E)})"
    proof = (f"intros.\n"
             f"  assert (Hmn_ : online_max_ok ({_c(G)}) {_c(T)} ({_c(mnext)}) ({_c(E)})) by derivc_mnext.\n"
             f"  assert (HM_ : forall j_, j_ < ({_c(E)}) * {_c(T)} -> {_c(M)} = NInf -> ({_c(G)}) j_ = false)"
             f" by (intros j_ Hj_; derivc_valid j_).\n"
             f"  assert (Hj0_ : 0 < ({_c(E)}) * {_c(T)}) by first [ lia | match goal with |- 0 < ceilDiv ?n ?t * _ =>"
             f" pose proof (ceilDiv_ge n t ltac:(lia)); lia end ].\n"
             f"  assert (Hg0_ : ({_c(G)}) 0 = true) by (cbv beta; first [ reflexivity | apply Nat.ltb_lt; lia"
             f" | apply Nat.leb_le; lia | derivc_red; derivc_cases; reflexivity ]).\n"
             f"  transitivity (div (expd (Fin ({_c(num_score)})) (fst ({f2}))) (snd ({f2}))).\n"
             f"  - rewrite (online_softmax ({_c(G)}) ({_c(S)}) {_c(T)} ({_c(mnext)}) ninf ({_c(M)}) ({_c(E)}) 0"
             f" ({_c(num_score)}) Hmn_ HM_ Hj0_ Hg0_).\n"
             f"    rewrite !(sumTo_tile ({_c(E)}) {_c(T)}).\n"
             f"    derivc_congr.\n"
             f"  - rewrite onlineFold2_foldN. cbv delta [onlineStep2].\n"
             f"    derivc_congr.")
    f2l = f"onlineFold2 ({_l(G)}) ({_l(S)}) {_l(T)} ({_l(mnext)}) Ext.ninf ({_l(E)})"
    lean = (f"by\n  intros\n"
            f"  have Hmn_ : online_max_ok ({_l(G)}) {_l(T)} ({_l(mnext)}) ({_l(E)}) := by derivc_mnext\n"
            f"  have HM_ : ∀ j_, j_ < ({_l(E)}) * {_l(T)} → {_l(M)} = Ext.ninf → ({_l(G)}) j_ = false := by\n"
            f"    intro j_ _\n    derivc_valid j_\n"
            f"  have Hj0_ : 0 < ({_l(E)}) * {_l(T)} := by omega\n"
            f"  have Hg0_ : ({_l(G)}) 0 = true := by simp_all\n"
            f"  refine Eq.trans (b := div (expd (Ext.fin ({_l(num_score)})) ({f2l}).1) ({f2l}).2) ?_ ?_\n"
            f"  · rw [online_softmax ({_l(G)}) ({_l(S)}) {_l(T)} ({_l(mnext)}) Ext.ninf ({_l(M)}) ({_l(E)}) 0"
            f" ({_l(num_score)}) Hmn_ HM_ Hj0_ Hg0_]\n"
            f"    rw [sumTo_tile ({_l(E)}) {_l(T)}]\n"
            f"    derivc_congr\n"
            f"  · rw [onlineFold2_foldN]\n"
            f"    simp only [onlineStep2]\n"
            f"    derivc_congr")
    ob = _ob(rec, rec.theorem, checked=(
        f"one softmax element exp(a - M) / {l_def.name} ({l_def.name} and the shift inlined) equals the IR's "
        "(m, l) fold with result exp(a - m) / l: its step is matched, field by field, against onlineStep2 "
        "(masked weights exp(s - m'), l rescaled by rescale(m, m'), running max = the IR's own m_new, shown "
        "to be -inf only while every key so far is masked); the shift is -inf only when every key is masked; "
        "column 0 is a live key of a row with an output"))
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof, lean))
    ob.thms.append(store_frame(rec, before, after, p.def_))
    ob.before, ob.after = _c(b), _c(a)
    return finish(ob, ex)
