"""Per-step proof obligations: BUILD/proofs/StepNN_<rule>.v (Coq, checked by `derivc verify`)
and StepNN_<rule>.lean (Lean 4, not checkable here), plus index.json.

An obligation states the step's LOCAL rewrite as an equality of terms of the semantics
(proofs_ci/coq): the rewritten site as it is in IRₖ₋₁ (`before`) and the node at the same place
in IRₖ (`after`), both exported from the actual IR by compiler/obligations_terms.py, universally
quantified over everything free in them, with bound hypotheses `v < extent` for the enclosing
loops/reductions, the definition's store guard and enclosing select conditions.  The proof
applies the rule's theorem to `before` and closes the rest with `derivc_congr`
(proofs_ci/coq/Tactics.v) or, where the exporter prints it, a direct congruence descent to the
differing subterms (compiler/obligations_direct.py); `derivc_congr` only accepts agreement up to linear index arithmetic, guards
decided by lia, in-bounds producer reads and commutative-ring identities.  The after-term is
never produced by instantiating the lemma, so a wrong rewrite makes coqc fail.

Rule by rule (what is stated):
  TILE (reduction)  site: sum/max over k  =  tiled form          sumTo_tile_guard / maxTo_tile_guard
  TILE (loop)       every write of the tiled nest is a write of the untiled one (same value,
                    in range) and every element of the untiled nest is written  gen_tile, tile_cover
  REORDER (sums)    sumTo_swap;  (loops) same iteration set, same store/value at every point,
                    and the store is injective on the nest (writes commute)
  SPLIT             sumTo_split (maxTo_app for max)
  FUSE / UNFUSE     consumer with producer reads as generated tensors (genAt) = inlined body  gen_inline
  CACHE             site with the staged buffer = site reading the source (accumulator: unchanged value)
  PARALLEL          same nest/store/value, and the store index is injective over the loop nest
  ASSOC             sumTo_factor (division is mul/inv)
  SPLIT-SOFTMAX     one element of the (masked) softmax = exp(s - M) / L with L inlined, any M
  ONLINE-AGG        the quotient of tiled sums (L inlined) = the IR's fold, via online_agg_guard
  MASK              the truncated fold/reduction: skipped iterations leave the state unchanged
                    (sumTo_guard_trunc / foldN_trunc)
  MAP-MMA           the sum = its mma16 grouping (the meaning of the mma fact)  mma_tile
  SPLIT-KV          the combine = acc / l of the merged partial states  online_merge_global
                    (compiler/obligations_split.py)
  SPLIT-K           the sum = Σ over splits of the partial sums (inlined)  sumTo_split_k_strided
                    (compiler/obligations_split.py)
  RECOMPUTE / SOFTMAX-ROWTERM (the backward): compiler/obligations_bwd.py
"""
from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

from .ir import Aff, Program, Read, Reduce, Softmax
from .obligations_base import (
    Obligation, Thm, _at_path, _binders, _c, _def_hyps, _l, _def_pair, _eq_thm, _exporter, _failed_text, _find_path,
    _lam_of, _ob, _thm_name, coq_text, lean_text,
)
from .obligations_direct import prove_directly
from .obligations_bwd import ob_recompute, ob_rowterm
from .obligations_split import ob_split_k, ob_split_kv
from .obligations_fold import ob_fold_stat, ob_fuse_sums, ob_map_mma, ob_mask, ob_online_agg
from .obligations_site import _finish, _site
from .obligations_frame import others_thm, store_frame
from .obligations_safety import safety_index, safety_obligation
from .obligations_terms import A, ExportError, N, V, _coq_nat, conj

__all__ = ["Obligation", "Thm", "coq_text", "lean_text", "obligation_for", "write_obligations"]


# --------------------------------------------------------------------------- rules


