"""SPLIT-KV's and SPLIT-K's per-step obligations (compiler/rules/split_kv.py, split_k.py).

SPLIT-K: what is stated and proved by coqc: the definition's sum as it was (over ceil(N / t)
tiles) equals the combine as written — the sum over the S splits of the partial tensor, the
partial tensor read as the tensor its new definition generates (genAt: its body inlined, each
split's sum over the tiles S·o + ks, o < ceil((N − t·ks) / (t·S))) — by theorem
sumTo_split_k_strided (sumTo_strided for an untiled sum).  A combine that drops a split, a
split's bound off by one or a wrong tile index fails coqc; the epilogue around the sum, the loop
nest, guard and store are the frame (unchanged), every other definition too.

SPLIT-KV:

What is stated and proved by coqc: the combine the step wrote — the definition's new body,
exported from the IR with the partial tensors (acc, m, l) quantified as arbitrary functions —
equals the quotient acc / l of the fold's merge of the S partial states, left to right
(`mergeN` of proofs_ci/coq/Rules/OnlineMerge.v), by theorem online_merge_global.  A combine
that drops or misplaces a rescale, reads the wrong split or the wrong max fails coqc.
The definition's loop nest, guard and store are unchanged (a frame proposition), and every
other definition too (`others`).
What is not instantiated per step (status partial): that each partial definition's fold over
its tiles S·jo + ks produces the partial state of its key tiles — the strided assignment of
tiles to splits is proved in general (theorem online_split_kv_strided: split k folding tiles
S·o + k, merged, is the softmax average over all tiles), not instantiated on the IR's folds per
step: validated numerically (every draw, including splits past the last tile and fully masked
splits).
"""
from __future__ import annotations

from .ir import Program, Reduce
from .obligations_base import (
    Obligation, Thm, _binders, _c, _def_hyps, _eq_thm, _exporter, _l, _lam_of, _ob, _thm_name,
)
from .obligations_frame import store_frame
from .obligations_terms import A, ExportError, Lam, N, V
from .obligations_types import EXT, FIN
from .printer import show_def


def ob_split_kv(rec, before: Program, after: Program, finish) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    part, part_m, part_l = f["partials"]
    S = int(f["splits"])
    d_before, d_after = before.def_named(p.def_), after.def_named(p.def_)
    ex = _exporter(before, after)
    ex.extra_tensors |= {part, part_m, part_l}
    ex.types.update({part: FIN, part_m: EXT, part_l: FIN})
    hyps = _def_hyps(ex, d_after)
    combine = ex.expr(d_after.body, {})
    if len(d_after.loops) < 1:
        raise ExportError("the combine has no loop")
    *row, last = [ex.idx_var(lp.var, {}) for lp in d_after.loops]
    for name, arity in ((part, len(row) + 2), (part_m, len(row) + 1), (part_l, len(row) + 1)):
        ex.tensors["t_" + name] = arity
    ex.result_ty["t_" + part_m] = EXT

    def t(name: str, *idx) -> tuple:
        return A("t_" + name, *row, *idx)

    k = V("k_")
    states = Lam(["k_"], A("mkOState", t(part_m, k), t(part_l, k), t(part, k, last)))
    merged = A("mergeN", states, N(S))
    quotient = A("div", A("st_acc", merged), A("st_l", merged))
    proof = ("intros.\n  rewrite online_merge_global.\n  cbn [st_acc st_l st_m].\n"
             "  derivc_congr.")
    lean = ("by\n  intros\n  rw [online_merge_global]\n  simp only [OState.st_acc, OState.st_l, OState.st_m]\n"
            "  derivc_congr")
    ob = _ob(rec, rec.theorem, status="partial", checked=(
        f"the combine of {p.def_} (its body as written, the partial tensors {part}, {part_m}, {part_l} "
        f"quantified) equals acc / l of the fold's left-to-right merge of the {S} partial states "
        "(online_merge_global); its loop nest, guard and store are unchanged"),
        unchecked=(f"that {part}'s fold over the tiles {S}*{p.index} + {p.split_index} yields each split's "
                   "partial state: validated numerically (every draw; empty and fully masked splits); "
                   "theorem online_split_kv_strided (not instantiated per step)"))
    ob.thms.append(Thm(_thm_name(rec), _binders(ex), hyps, ("eq", combine, quotient), proof, lean))
    ob.thms.append(store_frame(rec, before, after, p.def_))
    ob.before, ob.after = show_def(d_before), show_def(d_after)
    return finish(ob, ex)


def ob_split_k(rec, before: Program, after: Program, site_of, finish) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    site: Reduce = f["site"]
    part = after.def_named(f["partial"])
    ex, b, a, hyps = site_of(rec, before, after, p.def_, site, {part.name: part})
    num, div = site.ext.single()
    S = int(f["splits"])
    n = _c(ex.aff(num, {}))
    thm = rec.theorem  # the rule's choice: sumTo_strided for an untiled sum (div == 1)
    if div == 1:  # an untiled sum over [0, n): split ks adds the indices S·o + ks
        args = (str(S), f"({n})")
        args_l = args
    else:
        args = (f"({n})", str(div), str(S), str(div * S))
        args_l = (f"({_l(ex.aff(num, {}))})", str(div), str(S), str(div * S))
    inst = f"{thm} {' '.join(args)} ({_c(_lam_of(b))})"
    proof = f"intros.\n  etransitivity.\n  {{ apply ({inst}); lia. }}\n  derivc_congr."
    lean = (f"by\n  intros\n  refine Eq.trans ({thm} {' '.join(args_l)} ({_l(_lam_of(b))}) "
            f"{'(by omega) (by omega) ' * (div != 1)}(by omega)) ?_\n  derivc_congr")
    ob = _ob(rec, thm, checked=(
        f"{p.def_}'s sum over {site.ext} equals the combine's sum over the {S} splits of {part.name}, "
        f"{part.name} inlined (split {p.split_index} adds the tiles {S}*{site.var} + {p.split_index}); "
        "the epilogue, loop nest, guard and store are unchanged"))
    ob.thms.append(_eq_thm(_thm_name(rec), ex, b, a, hyps, proof, lean))
    ob.before, ob.after = _c(b), _c(a)
    return finish(ob, ex)
