"""Obligations of MASK-DATA (compiler/rules/skip_data_span.py) and the Coq / Lean form of its
conjunct, a data-derived key-tile span (compiler.ir_index.DataSpan).

The span exports as `spanLo h nk size <= tile < spanHi h nk size` (spanHas unfolded; proofs_ci/coq/Rules/MaskData.v) with

    h = spanHit Z.leb (fun r_ => query r_) (fun r_ => valid r_) R (fun p_ => key p_)

(MaskData.v: h p holds where key p lies between the least and greatest value of the valid rows;
`valid r_`: the query read's row-dependent indices inside their dimensions; the block's indices
are inside theirs at every point the span is used), the interpreters' definition.  The reads sit
in lambdas with no comparison of their own, so the obligations' case splits never enter them.

The step's obligation is the cover: at every point of the definition (its loop bounds and store
guard), every key column c < size at a key position inside its tensor, the comparison
`query == key` implies `tile in span` (span_cover_at, witnesses named: the row itself and the key
position size*tile + c).  That is the whole content of the rewrite (each contribution's guard gains
a conjunct its own comparison implies); lifting it through the fold's guards is not checked by
coqc here (status partial, said so in the obligation)."""
from __future__ import annotations

from .ir import SPAN_KEY, Aff, Cond, DataCond, DataSpan, Program
from .obligations_base import Obligation, Thm, _binders, _c, _def_hyps, _def_pair, _exporter, _l, _ob, _thm_name
from .obligations_site import _finish
from .obligations_terms import A, ExportError, Lam, N, V
from .rules.skip_data_span import COLUMN


def span_ends(ex, c: DataSpan, env: dict):
    """The span's ends (spanLo, spanHi of MaskData.v) as terms."""
    if len(c.rows) != 1:
        raise ExportError(f"a data span over {len(c.rows)} row variables has no Coq form (one row variable only)")
    (rv, n), = c.rows
    renv = {**env, rv: ("idx", V("r_")), SPAN_KEY: ("idx", V("p_"))}
    # the row's validity: the query read's indices that move with the row (the others are the
    # block's, inside their dimensions wherever the span is used: the definition's loop bounds)
    moving = tuple(Cond(a, "<", dim) for a, dim in zip(c.query.idx, c.query.dims) if rv in a.names())
    valid = ex.conds_bool(moving, renv) if moving else V("true")
    q, k = Lam(["r_"], ex.data_side(c.query, renv)), Lam(["p_"], ex.data_side(c.key, renv))
    h = A("spanHit", A("zleb"), q, Lam(["r_"], valid), N(n), k)
    return A("spanLo", h, ex.aff(c.key_dim, env), N(c.size)), A("spanHi", h, ex.aff(c.key_dim, env), N(c.size))


def span_bool(ex, c: DataSpan, env: dict):
    """The span conjunct as a boolean term: spanLo <= tile < spanHi, two index comparisons (the
    obligations' case splits and lia take the ends as atoms); spanHas unfolded."""
    lo, hi = span_ends(ex, c, env)
    t = ex.aff(c.tile, env)
    return A("andb", A("leb", lo, t), A("ltb", t, hi))


def span_prop(ex, c: DataSpan, env: dict):
    """The span conjunct as a proposition (a hypothesis lia reads)."""
    lo, hi = span_ends(ex, c, env)
    t = ex.aff(c.tile, env)
    return ("conj", [("le", lo, t), ("lt", t, hi)])


def ob_mask_data(rec, before: Program, after: Program) -> Obligation:
    p, f = rec.parsed, rec.raw_facts
    span: DataSpan = f["span"]
    cond: DataCond = f["cond"]
    bd, _ = _def_pair(before, after, p.def_)
    ex = _exporter(before, after)
    hyps = _def_hyps(ex, bd)
    column = Aff.of(COLUMN)
    hyps.append(("lt", ex.aff(column, {}), N(span.size)))
    key = cond.rhs if COLUMN in cond.rhs.names() else cond.lhs
    hyps += [ex.cond_prop(Cond(a, "<", dim), {}) for a, dim in zip(key.idx, key.dims)]
    hyps.append(ex.cond_prop(cond, {}))
    concl = ("eq", span_bool(ex, span, {}), V("true"))  # spanHas, unfolded
    pos = _c(ex.aff(span.tile.scale(span.size) + column, {}))
    row = _c(ex.aff(Aff.of(f["row"]), {}))
    # the reads compared in the guard and in the span are one atom for lia once their indices are
    # equated (derivc_zunify); the validity of the row is its loop and store bounds
    side = "cbv beta; apply andb_true_intro; split; [ first [ reflexivity | repeat (apply andb_true_intro; split); apply Nat.ltb_lt; lia ] |" \
           " derivc_zhyps; apply Z.leb_le; derivc_zunify; lia ]"
    proof = (f"intros.\n  apply (span_cover_at _ _ _ _ ({pos})); [ lia | lia | lia | ].\n"
             f"  unfold spanHit; cbv beta; apply andb_true_intro; split; apply (anyBelow_intro _ _ ({row})); try lia.\n"
             f"  - {side}.\n  - {side}.")
    pos_l, row_l = _l(ex.aff(span.tile.scale(span.size) + column, {})), _l(ex.aff(Aff.of(f["row"]), {}))
    lean = (f"by\n  intros\n  refine span_cover_at _ _ _ _ ({pos_l}) (by omega) (by omega) (by omega) ?_\n"
            f"  simp only [spanHit, Bool.and_eq_true]\n"
            f"  refine ⟨anyBelow_intro _ _ ({row_l}) (by omega) ?_, anyBelow_intro _ _ ({row_l}) (by omega) ?_⟩\n"
            f"  all_goals simp_all [zleb, zeqb] <;> omega")
    ob = _ob(rec, "span_cover", status="partial", checked=(
        f"the added conjunct is implied: wherever {f['comparison']} holds at a row of the definition (its "
        f"loop bounds and store guard) and a key column < {span.size} inside the key tensor, the key tile lies in "
        "the span derived from the data (span_cover_at)"),
        unchecked=("each contribution's guard of the fold gains that conjunct: the whole-definition equality "
                   "follows by congruence and is not restated here; the printers' skip of the tiles outside "
                   "the span is foldN_skip_span (no per-step obligation)"))
    ob.thms.append(Thm(_thm_name(rec, "_cover"), _binders(ex), hyps, concl, proof, lean))
    ob.before, ob.after = str(cond), str(span)
    return _finish(ob, ex)