def ob_tile(rec, before: Program, after: Program) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    if f["target"] == "loop":
        return ob_tile_loop(rec, before, after)
    site: Reduce = f["site"]
    ex, b, a, hyps = _site(rec, before, after, p.def_, site)
    n_outer = a[2][0] if a[0] == "app" and a[1] == site_head(site) else None
    if n_outer is None:
        raise ExportError("the tiled reduction is not where the site was")
    thm = "sumTo_tile_guard" if site.op == "sum" else "maxTo_tile_guard"
    inst = f"{thm} ({_c(b[2][0])}) ({_c(n_outer)}) {_coq_nat(p.size)} ({_c(_lam_of(b))})"
    proof = (f"intros.\n  etransitivity.\n  {{ apply ({inst}). first [ apply ceilDiv_ge; lia | lia ]. }}\n"
             f"  derivc_congr.")
    lean = (f"by\n  intros\n  refine Eq.trans ({thm} ({_l(b[2][0])}) ({_l(n_outer)}) {p.size} ({_l(_lam_of(b))})\n"
            f"    (by first | exact ceilDiv_ge _ _ (by omega) | omega)) ?_\n  derivc_congr")
    ob = _ob(rec, thm, checked="the tiled reduction (outer x inner with guard) equals the original")
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof, lean))
    ob.before, ob.after = _c(b), _c(a)
    return _finish(ob, ex)


def site_head(site: Reduce) -> str:
    return "sumTo" if site.op == "sum" else "maxTo"


def ob_tile_loop(rec, before: Program, after: Program) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    bd, ad = _def_pair(before, after, p.def_)
    lp = next(x for x in bd.loops if x.var == p.index)
    num, div = lp.ext.single()
    outer, inner, t = f["outer"], f["inner"], p.size
    ex = _exporter(before, after)
    other = [x for x in bd.loops if x.var != p.index]
    env_o = {x.var: ("idx", V("i_" + x.var)) for x in other}
    # tiled side: outer/inner bound; untiled side at P = inner + t*outer
    env_a = dict(env_o)
    env_a[outer] = ("idx", V("i_" + outer))
    env_a[inner] = ("idx", V("i_" + inner))
    P = ex.aff(Aff.build({outer: t, inner: 1}), env_a)
    env_bP = dict(env_o)
    env_bP[p.index] = ("idx", P)
    env_bp = dict(env_o)
    env_bp[p.index] = ("idx", V("i_" + p.index))
    # hypotheses on the other loops (bounds only; guards are per side)
    top_hyps = [("lt", V("i_" + x.var), ex.ext(x.ext, env_o)) for x in other]
    E = ex.ext(lp.ext, env_o)
    a_loop_o = next(x for x in ad.loops if x.var == outer)
    Eo = ex.ext(a_loop_o.ext, env_o)
    ga = [ex.cond_prop(c, env_a) for c in ad.guard]
    gbP = [ex.cond_prop(c, env_bP) for c in bd.guard]
    gbp = [ex.cond_prop(c, env_bp) for c in bd.guard]
    st_eq_P = [("eq", ex.aff(x, env_a), ex.aff(y, env_bP)) for x, y in zip(ad.store, bd.store)]
    body_eq = ("eq", ex.expr(ad.body, env_a), ex.expr(bd.body, env_bP))
    part1 = ("forall", [("i_" + outer, "nat"), ("i_" + inner, "nat")],
             ("imp", [("lt", V("i_" + outer), Eo), ("lt", V("i_" + inner), N(t))] + ga,
              conj([("lt", P, E)] + gbP + st_eq_P + [body_eq])))
    env_cov = dict(env_o)
    env_cov[outer] = ("idx", V("i_" + outer))
    env_cov[inner] = ("idx", V("i_" + inner))
    ga_c = [ex.cond_prop(c, env_cov) for c in ad.guard]
    st_eq_c = [("eq", ex.aff(x, env_cov), ex.aff(y, env_bp)) for x, y in zip(ad.store, bd.store)]
    part2 = ("forall", [("i_" + p.index, "nat")],
             ("imp", [("lt", V("i_" + p.index), E)] + gbp,
              ("exists", ["i_" + outer, "i_" + inner],
               conj([("lt", V("i_" + outer), Eo), ("lt", V("i_" + inner), N(t))] + ga_c + st_eq_c))))
    pv = "i_" + p.index
    cover = (f"pose proof (tile_cover {pv} ({_c(E)}) {t} ltac:(lia) ltac:(lia)) as [? ?]. "
             if Eo[0] == "app" and Eo[1] == "ceilDiv" else "")
    proof = ("intros. split.\n"
             "  - intros. derivc_destruct_conj. repeat split; first [ lia | derivc_congr ].\n"
             f"  - intros. derivc_destruct_conj. {cover}\n"
             f"    pose proof (gen_tile (fun x : nat => x) {t} {pv} ltac:(lia)) as Hg. cbv beta in Hg.\n"
             f"    pose proof (Nat.mod_upper_bound {pv} {t} ltac:(lia)).\n"
             f"    exists ({pv} / {t}), ({pv} mod {t}). repeat split; lia.")
    cover_l = (f"    have _hcov := tile_cover {pv} ({_l(E)}) {t} (by omega) (by omega)\n"
               "    simp only [ceilDiv] at *\n" if Eo[0] == "app" and Eo[1] == "ceilDiv" else "")
    lean = ("by\n  intros\n  refine ⟨?_, ?_⟩\n"
            "  · intros\n    repeat' (first | apply And.intro)\n    all_goals first | omega | derivc_congr\n"
            f"  · intros\n{cover_l}"
            f"    have _hg : {pv} / {t} * {t} + {pv} % {t} = {pv} := gen_tile (fun x : Nat => x) {t} {pv} (by omega)\n"
            f"    have _hm := Nat.mod_lt {pv} (by omega : 0 < {t})\n"
            f"    refine ⟨{pv} / {t}, {pv} % {t}, ?_⟩\n"
            "    repeat' (first | apply And.intro)\n    all_goals omega")
    ex.nat_vars.pop(pv, None)
    binders = [("i_" + x.var, "nat") for x in other] + _binders(
        ex, exclude={"i_" + x for x in (outer, inner, p.index)} | {"i_" + x.var for x in other})
    concl = conj([part1, part2])
    ob = _ob(rec, "gen_tile", checked=(
        "every write of the tiled loop nest (under its guard) is in range, satisfies the old guard, "
        "goes to the element the untiled nest writes at p = inner + T*outer, with the same value; "
        "every element p < extent of the untiled nest is written (tile_cover, gen_tile)"))
    if div != 1:
        ob.status, ob.unchecked = "partial", f"extent {lp.ext} has a divisor: the cover proof may not apply"
    ob.thms.append(Thm(_thm_name(rec), binders, top_hyps, concl, proof, lean))
    ob.before, ob.after = _c(ex.expr(bd.body, env_bp)), _c(ex.expr(ad.body, env_a))
    return _finish(ob, ex)


