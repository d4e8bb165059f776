"""Obligations of the fold steps: ONLINE-AGG (the quotient of tiled sums = the IR's fold), MASK
(skipped iterations leave the state unchanged), MAP-MMA (the sum = its mma16 grouping) and
FOLD-STAT (the fold's second output leaves O unchanged) and FUSE-SUMS (two sums as one fold of two
accumulators).  See compiler/obligations.py."""
from __future__ import annotations

from .ir import Bin, Fold, Program, Reduce, Select, Un
from .obligations_base import (
    LEAN_PROPS, Obligation, Thm, online_parts, running_max_lam, _binders, _c, _def_hyps, _l, _def_pair, _eq_thm,
    _exporter, _lam_of, _ob, _thm_name,
)
from .obligations_direct import online_fold_script
from .obligations_frame import _FRAME_PROOF, _def_frame, store_frame
from .obligations_site import _finish, _site
from .obligations_terms import A, ExportError, Lam, N, V
from .printer import show_def


def ob_online_agg(rec, before: Program, after: Program) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    if f.get("plain"):  # without the V product: one softmax element as an (m, l) fold
        from .obligations_row import ob_online_softmax

        return ob_online_softmax(rec, before, after, _finish)
    bd, ad = _def_pair(before, after, p.def_)
    l_def = before.def_named(f["denominator"])
    num0 = bd.body.a.body.body
    num0 = num0.then if isinstance(num0, Select) else num0
    m_name = num0.a.a.b.tensor if isinstance(num0, Bin) and isinstance(num0.a, Un) else None
    inline = {l_def.name: l_def}
    if m_name is not None and m_name in {d.name for d in before.defs}:
        inline[m_name] = before.def_named(m_name)
    ex = _exporter(before, after, inline)
    hyps = _def_hyps(ex, bd)
    b = ex.expr(bd.body, {})
    a = ex.expr(ad.body, {})
    # the flat (untiled) score, value and mask, from the before numerator
    num = bd.body.a
    outer, inner = num, num.body
    body = inner.body
    conds: tuple = ()
    if isinstance(body, Select):
        conds, body = body.conds, body.then
    if not (isinstance(body, Bin) and body.op == "*" and isinstance(body.a, Un) and isinstance(body.a.a, Bin)):
        raise ExportError("the numerator is not exp(s - M) * v")
    score, m_read, value = body.a.a.a, body.a.a.b, body.b
    G, S, M, E, T = online_parts(ex, outer, inner, conds, score, m_read)
    Vf = Lam(["j_"], ex.expr(value, {inner.var: ("idx", V("j_")), outer.var: ("idx", N(0))}))
    fold = ad.body
    if not isinstance(fold, Fold) or len(fold.state) != 3:
        raise ExportError("the after body is not a fold with state (m, l, acc)")
    # mnext: the IR's own running max, as a function of (tile, old max)
    mnext = running_max_lam(ex, fold, f["m_new"])
    fo = f"onlineFoldG ({_c(G)}) ({_c(S)}) ({_c(Vf)}) {_c(T)} ({_c(mnext)}) ninf ({_c(E)})"
    # the running max is defined (finite once a live key was seen) and so is the shift M
    proof = (f"intros.\n"
             f"  assert (Hmn_ : online_max_ok ({_c(G)}) {_c(T)} ({_c(mnext)}) ({_c(E)})) by derivc_mnext.\n"
             f"  assert (HM_ : forall j_, j_ < ({_c(E)}) * {_c(T)} -> {_c(M)} = NInf -> ({_c(G)}) j_ = false)"
             f" by (intros j_ Hj_; derivc_valid j_).\n"
             f"  transitivity (div (st_acc ({fo})) (st_l ({fo}))).\n"
             f"  - rewrite (proj1 (online_agg_guard ({_c(G)}) ({_c(S)}) ({_c(Vf)}) {_c(T)} ({_c(mnext)}) ninf ({_c(M)}) ({_c(E)}) Hmn_ HM_)).\n"
             f"    rewrite !(sumTo_tile ({_c(E)}) {_c(T)}).\n"
             f"    derivc_congr.\n"
             f"  - rewrite onlineFoldG_foldN.\n"
             f"    {online_fold_script(G, S, Vf, T, mnext, E, a) or 'derivc_congr'}.")
    fo_l = f"onlineFoldG ({_l(G)}) ({_l(S)}) ({_l(Vf)}) {_l(T)} ({_l(mnext)}) Ext.ninf ({_l(E)})"
    lean = (f"by\n  intros\n"
            f"  have Hmn_ : online_max_ok ({_l(G)}) {_l(T)} ({_l(mnext)}) ({_l(E)}) := by derivc_mnext\n"
            f"  have HM_ : ∀ j_, j_ < ({_l(E)}) * {_l(T)} → {_l(M)} = Ext.ninf → ({_l(G)}) j_ = false := by\n"
            f"    intro j_ _\n    derivc_valid j_\n"
            f"  refine Eq.trans (b := div (OState.st_acc ({fo_l})) (OState.st_l ({fo_l}))) ?_ ?_\n"
            f"  · rw [(online_agg_guard ({_l(G)}) ({_l(S)}) ({_l(Vf)}) {_l(T)} ({_l(mnext)}) Ext.ninf ({_l(M)})"
            f" ({_l(E)}) Hmn_ HM_).1]\n"
            f"    rw [sumTo_tile ({_l(E)}) {_l(T)}, sumTo_tile ({_l(E)}) {_l(T)}]\n"
            f"    derivc_congr\n"
            f"  · rw [onlineFoldG_foldN]\n"
            f"    derivc_congr")
    ob = _ob(rec, rec.theorem, checked=(
        f"the quotient of the tiled numerator and {l_def.name} (inlined) equals the IR's fold: "
        "its step is matched, field by field, against onlineStepW of onlineFoldG (masked weights "
        "exp(s - m'), rescale of l and acc by rescale(m, m'), running max = the IR's own m_new, "
        "which is shown to be -inf only while every key so far is masked; the shift M (inlined) "
        "is -inf only when every key is masked; a fully masked row gives 0)"))
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof, lean))
    ob.thms.append(store_frame(rec, before, after, p.def_))
    ob.before, ob.after = _c(b), _c(a)
    return _finish(ob, ex)


