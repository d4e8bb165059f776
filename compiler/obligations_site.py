"""The shared shape of a site obligation: a rewrite of one node of a definition's body, exported
before and after with the definition's and the path's hypotheses (`_site`), and the exporters'
frame theorems and notes gathered into the obligation (`_finish`)."""
from __future__ import annotations

from .ir import Def, Expr, Program
from .obligations_base import Obligation, _at_path, _def_hyps, _def_pair, _exporter, _find_path, _path_hyps
from .obligations_frame import site_frame
from .obligations_terms import ExportError, Exporter, Term


def _site(rec, before: Program, after: Program, def_name: str, site: Expr,
          inline_before: dict[str, Def] | None = None) -> tuple[Exporter, Term, Term, list[Term]]:
    """(exporter, before term, after term, hypotheses) for a rewrite of `site` in `def_name`.
    The exporter carries the step's frame theorem (obligations_frame.site_frame), added to the obligation by
    `_finish`."""
    bd, ad = _def_pair(before, after, def_name)
    path = _find_path(bd.body, site)
    if path is None:
        raise ExportError(f"the site of step {rec.index} is not in {def_name}'s body")
    ex = _exporter(before, after, inline_before)
    hyps = _def_hyps(ex, bd) + _path_hyps(ex, bd.body, path)
    b = ex.expr(site, {})
    a_node = _at_path(ad.body, path)
    a = ex.expr(a_node, {})
    ex.frame = site_frame(rec, before, after, def_name, site, path)
    return ex, b, a, hyps


def _finish(ob: Obligation, *exs: Exporter) -> Obligation:
    for ex in exs:
        frame = getattr(ex, "frame", None)
        if frame is not None and frame not in ob.thms:
            ob.thms.append(frame)
        ob.notes += [n for n in ex.notes if n not in ob.notes]
        ob.consts.update(ex.consts)
    if ob.notes and ob.status == "full":
        ob.status = "partial"
        ob.unchecked = (ob.unchecked + "; " if ob.unchecked else "") + "; ".join(ob.notes)
    return ob