def ob_nest(rec, before: Program, after: Program, theorem: str) -> Obligation:
    """Loops permuted or mapped: same iteration set, same store/value, injective store."""
    d = rec.parsed.def_
    bd, ad = _def_pair(before, after, d)
    if sorted(x.var for x in bd.loops) != sorted(x.var for x in ad.loops):
        raise ExportError("the loop variables changed")
    ex = _exporter(before, after)
    vars_ = [x.var for x in ad.loops]
    env = {v: ("idx", V("i_" + v)) for v in vars_}
    env2 = {v: ("idx", V("i_" + v + "'")) for v in vars_}
    it_b = conj(_def_hyps(ex, bd, env))
    it_a = conj(_def_hyps(ex, ad, env))
    it_a2 = conj(_def_hyps(ex, ad, env2))
    bs = [("i_" + v, "nat") for v in vars_]
    bs2 = [("i_" + v + "'", "nat") for v in vars_]
    p1 = ("forall", bs, ("iff", it_b, it_a))
    same = [("eq", ex.aff(x, env), ex.aff(y, env)) for x, y in zip(ad.store, bd.store)]
    same.append(("eq", ex.expr(ad.body, env), ex.expr(bd.body, env)))
    p2 = ("forall", bs, ("imp", [it_a], conj(same)))
    st_eq = conj([("eq", ex.aff(x, env), ex.aff(x, env2)) for x in ad.store])
    p3 = ("forall", bs + bs2, ("imp", [it_a, it_a2, st_eq],
                                conj([("eq", V("i_" + v), V("i_" + v + "'")) for v in vars_])))
    proof = ("split; [| split].\n"
             "  - intros. split; intros; derivc_destruct_conj; repeat split; lia.\n"
             "  - intros. derivc_destruct_conj. repeat split; first [ lia | derivc_congr ].\n"
             "  - intros. derivc_destruct_conj. repeat split; lia.")
    ob = _ob(rec, theorem, checked=(
        "the loop nest iterates the same points (bounds and guards), each point stores the same "
        "value at the same index, and the store index is injective on the nest, so the writes "
        "commute (the hypothesis of parallel_writes)"))
    lean = ("by\n  refine ⟨?_, ?_, ?_⟩\n"
            "  · intros\n    apply Iff.intro <;> (intro _; repeat' (first | apply And.intro); all_goals omega)\n"
            "  · intros\n    repeat' (first | apply And.intro)\n    all_goals first | omega | derivc_congr\n"
            "  · intros\n    repeat' (first | apply And.intro)\n    all_goals omega")
    ob.thms.append(Thm(_thm_name(rec), _binders(ex), [], conj([p1, p2, p3]), proof, lean))
    ob.before = "loops " + ", ".join(f"{x.var} < {x.ext}" for x in bd.loops)
    ob.after = "loops " + ", ".join(f"{x.var} < {x.ext}" + (f" @{x.mapping}" if x.mapping else "") for x in ad.loops)
    return _finish(ob, ex)