def ob_mask(rec, before: Program, after: Program) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    site = f["site"]
    ex, b, a, hyps = _site(rec, before, after, p.def_, site)
    facts, facts_l = [], []
    for num, t in f["bounds"]:
        if num.names() and t > 1:
            facts.append(f"pose proof (ceilDiv_ge ({_c(ex.aff(num, {}))}) {t} ltac:(lia)).")
            facts_l.append(f"have := ceilDiv_ge ({_l(ex.aff(num, {}))}) {t} (by omega)\n  ")
    facts_s = " ".join(facts)
    facts_ls = "".join(facts_l) + ("simp only [ceilDiv] at *\n  " if facts_l else "")
    kill = "derivc_red; repeat (derivc_split; derivc_red; try (exfalso; lia)); reflexivity"
    if isinstance(site, Fold):
        if len(site.state) != 3:
            raise ExportError("MASK on a fold other than online aggregation")
        proof = f"intros. {facts_s}\n  derivc_congr."
        lean = f"by\n  intros\n  {facts_ls}derivc_congr"
    else:
        lemma = "sumTo_guard_trunc" if site.op == "sum" else "maxTo_trunc"
        K = a[2][0]
        # a tiled sum (skip_masked's tile-sum case): each skipped iteration is a tile sum of zero
        # terms, each zero by a failing guard of the term or of a factor (ring: 0 * x = 0)
        tile_sum = site.op == "sum" and isinstance(site.body, Reduce)
        if tile_sum:
            kill = ("apply sumTo_zero_ext. intros t Ht. derivc_red; "
                    "repeat (derivc_split; derivc_red; try (exfalso; lia)); try ring")
        proof = (f"intros.\n  etransitivity.\n  {{ apply ({lemma} ({_c(b[2][0])}) ({_c(K)}) ({_c(_lam_of(b))})).\n"
                 f"    - intros j Hj1 Hj2. {facts_s} {kill}.\n    - lia. }}\n  derivc_congr.")
        lean_zero = ("  refine sumTo_zero_ext _ _ (fun t _ => ?_)\n    derivc_red\n    derivc_cases\n"
                     "    all_goals first | rfl | (exfalso; omega) | ring\n") if tile_sum else (
                     "  derivc_red\n    derivc_cases\n    all_goals first | rfl | (exfalso; omega)\n")
        lean = (f"by\n  intros\n  refine Eq.trans ({lemma} ({_l(b[2][0])}) ({_l(K)}) ({_l(_lam_of(b))}) ?_ (by omega)) ?_\n"
                f"  · intro j _ _\n  {facts_ls.replace(chr(10) + '  ', chr(10) + '    ')}{lean_zero}"
                "  · derivc_congr")
    ob = _ob(rec, "sumTo_guard_trunc", checked=(
        "the iterations beyond the new bound are fully masked: they add zero (sum), -inf (max) or "
        "leave the online-aggregation state (m, l, acc) unchanged (fold)"))
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof, lean))
    ob.before, ob.after = _c(b), _c(a)
    return _finish(ob, ex)


