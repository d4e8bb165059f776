"""The frame of a step's obligation: what the step does NOT rewrite is unchanged.

A local rewrite's obligation proves its site; the frame theorems prove, by congruence, that
the rewritten definition's loop nest, store guard, store index and body around the site are
the same before and after, and that every other definition is unchanged.  A step that changes
anything outside its site therefore fails in Coq."""
from __future__ import annotations

from .ir import Aff, Def, Expr, Fold, Let, Program, Read, Reduce, Softmax, children
from .obligations_base import LEAN_PROPS, Thm, _at_path, _binders, _def_pair, _exporter, _thm_name
from .obligations_terms import ExportError, Exporter, Term, V, conj, san
from .obligations_types import expr_type, program_types

_HOLE = "site__"


def _path_vars(root: Expr, path: list[int]) -> list[str]:
    """The index variables bound on the path from root to the node at `path`."""
    out: list[str] = []
    e = root
    for k in path:
        if isinstance(e, (Reduce, Softmax)):
            out.append(e.var)
        elif isinstance(e, Let) and k == 0:
            out += [v for v, _ in e.bind.dims]
        elif isinstance(e, Fold):
            ns, nb = len(e.state), len(e.binds)
            if ns <= k < ns + nb + ns:
                out.append(e.var)
            if ns <= k < ns + nb:
                out += [v for v, _ in e.binds[k - ns].dims]
        e = children(e)[k]
    return list(dict.fromkeys(out))


def site_frame(rec, before: Program, after: Program, def_name: str, site: Expr,
           path: list[int]) -> Thm:
    """The frame of a local rewrite: the definition's loop nest, store guard and store index
    are unchanged, and its body with the site replaced by an arbitrary function of the
    enclosing indices (`site__`) is the same before and after (proved by congruence).  With
    the site theorem this covers the whole definition: a step that changes anything outside
    its site fails here."""
    from .rules.base import replace_node

    bd, ad = _def_pair(before, after, def_name)
    if [(x.var, x.ext) for x in bd.loops] != [(x.var, x.ext) for x in ad.loops]:
        raise ExportError(f"the loop nest of {def_name} changed outside the rewritten site")
    ex = _exporter(before, after)
    ex.types[_HOLE] = expr_type(site, program_types(before, after))
    hole = Read(_HOLE, tuple(Aff.of(v) for v in _path_vars(bd.body, path)))
    cb = ex.expr(replace_node(bd.body, site, hole), {})
    ca = ex.expr(replace_node(ad.body, _at_path(ad.body, path), hole), {})
    hyps = [("lt", ex.idx_var(lp.var, {}), ex.ext(lp.ext, {})) for lp in bd.loops]
    parts: list[Term] = []
    if bd.guard or ad.guard:
        parts.append(("iff", conj([ex.cond_prop(c, {}) for c in bd.guard]),
                      conj([ex.cond_prop(c, {}) for c in ad.guard])))
    if len(bd.store) != len(ad.store):
        raise ExportError(f"the store index of {def_name} changed rank")
    parts += [("eq", ex.aff(x, {}), ex.aff(y, {})) for x, y in zip(bd.store, ad.store)]
    parts.append(("eq", cb, ca))
    proof = ("intros. repeat split;\n  first [ lia | intros; derivc_destruct_conj; repeat split; lia "
             "| derivc_congr ].")
    return Thm(_thm_name(rec, "_frame"), _binders(ex), hyps, conj(parts), proof, LEAN_PROPS)


def _def_frame(ex: Exporter, bd: Def, ad: Def, body: bool = True) -> Term:
    """forall loop indices, bounds -> (guard iff) and (store equal) [and body equal]."""
    if [(x.var, x.ext) for x in bd.loops] != [(x.var, x.ext) for x in ad.loops]:
        raise ExportError(f"the loop nest of {bd.name} changed")
    if len(bd.store) != len(ad.store):
        raise ExportError(f"the store index of {bd.name} changed rank")
    env = {lp.var: ("idx", V("i_" + san(lp.var))) for lp in bd.loops}
    parts: list[Term] = []
    if bd.guard or ad.guard:
        parts.append(("iff", conj([ex.cond_prop(c, env) for c in bd.guard]),
                      conj([ex.cond_prop(c, env) for c in ad.guard])))
    parts += [("eq", ex.aff(x, env), ex.aff(y, env)) for x, y in zip(bd.store, ad.store)]
    if body:
        parts.append(("eq", ex.expr(bd.body, env), ex.expr(ad.body, env)))
    bounds = [("lt", V("i_" + san(lp.var)), ex.ext(lp.ext, env)) for lp in bd.loops]
    inner = conj(parts)
    if bounds:
        inner = ("imp", bounds, inner)
    bs = [("i_" + san(lp.var), "nat") for lp in bd.loops]
    return ("forall", bs, inner) if bs else inner


_FRAME_PROOF = ("intros. repeat split;\n  first [ lia | intros; derivc_destruct_conj; repeat split; lia "
                "| intros; derivc_congr ].")


def others_thm(rec, before: Program, after: Program, changed: set[str]) -> tuple[Thm | None, list[str]]:
    """Every definition the step does not rewrite is the same before and after; and the
    definitions left out of the theorem: identical in the IR before and after, but with no
    term of the algebra (a further output LSE = M + log(...) adds a max, which may be -inf)."""
    ex = _exporter(before, after)
    after_names = {d.name for d in after.defs}
    parts, skipped = [], []
    for d in before.defs:
        if d.name not in after_names or d.name in changed:
            continue
        ad = after.def_named(d.name)
        try:
            parts.append(_def_frame(ex, d, ad))
        except ExportError:
            if d != ad:
                raise
            skipped.append(d.name)
    if not parts:
        return None, skipped
    return Thm(_thm_name(rec, "_others"), _binders(ex), [], conj(parts), _FRAME_PROOF, LEAN_PROPS), skipped


def store_frame(rec, before: Program, after: Program, name: str, suffix: str = "_frame") -> Thm:
    """For obligations over a whole body: the loop nest, store guard and index are unchanged."""
    ex = _exporter(before, after)
    bd, ad = _def_pair(before, after, name)
    stmt = _def_frame(ex, bd, ad, body=False)
    return Thm(_thm_name(rec, suffix), _binders(ex), [], stmt, _FRAME_PROOF, LEAN_PROPS)