def ob_reorder(rec, before: Program, after: Program) -> Obligation:
    f = rec.raw_facts
    if f["target"] == "loops":
        return ob_nest(rec, before, after, "sumTo_swap")
    site: Reduce = f["site"]
    ex, b, a, hyps = _site(rec, before, after, rec.parsed.def_, site)
    if not (isinstance(site, Reduce) and isinstance(site.body, Reduce) and site.body.op == site.op
            and site.op == "sum"):
        ob = _ob(rec, "sumTo_swap", status="partial", checked=(
            "no exchange theorem applies to this site (only two directly nested sums have one): "
            "stated as before = after, proved only if the terms agree"))
        ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, "intros.\n  derivc_congr."))
        ob.before, ob.after = _c(b), _c(a)
        return _finish(ob, ex)
    outer_lam = _lam_of(b)
    inner = outer_lam[2]
    fn = ("lam", [outer_lam[1][0]] + _lam_of(inner)[1], _lam_of(inner)[2])
    thm = "sumTo_swap"
    inst = f"{thm} ({_c(b[2][0])}) ({_c(inner[2][0])}) ({_c(fn)})"
    proof = f"intros.\n  etransitivity.\n  {{ exact ({inst}). }}\n  derivc_congr."
    lean = (f"by\n  intros\n  refine Eq.trans ({thm} ({_l(b[2][0])}) ({_l(inner[2][0])}) ({_l(fn)})) ?_\n"
            "  derivc_congr")
    ob = _ob(rec, thm, checked="the two nested reductions commute (finite Fubini)")
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof, lean))
    ob.before, ob.after = _c(b), _c(a)
    return _finish(ob, ex)


def ob_split(rec, before: Program, after: Program) -> Obligation:
    f = rec.raw_facts
    site: Reduce = f["site"]
    ex, b, a, hyps = _site(rec, before, after, rec.parsed.def_, site)
    thm = "sumTo_split" if site.op == "sum" else "maxTo_app"
    inst = f"{thm} {f['first']} {f['second_extent']} ({_c(_lam_of(b))})"
    proof = f"intros.\n  etransitivity.\n  {{ exact ({inst}). }}\n  derivc_congr."
    lean = (f"by\n  intros\n  refine Eq.trans ({thm} {f['first']} {f['second_extent']} ({_l(_lam_of(b))})) ?_\n"
            "  derivc_congr")
    ob = _ob(rec, "sumTo_split", checked="the reduction over [0, a+b) = [0, a) combined with [a, a+b)")
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof, lean))
    ob.before, ob.after = _c(b), _c(a)
    return _finish(ob, ex)


