"""Safety obligations of the final program: every exp argument a - m is <= 0.

The exactness obligations (StepNN_<rule>.v) hold for ANY shift m: softmax and ONLINE-AGG are
exact whatever is subtracted, so a running max replaced by the constant 0 is still "exact" and
overflows fp32 (exp(s) for s > 88).  Here every exp(a - m) and every rescale(m, m') of the
final program's definitions is stated as `expd_safe a m` / `rescale_safe m m'`
(proofs_ci/coq/Algebra.v: the argument is <= 0 and defined, so exp of it is a value <= 1; a
plain exp of -inf - (-inf), NaN on the GPU, is never safe; rescale(-inf, -inf) = 1 is), with
everything around the site as in the program: the enclosing loops, reductions and select
conditions as hypotheses, the enclosing buffers and fold steps as `let`s, fold state from an
earlier step universally quantified (so a rescale must hold for ANY old running max: only a
running max that is max(old, ...) passes).  `derivc_safe` proves them from the order axioms
when m is a max over a set containing a; nothing else passes.

Written as proofs/StepNN_SAFETY.v / .lean, NN the last step (the program it is about is IR_NN).
"""
from __future__ import annotations

from typing import Any

from .ir import Bin, Def, Expr, Fold, Let, Program, Read, Reduce, Select, Un, children, walk
from .obligations_base import Obligation, Thm, _binders, _def_hyps
from .obligations_terms import A, Exporter, Term, V, san
from .obligations_types import EXT

THEOREM = "expd_safe_of_ele_ne"
COQ_PROOF = "derivc_safe."
LEAN_PROOF = "by\n  derivc_safe"


def is_exp_site(e: Expr) -> bool:
    """exp(a - m) or rescale(m, m') = exp(m - m')."""
    return (isinstance(e, Un) and e.op == "exp" and isinstance(e.a, Bin) and e.a.op == "-") or (
        isinstance(e, Bin) and e.op == "rescale")


def site_operands(e: Expr) -> tuple[Expr, Expr]:
    return (e.a.a, e.a.b) if isinstance(e, Un) else (e.a, e.b)


def exp_site_paths(e: Expr, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Child-index paths (ir.children order) of every exp site in e, pre-order."""
    out = [prefix] if is_exp_site(e) else []
    for k, c in enumerate(children(e)):
        out += exp_site_paths(c, prefix + (k,))
    return out


def _bind_index(ex: Exporter, var: str, ext, env: dict, hyps: list[Term]) -> dict:
    name, env2 = ex.bind_var(var, env)
    ex.nat_vars.setdefault(name, None)
    hyps.append(("lt", V(name), ex.ext(ext, env)))
    return env2


def _quantify_state(ex: Exporter, f: Fold, env: dict) -> dict:
    """Fold state inside a step: arbitrary values (the state any earlier step left)."""
    env2 = dict(env)
    for name, ty in zip(f.state, ex.state_types(f)):
        coq = "v_" + san(name)
        ex.bufs[coq] = 0
        ex.result_ty[coq] = ty
        ex.vty[coq] = ty
        env2[name] = ("buf", coq)
    return env2


def site_thm(prog: Program, d: Def, path: tuple[int, ...], name: str) -> Thm:
    """The safety theorem of the exp site at `path` in d's body."""
    ex = Exporter(prog)
    env: dict = {}
    hyps: list[Term] = _def_hyps(ex, d)
    for lp in d.loops:
        ex.idx_var(lp.var, {})
    lets: list[tuple[str, Term]] = []
    e: Expr = d.body
    for k in path:
        if isinstance(e, Let):
            if k == 0:
                for v, x in e.bind.dims:
                    env = _bind_index(ex, v, x, env, hyps)
            else:
                coq, val, env = ex.binding(e.bind, env)
                lets.append((coq, val))
        elif isinstance(e, Reduce):
            env = _bind_index(ex, e.var, e.ext, env, hyps)
        elif isinstance(e, Select) and k == 0:
            hyps += [ex.cond_prop(c, env) for c in e.conds]
        elif isinstance(e, Fold):
            ns, nb, nu = len(e.state), len(e.binds), len(e.update)
            if ns <= k < ns + nb + nu:  # inside a step
                env = _bind_index(ex, e.var, e.ext, env, hyps)
                env = _quantify_state(ex, e, env)
                for b in e.binds[: min(k - ns, nb)]:
                    coq, val, env = ex.binding(b, env)
                    lets.append((coq, val))
                if k < ns + nb:
                    for v, x in e.binds[k - ns].dims:
                        env = _bind_index(ex, v, x, env, hyps)
            elif k >= ns + nb + nu:  # the result: the state after the last step
                fold_t, _ = ex.fold(Fold(e.var, e.ext, e.state, e.init, e.binds, e.update,
                                         e.result), env)
                # ex.fold returns let fs := foldN .. in let <state> := proj fs in result:
                # keep its lets, drop its result
                t = fold_t
                while t[0] == "let":
                    lets.append((t[1], t[2]))
                    t = t[3]
                env = dict(env)
                for state in e.state:
                    env[state] = ("buf", "v_" + san(state))
        e = children(e)[k]
    a, m = site_operands(e)
    pred = "rescale_safe" if isinstance(e, Bin) else "expd_safe"
    concl: Term = A(pred, ex.lift(*ex.texpr(a, env), EXT), ex.lift(*ex.texpr(m, env), EXT))
    for coq, val in reversed(lets):
        concl = ("let", coq, val, concl)
    return Thm(name, _binders(ex), hyps, concl, COQ_PROOF, LEAN_PROOF)


def shift_reads_definition(prog: Program, site: Expr) -> bool:
    """The shift is read from another definition (a row max M computed by its own kernel)."""
    defs = {d.name for d in prog.defs}
    return any(isinstance(x, Read) and x.tensor in defs for x in walk(site_operands(site)[1]))


def safety_obligation(step: int, prog: Program) -> Obligation | None:
    """The safety obligation of the final program (None when it has no exp site).  Sites whose
    shift is read from another definition are listed as not checked: the statement would read
    that definition as an arbitrary tensor (its being a max is that definition's, not this
    site's), and the programs that have them (several kernels, M in global memory) are not
    lowered to one kernel."""
    from .printer import show_expr

    thms: list[Thm] = []
    sites: list[str] = []
    skipped: list[str] = []
    for d in prog.defs:
        for k, path in enumerate(exp_site_paths(d.body)):
            e = d.body
            for i in path:
                e = children(e)[i]
            if shift_reads_definition(prog, e):
                skipped.append(f"{d.name}: {show_expr(e)}")
                continue
            thms.append(site_thm(prog, d, path, f"safety_{d.name}_{k + 1}"))
            sites.append(f"{d.name}: {show_expr(e)}")
    if not thms and not skipped:
        return None
    return Obligation(
        step, "safety", "SAFETY", THEOREM, thms=thms, status="partial" if skipped else "full",
        checked="every exp argument of the final program is <= 0 (exp(a - m) with m a max over "
                "a set containing a, and rescale(m, m') with m' = max(m, ..)): " + "; ".join(sites),
        unchecked=("shift read from another definition: " + "; ".join(skipped)) if skipped else "",
        before="", after="")


def safety_index(ob: Obligation, coq_name: str, lean_name: str) -> dict[str, Any]:
    return {"files": {"coq": coq_name, "lean": lean_name}, "theorem": ob.theorem,
            "coq_theorems": [t.name for t in ob.thms], "checked": ob.checked,
            "not_checked": ob.unchecked}
