"""Shared parts of the per-step obligation exporter (compiler/obligations.py): the theorem and
obligation records, path / binder helpers, and the Coq / Lean file texts."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .ir import Def, Expr, Fold, Let, Program, Reduce, Select, Softmax, children
from .obligations_terms import A, ExportError, Exporter, Lam, N, Term, V, render

# Keyed unification: `rewrite` compares only subterms with the lemma's head constant; without it,
# every subterm is tried up to conversion, which unfolds a fixed-extent sumTo / maxTo step by
# step (an 8192-column softmax obligation took minutes in one `rewrite (gen_inline ..)`).
COQ_HEADER = """From Coq Require Import Arith Lia Bool Ring ZArith.
Require Import Derivc.All.
Set Keyed Unification.
"""


@dataclass
class Thm:
    name: str
    binders: list[tuple[str, Any]]  # (name, 'nat' | arity)
    hyps: list[Term]
    concl: Term
    proof: str
    lean_proof: str = "by\n  intros\n  derivc_congr"  # mirrors `proof` (Lean not checked here)


@dataclass
class Obligation:
    step: int
    rule: str
    kind: str
    theorem: str
    thms: list[Thm] = field(default_factory=list)
    status: str = "full"  # full | partial | not generated
    checked: str = ""
    unchecked: str = ""
    before: str = ""
    after: str = ""
    notes: list[str] = field(default_factory=list)
    consts: dict[str, str] = field(default_factory=dict)
    uses_log: bool = False  # the proof uses the class KAlgLog (RECOMPUTE), whatever the statement says
    proof_modes: dict[str, str] = field(default_factory=dict)  # equality theorem -> direct | search


# --------------------------------------------------------------------------- helpers


def _find_path(e: Expr, target: Expr) -> list[int] | None:
    if e is target:
        return []
    for k, c in enumerate(children(e)):
        p = _find_path(c, target)
        if p is not None:
            return [k] + p
    return None


def _at_path(e: Expr, path: list[int]) -> Expr:
    for k in path:
        e = children(e)[k]
    return e


def _path_hyps(ex: Exporter, root: Expr, path: list[int]) -> list[Term]:
    """Bounds of the binders enclosing the node at `path`, and enclosing select conditions."""
    hyps: list[Term] = []
    e = root
    for k in path:
        if isinstance(e, (Reduce, Softmax)):
            hyps.append(("lt", ex.idx_var(e.var, {}), ex.ext(e.ext, {})))
        elif isinstance(e, Select) and k == 0:
            hyps += [ex.cond_prop(c, {}) for c in e.conds]
        elif isinstance(e, Let) and k == 0:
            hyps += [("lt", ex.idx_var(v, {}), ex.ext(x, {})) for v, x in e.bind.dims]
        elif isinstance(e, Fold):
            ns = len(e.state)
            nb = len(e.binds)
            if ns <= k < ns + nb + ns:
                hyps.append(("lt", ex.idx_var(e.var, {}), ex.ext(e.ext, {})))
            if ns <= k < ns + nb:
                hyps += [("lt", ex.idx_var(v, {}), ex.ext(x, {})) for v, x in e.binds[k - ns].dims]
        e = children(e)[k]
    return hyps


def _def_hyps(ex: Exporter, d: Def, env: dict | None = None) -> list[Term]:
    env = env or {}
    hyps = [("lt", ex.idx_var(lp.var, env), ex.ext(lp.ext, env)) for lp in d.loops]
    hyps += [ex.cond_prop(c, env) for c in d.guard]
    return hyps


def _binders(ex: Exporter, exclude: set[str] = frozenset()) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [(n, "nat") for n in ex.nat_vars if n not in exclude]
    out += [(n, ex.arity_type(n, a)) for n, a in sorted(ex.tensors.items())]
    out += [(n, ex.arity_type(n, a)) for n, a in sorted(ex.bufs.items())]
    out += [(n, 0) for n in ex.consts]
    out += sorted(ex.funs.items())
    return out


def _def_pair(before: Program, after: Program, name: str) -> tuple[Def, Def]:
    return before.def_named(name), after.def_named(name)


def _exporter(before: Program, after: Program, inline: dict[str, Def] | None = None) -> Exporter:
    ex = Exporter(after, inline=dict(inline or {}), other=before)
    ex.extra_tensors = {n for n, _ in before.inputs} | {d.name for d in before.defs}
    return ex


def _lam_of(t: Term) -> Term:
    """The function argument of sumTo/maxTo n f."""
    assert t[0] == "app" and t[1] in ("sumTo", "maxTo"), t
    return t[2][1]


def online_parts(ex: Exporter, outer, inner, conds, score: Expr, m_read: Expr) -> tuple[Term, ...]:
    """The terms of a tiled, guarded softmax sum that ONLINE-AGG's theorems take: the guard G
    and score S as functions of the key index, the shift M, the tile count E and the tile T."""
    envf = {inner.var: ("idx", V("j_")), outer.var: ("idx", N(0))}
    g = Lam(["j_"], ex.conds_bool(conds, envf) if conds else A("true"))
    s = Lam(["j_"], ex.expr(score, envf))
    return g, s, ex.expr(m_read, {}), ex.ext(outer.ext, {}), ex.ext(inner.ext, {})


def running_max_lam(ex: Exporter, fold: Fold, m_new: str) -> Term:
    """The fold's own running-max update as a function of (tile index, old max): the bindings
    before `m_new` as lets around its value (ONLINE-AGG's obligations rewrite with it)."""
    env = {fold.var: ("idx", V("i_" + fold.var)), fold.state[0]: ("buf", "v_" + fold.state[0])}
    ex.vty["v_" + fold.state[0]] = "X"
    lets, mval = [], None
    for bnd in fold.binds:
        if bnd.name == m_new:
            mval = ex.expr(bnd.value, env)
            break
        coq, val, env = ex.binding(bnd, env)
        lets.append((coq, val))
    if mval is None:
        raise ExportError("no running-max binding in the fold")
    for coq, val in reversed(lets):
        mval = ("let", coq, val, mval)
    ex.nat_vars.pop("i_" + fold.var, None)
    return Lam(["i_" + fold.var, "v_" + fold.state[0]], mval)


def _c(t: Term) -> str:
    return render(t, "coq")




def _eq_thm(name: str, ex: Exporter, b: Term, a: Term, hyps: list[Term], proof: str,
            lean: str = "by\n  intros\n  derivc_congr") -> Thm:
    return Thm(name, _binders(ex), hyps, ("eq", b, a), proof, lean)


def _l(t: Term) -> str:
    return render(t, "lean")


# the Lean mirror of the Coq frame / proposition scripts
LEAN_PROPS = ("by\n  intros\n  repeat' (first | apply And.intro | apply Iff.intro)\n"
              "  all_goals first | trivial | omega\n"
              "    | (intros; repeat' (first | apply And.intro); all_goals omega)\n"
              "    | (intros; derivc_congr)")


def _ob(rec, theorem: str, **kw) -> Obligation:
    return Obligation(rec.index, rec.rule, rec.kind, theorem, **kw)


def _thm_name(rec, suffix: str = "") -> str:
    return f"step{rec.index:02d}_{rec.kind.replace('-', '_')}{suffix}"


# --------------------------------------------------------------------------- files


def _statement(t: Thm, lang: str) -> str:
    body = ("imp", t.hyps, t.concl) if t.hyps else t.concl
    return render(("forall", t.binders, body), lang)


def uses_log(ob: Obligation) -> bool:
    """Whether a statement applies log: the algebra's log is the class KAlgLog (its laws have no
    model without axioms, proofs_ci/README.md), declared only by the obligations that need it."""
    return ob.uses_log or any(re.search(r"(?<![\w.])log(?![\w'])", _statement(t, "coq")) for t in ob.thms)


def coq_text(ob: Obligation) -> str:
    sec = f"Step{ob.step:02d}"
    out = [f"(* derivc obligation: step {ob.step}, rule {ob.rule} ({ob.kind}), theorem {ob.theorem}.",
           f"   status: {ob.status}",
           f"   checked: {ob.checked}"]
    if ob.unchecked:
        out.append(f"   NOT checked: {ob.unchecked}")
    if ob.consts:
        out.append("   constants: " + ", ".join(f"{k} = {v}" for k, v in ob.consts.items()))
    out.append("   before/after terms are exported from IR_{k-1} / IR_k; see index.json. *)")
    out.append(COQ_HEADER)
    log = " {KL : KAlgLog R}" if uses_log(ob) else ""
    out.append(f"Section {sec}.\nContext {{R : Type}} {{KA : KAlg R}}{log}.\n"
               f"Add Ring derivc_ring : (@kalg_ring R KA).\n")
    for t in ob.thms:
        out.append(f"Theorem {t.name} :\n  {_statement(t, 'coq')}.\nProof.\n  {t.proof}\nQed.\n")
    out.append(f"End {sec}.\n")
    return "\n".join(out)


def lean_text(ob: Obligation) -> str:
    out = [f"/- derivc obligation: step {ob.step}, rule {ob.rule} ({ob.kind}), theorem {ob.theorem}.",
           f"   status: {ob.status} (Coq); the Lean statements and proofs mirror StepNN.v tactic",
           "   by tactic (lean/Derivc/Tactics.lean) and have NOT been checked in this environment",
           "   (no Lean toolchain): Lean is \"not checked\" until `lake env lean` runs on this file.",
           f"   checked (Coq): {ob.checked} -/",
           "import Derivc", "", "namespace Derivc", "open Derivc", "",
           "variable {R : Type} [KAlg R]" + (" [KAlgLog R]" if uses_log(ob) else ""), ""]
    for t in ob.thms:
        out.append(f"theorem {t.name} :\n    {_statement(t, 'lean')} := {t.lean_proof}\n")
    out.append("end Derivc\n")
    return "\n".join(out)


def _failed_text(step: int, rule: str, reason: str) -> str:
    return (f"(* derivc obligation for step {step} ({rule}) could NOT be generated:\n   "
            f"{reason.replace('*)', '* )')}\n   This file fails coqc on purpose. *)\n"
            "Fail_obligation_not_generated.\n")