def ob_fuse(rec, before: Program, after: Program) -> Obligation:
    f = rec.raw_facts
    prod = before.def_named(f["producer"])
    ob = _ob(rec, "gen_inline", checked=(
        f"each consumer's body, reading {prod.name} as the tensor its definition generates "
        "(genAt: zero outside its extents), equals the body with the producer inlined"))
    exs = []
    for k, name in enumerate(f["into"]):
        bd, ad = _def_pair(before, after, name)
        ex = _exporter(before, after, {prod.name: prod})
        hyps = _def_hyps(ex, bd)
        b, a = ex.expr(bd.body, {}), ex.expr(ad.body, {})
        ob.thms.append(_eq_thm(_thm_name(rec, f"_{name}" if len(f["into"]) > 1 else ""), ex, b, a, hyps,
                               "intros.\n  derivc_congr."))
        ob.before, ob.after = ob.before + _c(b), ob.after + _c(a)
        ob.thms.append(store_frame(rec, before, after, name, f"_frame_{name}" if len(f["into"]) > 1 else "_frame"))
        exs.append(ex)
    return _finish(ob, *exs)


def ob_unfuse(rec, before: Program, after: Program) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    new = after.def_named(p.name)
    ex, b, a, hyps = _site(rec, before, after, p.def_, f["site"])
    ex2 = _exporter(before, after, {new.name: new})
    ex2.nat_vars, ex2.tensors, ex2.bufs, ex2.consts, ex2._const_keys, ex2.result_ty, ex2.funs = (
        ex.nat_vars, ex.tensors, ex.bufs, ex.consts, ex._const_keys, ex.result_ty, ex.funs)
    bd, ad = _def_pair(before, after, p.def_)
    a = ex2.expr(_at_path(ad.body, _find_path(bd.body, f["site"])), {})
    ob = _ob(rec, "gen_inline", checked=f"the reduction equals the read of the new definition {new.name} (genAt)")
    ob.thms.append(_eq_thm(_thm_name(rec), ex2, b, a, hyps, "intros.\n  derivc_congr."))
    ob.before, ob.after = _c(b), _c(a)
    return _finish(ob, ex2)


def ob_cache(rec, before: Program, after: Program) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    ex, b, a, hyps = _site(rec, before, after, p.def_, f["site"])
    if p.accumulator is not None:
        ob = _ob(rec, rec.theorem, checked=(
            "the accumulator fact changes no value: the exported reduction is the same before and after"))
        proof = "intros.\n  derivc_congr."
    else:
        ob = _ob(rec, rec.theorem, checked=(
            f"the scope with the staged buffer {f['buffer']} equals the scope reading {f['tensor']}: "
            "every buffer read is an in-range tile offset whose zero-fill guard holds (cache_read2, "
            "pointwise under the enclosing bounds and guards)"))
        proof = "intros.\n  derivc_congr."
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof))
    ob.before, ob.after = _c(b), _c(a)
    return _finish(ob, ex)


def ob_parallel(rec, before: Program, after: Program) -> Obligation:
    ob = ob_nest(rec, before, after, "parallel_writes")
    if rec.raw_facts.get("shares_axis_with"):
        ob.thms.append(_grid_axis_thm(rec, before, after))
        ob.checked += ("; the loop joins a used grid axis as its fastest part: block x * E + i of the axis "
                       "decodes back to (x, i) with / and mod (grid_axis_product at the loop's extent E)")
    return ob


def _grid_axis_thm(rec, before: Program, after: Program) -> Thm:
    """The shared axis enumerates x * E + i (x: the loops already on it, i < E the joining loop)."""
    d = after.def_named(rec.parsed.def_)
    lp = next(x for x in d.loops if x.var == rec.parsed.index)
    ex = _exporter(before, after)
    e = ex.ext(lp.ext, {})
    x, big_x, i = V("blk_outer"), V("blk_outer_ext"), V("blk_" + lp.var)
    flat = ("nop", "+", ("nop", "*", x, e), i)
    concl = conj([("lt", flat, ("nop", "*", big_x, e)), ("eq", ("nop", "/", flat, e), x),
                  ("eq", A("natmod", flat, e), i)])
    binders = [(n, "nat") for n in ex.nat_vars] + [("blk_outer_ext", "nat"), ("blk_outer", "nat"),
                                                     ("blk_" + lp.var, "nat")]
    hyps = [("lt", x, big_x), ("lt", i, e)]
    return Thm(_thm_name(rec, "_axis"), binders, hyps, concl,
               "intros. apply grid_axis_product; assumption.",
               "by\n  intros\n  exact grid_axis_product _ _ _ _ (by assumption) (by assumption)")