def ob_map_mma(rec, before: Program, after: Program) -> Obligation:
    f = rec.raw_facts
    site: Reduce = f["site"]
    ex, b, a, hyps = _site(rec, before, after, rec.parsed.def_, site)
    n = b[2][0]
    if n[0] != "num" or n[1] % 16 or a[2][1][0] != "lam" or a[2][1][2][1] != "mma16":
        ob = _ob(rec, "mma_tile", status="partial", checked="the value is unchanged",
                 unchecked="the mma16 grouping (extent not a fixed multiple of 16 or k != 16)")
        ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, "intros.\n  derivc_congr."))
    else:
        inst = f"mma_tile {n[1] // 16} ({_c(_lam_of(b))})"
        ob = _ob(rec, "mma_tile", checked=(
            "the k-sum equals its tensor-core grouping: chunks of 16 added in the mma16 order"))
        lean = (f"by\n  intros\n  refine Eq.trans (mma_tile {n[1] // 16} ({_l(_lam_of(b))})) ?_\n"
                "  derivc_congr")
        ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps,
                               f"intros.\n  etransitivity.\n  {{ exact ({inst}). }}\n  derivc_congr.", lean))
    ob.before, ob.after = _c(b), _c(a)
    return _finish(ob, ex)


def ob_fold_stat(rec, before: Program, after: Program) -> Obligation:
    """FOLD-STAT: the definition's own value is unchanged (its loop nest, guard, store and body,
    by congruence: the fold's further result is not part of its value); the statistic it now
    writes, m + log l of the fold's final state, is validated numerically (every output on every
    draw) and justified by theorem online_lse, not exported per step (log is an argument of that
    theorem until the algebra has it)."""
    name = rec.parsed.def_
    ex = _exporter(before, after)
    bd, ad = before.def_named(name), after.def_named(name)
    ob = _ob(rec, "online_lse", status="partial", checked=f"{name} is unchanged (its value, store and nest)",
             unchecked=f"the statistic {rec.parsed.stat} = {rec.raw_facts['value']} of the fold's final state: "
                       "validated numerically; theorem online_lse (not instantiated per step)")
    stmt = _def_frame(ex, bd, ad)  # first: exporting it collects the binders
    ob.thms.append(Thm(_thm_name(rec), _binders(ex), [], stmt, _FRAME_PROOF, LEAN_PROPS))
    ob.before, ob.after = show_def(bd), show_def(ad)
    return _finish(ob, ex)


def ob_fuse_sums(rec, before: Program, after: Program) -> Obligation:
    """FUSE-SUMS: the definition's value, sum(t < E: f), equals the first component of the fold
    of the two accumulators (theorem fold_pair_sum through fold_pair_sum_fst: the exported step
    is the pair update by conversion); the further output's value, the renamed second sum,
    equals its second component (fold_pair_sum_snd).  That the renamed sum is the removed
    definition's body under a renaming of its loop indices is the rule's construction."""
    p, f = rec.parsed, rec.raw_facts
    bd, ad = _def_pair(before, after, p.def_)
    ex = _exporter(before, after)
    hyps = _def_hyps(ex, ad)
    b = ex.expr(bd.body, {})
    a = ex.expr(ad.body, {})
    g = ex.expr(f["with_body"], {})
    ob = _ob(rec, "fold_pair_sum", status="partial", checked=(
        f"{p.def_} = sum over {f['index']} equals the first component of the fold carrying both sums from (0, 0); "
        f"{p.with_}'s sum, its loop indices renamed to {p.def_}'s, equals the second component (the further output)"),
        unchecked=f"that the renamed sum is {p.with_}'s own body under that renaming (the rule's construction)")
    F, G = _lam_of(b), _lam_of(g)
    for k, (lhs, comp) in enumerate(((b, "fst"), (g, "snd"))):
        lemma = f"fold_pair_sum_{comp}"
        proof = (f"intros.\n  cbv zeta.\n  symmetry.\n  apply ({lemma} _ ({_c(F)}) ({_c(G)})).\n"
                 "  intros; reflexivity.")
        lean = f"by\n  intros\n  exact ({lemma} _ ({_l(F)}) ({_l(G)}) _ (fun _ _ => rfl)).symm"
        rhs = a if comp == "fst" else _snd_of_fold(a)
        ob.thms.append(_eq_thm(_thm_name(rec, "" if k == 0 else "_with"), ex, lhs, rhs, hyps, proof, lean))
    ob.thms.append(store_frame(rec, before, after, p.def_))
    ob.before, ob.after = show_def(bd), show_def(ad)
    return _finish(ob, ex)


def _snd_of_fold(t):
    """The exported fold `let fs := foldN .. in <lets> in result` with its result replaced by the
    second state component (snd fs): the further output's value."""
    assert t[0] == "let", t
    return ("let", t[1], t[2], A("snd", V(t[1])))
