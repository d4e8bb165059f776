"""Direct proofs of `before = after` obligations: a congruence script printed from the two terms.

An equality obligation states a local rewrite: `before` and `after` are the same term except at
the rewritten sites.  `derivc_congr` (proofs_ci/coq/Tactics.v) finds that out by search over the
whole term (case splits on every closed guard first, every alternative tried at every node), and
`Qed` re-checks the large term it builds.  The exporter has both terms, so it prints the descent
instead: after `cbv beta zeta` (the goal's lets inlined, as the printer here inlines them), one
congruence lemma per node on the path to each difference (`f_equalN` for an application,
`sumTo_ext_eq` / `maxTo_ext_eq` / `mma16_ext` / `foldN_ext` under a binder, `sel_congr` for a
guard with its condition as a hypothesis), `reflexivity` on every side that is the same term, and
the search tactic only on the small differing subterms (`derivc_leaf`: the guard hypotheses made
readable by lia, then `derivc_congr`).

The statement is not touched.  A script that does not fit the goal fails coqc (no fallback at
check time); `direct_script` returns None only where the two terms differ at the root, and the
caller keeps the search tactic there.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import count
from .obligations_terms import A, Term, V

PROOF_SEARCH = "intros.\n  derivc_congr."  # the search proof this printer replaces

# heads whose function arguments are descended into with an extensionality lemma:
# head -> (lemma, explicit argument count, position of the function, binders of the function)
_BINDER_HEADS = {
    "sumTo": ("sumTo_ext_eq", 2, 1, 1),
    "maxTo": ("maxTo_ext_eq", 2, 1, 1),
    "mma16": ("mma16_ext", 1, 0, 1),
    "foldN": ("foldN_ext", 3, 0, 2),
}
# `refine` with the lemma's explicit arguments as holes: `apply` unifies the conclusion by the
# older algorithm, which took ~0.1 s a node on a row of 8192 columns
_REFINE = {"sumTo_ext_eq": 6, "maxTo_ext_eq": 6, "mma16_ext": 3, "foldN_ext": 9, "sel_congr": 7,
           "f_equal": 2, "f_equal2": 3, "f_equal3": 4, "f_equal4": 5, "f_equal5": 6}
# the congruence lemmas of the printed descent (and foldN_trunc_eq, which derivc_congr's search
# applies too): proof engineering for coqc's speed, not a rule's content — the Lean obligation
# keeps the congruence search (derivc_congr) in their place
DESCENT_LEMMAS = frozenset(_REFINE) | {"foldN_trunc_eq"}


def _use(lemma: str) -> str:
    return f"refine ({lemma}{' _' * _REFINE[lemma]})"

_MAX_FEQUAL = 5  # Coq's f_equal .. f_equal5


@dataclass(frozen=True)
class DirectProof:
    script: str  # the tactic proof of the theorem (starting with intros)
    leaves: int  # differing subterms left to derivc_leaf


# --------------------------------------------------------------------------- beta / zeta


class _Fresh:
    def __init__(self) -> None:
        self._n = count()

    def __call__(self, base: str) -> str:
        return f"{base}'{next(self._n)}"


def normalize(t: Term, env: dict[str, Term] | None = None, fresh: _Fresh | None = None) -> Term:
    """The beta-zeta normal form of t (what Coq's `cbv beta zeta` leaves), binders renamed apart."""
    return _norm(t, env or {}, fresh or _Fresh())


def _norm(t: Term, env: dict[str, Term], fresh: _Fresh) -> Term:
    k = t[0]
    if k == "var":
        return env.get(t[1], t)
    if k in ("num", "true"):
        return t
    if k == "nop":
        return ("nop", t[1], _norm(t[2], env, fresh), _norm(t[3], env, fresh))
    if k == "if":  # Coq's `if c then x else y` (library definitions; the exporter prints sel)
        return ("if", *(_norm(x, env, fresh) for x in t[1:]))
    if k == "let":
        return _norm(t[3], {**env, t[1]: _norm(t[2], env, fresh)}, fresh)
    if k == "lam":
        names = [fresh(n) for n in t[1]]
        inner = {**env, **{n: ("var", m) for n, m in zip(t[1], names)}}
        return ("lam", names, _norm(t[2], inner, fresh))
    if k == "app":
        args = [_norm(a, env, fresh) for a in t[2]]
        head = env.get(t[1])
        if head is None:
            return ("app", t[1], args)
        return _apply(head, args, fresh)
    raise ValueError(f"not a value term: {t[0]}")


def _apply(f: Term, args: list[Term], fresh: _Fresh) -> Term:
    if not args:
        return f
    if f[0] == "lam":
        n = min(len(f[1]), len(args))
        rest = f[1][n:]
        body = _norm(("lam", rest, f[2]) if rest else f[2], dict(zip(f[1], args[:n])), fresh)
        return _apply(body, args[n:], fresh)
    if f[0] == "var":
        return ("app", f[1], args)
    if f[0] == "app":
        return ("app", f[1], f[2] + args)
    raise ValueError(f"applying a {f[0]}")


def _key(t: Term, scope: tuple[str, ...] = ()) -> tuple:
    """t without binder names (de Bruijn): equal keys = the same Coq term."""
    k = t[0]
    if k == "var":
        return ("b", len(scope) - 1 - scope[::-1].index(t[1])) if t[1] in scope else t
    if k in ("num", "true"):
        return t
    if k == "nop":
        return ("nop", t[1], _key(t[2], scope), _key(t[3], scope))
    if k == "if":
        return ("if", *(_key(x, scope) for x in t[1:]))
    if k == "lam":
        return ("lam", len(t[1]), _key(t[2], scope + tuple(t[1])))
    if k == "app":
        h = ("b", len(scope) - 1 - scope[::-1].index(t[1])) if t[1] in scope else t[1]
        return ("app", h, tuple(_key(a, scope) for a in t[2]))
    raise ValueError(f"not a value term: {t[0]}")


# --------------------------------------------------------------------------- the script


def _rename(t: Term, old: list[str], new: list[str]) -> Term:
    return _norm(t, {o: ("var", n) for o, n in zip(old, new)}, _Fresh())


def _descend(b: Term, a: Term, leaves: list[int]) -> str:
    """A tactic proving the current goal `b = a` (both beta-zeta normal)."""
    if _key(b) == _key(a):
        return "reflexivity"
    if b[0] == "app" and a[0] == "app" and b[1] == a[1] and len(b[2]) == len(a[2]):
        binder = _BINDER_HEADS.get(b[1])
        if binder is not None:
            s = _under_binder(b, a, binder, leaves)
            if s is not None:
                return s
        elif b[1] == "sel" and len(b[2]) == 3 and _key(b[2][0]) == _key(a[2][0]):
            x, y = (_descend(p, q, leaves) for p, q in zip(b[2][1:], a[2][1:]))
            return f"{_use('sel_congr')}; intros ?; [ {x} | {y} ]"
        elif 1 <= len(b[2]) <= _MAX_FEQUAL:
            lemma = "f_equal" if len(b[2]) == 1 else f"f_equal{len(b[2])}"
            subs = [_descend(p, q, leaves) for p, q in zip(b[2], a[2])]
            return f"{_use(lemma)}; [ {' | '.join(subs)} ]" if len(subs) > 1 else f"{_use(lemma)}; {subs[0]}"
    leaves.append(1)
    return "derivc_leaf"


def _under_binder(b: Term, a: Term, binder: tuple[str, int, int, int], leaves: list[int]) -> str | None:
    lemma, nargs, fpos, nbound = binder
    if len(b[2]) != nargs:
        return None
    fb, fa = b[2][fpos], a[2][fpos]
    if not (fb[0] == "lam" == fa[0] and len(fb[1]) == nbound == len(fa[1])):
        return None
    body = _descend(fb[2], _rename(fa[2], fa[1], fb[1]), leaves)
    # a fold's step may be a library step function (onlineStepW) applied to its parameters
    red = "cbv beta zeta delta [onlineStepW]" if lemma == "foldN_ext" else "cbv beta"
    intro = "intros " + " ".join(["?"] * (nbound + 1)) + f"; {red}; "
    others = [_descend(p, q, leaves) for k, (p, q) in enumerate(zip(b[2], a[2])) if k != fpos]
    if lemma == "mma16_ext":
        return f"{_use(lemma)}; {intro}{body}"
    if lemma == "foldN_ext":  # foldN f s0 n: premises n = m, s0 = s1, then the step
        init, ext = others
        if _nat(ext) == "reflexivity":
            return f"{_use(lemma)}; [ reflexivity | {init} | {intro}{body} ]"
        # fewer iterations after (MASK): the dropped ones leave the online state unchanged
        return (f"refine (foldN_trunc_eq{' _' * 10}); [ derivc_kill_step | lia | {init} | {intro}{body} ]")
    return f"{_use(lemma)}; [ {_nat(others[0])} | {intro}{body} ]"


def _nat(script: str) -> str:
    """An extent premise n = m: the same term, or equal by index arithmetic."""
    return script if script == "reflexivity" else "derivc_leaf"


def direct_script(before: Term, after: Term) -> DirectProof | None:
    """The direct proof of `before = after` stated with intros-able hypotheses, or None where
    the two terms already differ at the root (nothing to descend: the search tactic stays)."""
    b, a = normalize(before), normalize(after)
    leaves: list[int] = []
    body = _descend(b, a, leaves)
    if body == "derivc_leaf":
        return None
    return DirectProof(f"intros. cbv beta zeta.\n  {body}.", len(leaves))


_SEARCH_WITH_FACTS = re.compile(r"intros\.((?: pose proof \([^\n]*?\)\.)*)\n  derivc_congr\.")


def prove_directly(thms: list) -> dict[str, str]:
    """Replace the search proof of each equality theorem (`intros. [pose proof (fact).]*
    derivc_congr.`) by its direct proof where one is printed; returns theorem name -> "direct" |
    "search" (the index's proof counts)."""
    modes: dict[str, str] = {}
    for t in thms:
        m = _SEARCH_WITH_FACTS.fullmatch(t.proof)
        if m is None or t.concl[0] != "eq":
            continue
        direct = direct_script(t.concl[1], t.concl[2])
        if direct is None:
            modes[t.name] = "search"
        else:
            t.proof = direct.script.replace("intros.", "intros." + m.group(1), 1)
            modes[t.name] = "direct"
    return modes


def _online_step(w: Term, v: Term, t: Term, mnext: Term, fresh: _Fresh) -> Term:
    """onlineStepW w v t mnext (proofs_ci/coq/Rules/OnlineAgg.v) as a function of (o, st)."""
    o, st = fresh("o"), fresh("st")
    m_old = A("st_m", V(st))
    m_new = _apply(mnext, [V(o), m_old], fresh)
    idx = lambda i: ("nop", "+", ("nop", "*", V(o), t), V(i))
    i1, i2 = fresh("i"), fresh("i")
    rescale = A("rescale", m_old, m_new)
    l = A("add", A("mul", A("st_l", V(st)), rescale),
          A("sumTo", t, ("lam", [i1], _apply(w, [idx(i1), m_new], fresh))))
    acc = A("add", A("mul", A("st_acc", V(st)), rescale),
            A("sumTo", t, ("lam", [i2], A("mul", _apply(w, [idx(i2), m_new], fresh),
                                                  _apply(v, [idx(i2)], fresh)))))
    return ("lam", [o, st], A("mkOState", m_new, l, acc))


def online_fold_script(g: Term, s: Term, v: Term, t: Term, mnext: Term, ext: Term, after: Term) -> str | None:
    """After `rewrite onlineFoldG_foldN`: the direct proof of
    div (st_acc F) (st_l F) = after, F = foldN (onlineStepW (fun j m => if g j then expd (Fin (s j)) m
    else zero) v t mnext) (mkOState ninf zero zero) ext (ONLINE-AGG's second half); None where the
    descent stops at the root."""
    fresh = _Fresh()
    g, s, v, t, mnext, ext = (normalize(x, fresh=fresh) for x in (g, s, v, t, mnext, ext))
    j, m = fresh("j"), fresh("m")
    w = ("lam", [j, m], ("if", _apply(g, [V(j)], fresh),
                         A("expd", A("Fin", _apply(s, [V(j)], fresh)), V(m)), A("zero")))
    fold = A("foldN", _online_step(w, v, t, mnext, fresh), A("mkOState", A("ninf"), A("zero"), A("zero")), ext)
    lhs = A("div", A("st_acc", fold), A("st_l", fold))
    leaves: list[int] = []
    body = _descend(lhs, normalize(after, fresh=fresh), leaves)
    return None if body == "derivc_leaf" else f"cbv beta zeta.\n    {body}"