def ob_assoc(rec, before: Program, after: Program) -> Obligation:
    f = rec.raw_facts
    ex, b, a, hyps = _site(rec, before, after, rec.parsed.def_, f["site"])
    proof = "intros.\n  derivc_red.\n  repeat rewrite <- sumTo_factor.\n  derivc_congr."
    lean = "by\n  intros\n  derivc_red\n  repeat rw [← sumTo_factor]\n  derivc_congr"
    ob = _ob(rec, "sumTo_factor", checked="the factor moved out of the sum (division as mul/inv)")
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof, lean))
    ob.before, ob.after = _c(b), _c(a)
    return _finish(ob, ex)


def ob_split_softmax(rec, before: Program, after: Program) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    site: Softmax = f["site"]
    l_def, m_def = after.def_named(f["sum"]), after.def_named(f["max"])
    ex, b, a, hyps = _site(rec, before, after, p.def_, site, {l_def.name: l_def, m_def.name: m_def})
    row = tuple(Aff.of(v) for v in f["row_loops"])
    m_read = ex.expr(Read(f["max"], row), {})
    if site.mask:
        lemma = f"softmaxAtG_shift _ _ _ _ ({_c(m_read)})"
        lemma_l = f"softmaxAtG_shift _ _ _ _ ({_l(m_read)})"
    else:
        lemma = f"softmaxAt_shift _ _ _ ({_c(m_read)})"
        lemma_l = f"softmaxAt_shift _ _ _ ({_l(m_read)})"
    lean = (f"by\n  intros\n  refine Eq.trans ({lemma_l} (by omega) (fun k_ _ => by derivc_valid k_)) ?_\n"
            "  derivc_congr")
    # the shift is the row max: -inf only where every key is masked (derivc_valid)
    proof = (f"intros.\n  etransitivity.\n  {{ apply ({lemma}); [ lia | intros k_ Hk_; derivc_valid k_ ]. }}\n"
             "  derivc_congr.")
    ob = _ob(rec, "softmax_split", checked=(
        f"one element of the {'masked ' if site.mask else ''}softmax equals exp(s - {f['max']}) / "
        f"{f['sum']} with {f['sum']} and {f['max']} inlined from their new definitions; any shift is "
        f"exact as long as it is defined: {f['max']} is -inf only where every key is masked"))
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof, lean))
    ob.before, ob.after = _c(b), _c(a)
    return _finish(ob, ex)


from .obligations_datamask import ob_mask_data  # noqa: E402 - MASK-DATA's obligations (its own module)

GENERATORS = {
    "TILE": ob_tile, "REORDER": ob_reorder, "SPLIT": ob_split, "CACHE": ob_cache,
    "PARALLEL": ob_parallel, "ASSOC": ob_assoc, "SPLIT-SOFTMAX": ob_split_softmax,
    "ONLINE-AGG": ob_online_agg, "MASK": ob_mask, "MAP-MMA": ob_map_mma, "FOLD-STAT": ob_fold_stat,
    "FUSE-SUMS": ob_fuse_sums,
    "SPLIT-KV": lambda rec, b, a: ob_split_kv(rec, b, a, _finish),
    "SPLIT-K": lambda rec, b, a: ob_split_k(rec, b, a, _site, _finish),
    "MASK-DATA": ob_mask_data,
}


BACKWARD = {
    "recompute": lambda rec, b, a: ob_recompute(rec, b, a, _site, _finish),
    "softmax_rowterm": lambda rec, b, a: ob_rowterm(rec, b, a, _site, _finish),
}


def obligation_for(rec, before: Program, after: Program) -> Obligation:
    if rec.kind == "FUSE":
        gen = ob_unfuse if rec.rule == "unfuse" else ob_fuse
    elif rec.rule in BACKWARD:  # softmax_rowterm's kind is ASSOC
        gen = BACKWARD[rec.rule]
    else:
        gen = GENERATORS.get(rec.kind)
    if gen is None:
        raise ExportError(f"no obligation generator for {rec.kind}")
    # the program's interface is part of the frame: no rule changes it
    for what, b, a in (("sizes", before.sizes, after.sizes), ("inputs", before.inputs, after.inputs),
                       ("output", before.output, after.output)):
        if b != a:
            raise ExportError(f"the step changed the program's {what}, outside any rewrite site")
    ob = gen(rec, before, after)
    changed = {getattr(rec.parsed, "def_", None)} | set(rec.raw_facts.get("into", ()))
    if rec.kind == "FUSE" and rec.rule == "unfuse":
        changed.add(rec.parsed.name)
    if rec.kind == "FUSE-SUMS":  # the second sum is now the definition's further output
        changed.add(rec.parsed.with_)
    others, skipped = others_thm(rec, before, after, changed)
    if others is not None:
        ob.thms.append(others)
    ob.proof_modes = prove_directly(ob.thms)
    if skipped:
        note = (f"definitions {', '.join(skipped)} unchanged by IR equality, not exported "
                "(ring arithmetic on a max, which may be -inf)")
        ob.status = "partial"
        ob.unchecked = (ob.unchecked + "; " if ob.unchecked else "") + note
    return ob


# --------------------------------------------------------------------------- files


def write_obligations(derivation: Any, outdir: Path) -> list[Path]:
    """Write StepNN_<rule>.v / .lean and index.json into outdir; returns the paths written."""
    outdir = Path(outdir)
    d = derivation
    if not d.steps:  # nothing to prove: no proofs/ directory
        return []
    outdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    index: list[dict[str, Any]] = []
    for rec, before, after in zip(d.steps, d.programs, d.programs[1:]):
        stem = f"Step{rec.index:02d}_{rec.kind.replace('-', '_')}"
        vf, lf = outdir / f"{stem}.v", outdir / f"{stem}.lean"
        entry: dict[str, Any] = {"step": rec.index, "rule": rec.rule, "kind": rec.kind,
                                 "files": {"coq": vf.name, "lean": lf.name}}
        try:
            ob = obligation_for(rec, before, after)
        except Exception as exc:  # noqa: BLE001 - reported in the file and the index, never fatal
            reason = f"{type(exc).__name__}: {exc}"
            vf.write_text(_failed_text(rec.index, rec.rule, reason))
            lf.write_text(f"/- derivc: obligation for step {rec.index} not generated: {reason} -/\n")
            entry.update({"theorem": rec.theorem, "status": "not generated", "error": reason,
                          "trace": traceback.format_exc(limit=3)})
        else:
            vf.write_text(coq_text(ob))
            lf.write_text(lean_text(ob))
            entry.update({"theorem": ob.theorem, "status": ob.status, "checked": ob.checked,
                          "not_checked": ob.unchecked, "coq_theorems": [t.name for t in ob.thms],
                          "before": ob.before, "after": ob.after, "constants": ob.consts,
                          "proofs": ob.proof_modes})
        written += [vf, lf]
        index.append(entry)
    payload: dict[str, Any] = {"steps": index}
    safety = _write_safety(d, outdir)
    if safety is not None:
        entry, files = safety
        payload["safety"] = entry
        written += files
    ix = outdir / "index.json"
    ix.write_text(json.dumps(payload, indent=2) + "\n")
    written.append(ix)
    return written


def _write_safety(d: Any, outdir: Path) -> tuple[dict[str, Any], list[Path]] | None:
    """StepNN_SAFETY.v / .lean for the final program (NN the last step); None without exp sites."""
    last = d.steps[-1].index
    vf, lf = outdir / f"Step{last:02d}_SAFETY.v", outdir / f"Step{last:02d}_SAFETY.lean"
    try:
        ob = safety_obligation(last, d.programs[-1])
    except Exception as exc:  # noqa: BLE001 - reported in the file and the index, never fatal
        reason = f"{type(exc).__name__}: {exc}"
        vf.write_text(_failed_text(last, "safety", reason))
        lf.write_text(f"/- derivc: safety obligation not generated: {reason} -/\n")
        return ({"files": {"coq": vf.name, "lean": lf.name}, "status": "not generated",
                 "error": reason}, [vf, lf])
    if ob is None:
        return None
    if not ob.thms:  # every site not covered: nothing to check, the index says which
        return ({"files": {}, "status": ob.status, "coq_theorems": [], "not_checked": ob.unchecked}, [])
    vf.write_text(coq_text(ob))
    lf.write_text(lean_text(ob))
    return ({**safety_index(ob, vf.name, lf.name), "status": ob.status}, [vf, lf])
