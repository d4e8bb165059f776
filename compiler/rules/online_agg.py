"""ONLINE-AGG (F3): a softmax-weighted sum over key tiles becomes one streaming fold.

Before (after SPLIT-SOFTMAX, FUSE, ASSOC and TILE of the two sums with the same tile T):

    def L[i] = sum(jo < E: sum(ji < T: [g] ? exp(s[jo, ji] - M[i]) : 0))
    def O[i, d] = sum(jo < E: sum(ji < T: [g] ? exp(s[jo, ji] - M[i]) * v[jo, ji, d] : 0)) / L[i]

After (M and L are no longer read and are removed):

    def O[i, d] = fold(jo < E) state (m = -inf, l = 0, acc = 0):
                    let S_t[c < T] @register = [g(ji := c)] ? s[jo, c] : -inf
                    let m_new @register = max(m, max(ji_max < T: S_t[ji_max]))
                    let P_t[c < T] @register = [g(ji := c)] ? exp(S_t[c] - m_new) : 0
                    m   := m_new
                    l   := l * rescale(m, m_new) + sum(ji_sum < T: P_t[ji_sum])
                    acc := acc * rescale(m, m_new) + sum(ji < T: [g] ? P_t[ji] * v[jo, ji, d] : 0)
                  result acc / l

rescale(a, b) = exp(a − b).  Exact for ANY sequence of running values m (the invariant is
l = e^{−m}·Σ e^{s}, acc = e^{−m}·Σ e^{s}·v), so M's definition does not matter; the true running
max only keeps exp from overflowing.  Preconditions: O's body is that quotient; L is a
definition whose sum has the same tiling, guard and score as O's (up to renaming) and
subtracts the same M; refused otherwise (a reduction that is not softmax-shaped).
Theorem: online_agg (lean/Derivc/Rules/OnlineAgg.lean, proofs_ci/coq).

Without the V product (row softmax in one streaming pass): when the definition is one element
of a softmax, `def Y[r, c] = exp(a - M[r]) / L[r]` with L the same tiled sum of exp(s - M[r]),
the fold carries only (m, l) and its result is the element itself:

    def Y[r, c] = fold(co < E) state (m = -inf, l = 0):
                    let S_t[c2 < T] @register = [g(ci := c2)] ? s[co, c2] : -inf
                    let m_new @register = max(m, max(ci_max < T: S_t[ci_max]))
                    let P_t[c2 < T] @register = [g(ci := c2)] ? exp(S_t[c2] - m_new) : 0
                    m := m_new
                    l := l * rescale(m, m_new) + sum(ci_sum < T: P_t[ci_sum])
                  result exp(a - m) / l

`index` names L's outer tile index.  Exact for any running m (l = e^{−m}·Σ e^{s}) once the row
has a live key.  Theorem: online_softmax (same files).
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import (
    Aff, Bin, Binding, Const, Expr, Fold, Program, Read, Reduce, Select, Un, free_indices, fresh,
    names_in_program, subst_index, tensors_read,
)
from . import register
from .base import Facts, Rule, StepParams, alpha_equal, drop_def


class OnlineAggParams(StepParams):
    def_: str = Field(alias="def")
    """the definition Σ e^(s−M)·v / L (or one softmax element) to stream"""
    index: str
    """the outer key-tile index the fold runs over (e.g. jo)"""
    names: tuple[str, str, str] = ("m", "l", "acc")
    """base names of the fold's running max, sum and accumulator"""
    name_bases = ("names",)


def _fold_names(state: tuple[str, ...], bases: tuple[str, ...], ji: str, taken: set[str]) -> dict[str, str]:
    """Fresh names of the fold's state (from the step's `names`) and of its per-tile bindings."""
    out: dict[str, str] = {}
    for key, base in list(zip(state, bases)) + [("m_new", "m_new"), ("S_t", "S_t"), ("P_t", "P_t"), ("c", "c"),
                                                 ("j_max", ji + "_max"), ("j_sum", ji + "_sum")]:
        out[key] = fresh(base, taken)
        taken.add(out[key])
    return out


def _tiled_sum(e: Expr):
    """sum(jo: sum(ji: [g] ? body : 0)) → (jo, E, ji, T, g, body) or None."""
    if not (isinstance(e, Reduce) and e.op == "sum" and isinstance(e.body, Reduce) and e.body.op == "sum"):
        return None
    inner = e.body
    body, conds = inner.body, ()
    if isinstance(body, Select) and body.other == Const(0.0):
        body, conds = body.then, body.conds
    return e.var, e.ext, inner.var, inner.ext, conds, body


def _exp_minus(e: Expr):
    """exp(s - X[row]) → (s, X read) or None."""
    if isinstance(e, Un) and e.op == "exp" and isinstance(e.a, Bin) and e.a.op == "-" and isinstance(e.a.b, Read):
        return e.a.a, e.a.b
    return None


class OnlineAgg(Rule):
    name = "online_agg"
    kind = "ONLINE-AGG"
    theorem = "online_agg"
    also = ("online_softmax",)
    Params = OnlineAggParams

    def check(self, prog: Program, p: OnlineAggParams) -> Facts:
        d = self.get_def(prog, p.def_)
        shape = "expected sum(jo: sum(ji: [g] ? exp(s - M[..]) * v : 0)) / L[..]"
        if not (isinstance(d.body, Bin) and d.body.op == "/" and isinstance(d.body.b, Read)):
            raise self.fail(f"{p.def_} is not softmax-shaped: {shape} (or exp(a - M[..]) / L[..])")
        num, l_read = d.body.a, d.body.b
        if _exp_minus(num) is not None and prog.has_def(l_read.tensor):
            return self.check_plain(prog, p, d, num, l_read)
        self.require_index(d, p.index, "index")
        parts = _tiled_sum(num)
        if parts is None or parts[0] != p.index:
            raise self.fail(f"the numerator of {p.def_} is not a tiled sum over {p.index}: {shape}")
        jo, ext, ji, t_ext, conds, body = parts
        if not (isinstance(body, Bin) and body.op == "*" and _exp_minus(body.a)):
            raise self.fail(f"the summand of {p.def_} is not exp(s - M) * v: {shape}")
        score, m_read = _exp_minus(body.a)
        value = body.b
        moving = {jo, ji} & set().union(*(a.names() for a in m_read.idx))
        if moving:
            raise self.fail(
                f"the subtracted {m_read.tensor}[{', '.join(map(str, m_read.idx))}] depends on the summed "
                f"{sorted(moving)}; softmax-shaped means one shift per row"
            )
        if not prog.has_def(l_read.tensor):
            raise self.fail(f"the denominator {l_read.tensor} is not a definition")
        l_def, l_body = self.denominator_at(prog, l_read)
        lparts = _tiled_sum(l_body)
        if lparts is None:
            raise self.fail(f"{l_def.name} is not a tiled sum like the numerator of {p.def_} (mismatched tilings)")
        ljo, lext, lji, lt_ext, lconds, lsummand = lparts
        lsummand = subst_index(subst_index(lsummand, ljo, Aff.of(jo)), lji, Aff.of(ji))
        lconds = tuple(c.subst(ljo, Aff.of(jo)).subst(lji, Aff.of(ji)) for c in lconds)
        if (lext, lt_ext) != (ext, t_ext):
            raise self.fail(
                f"mismatched tilings: {l_def.name} sums over {lext} x {lt_ext}, {p.def_} over {ext} x {t_ext}"
            )
        if sorted(map(str, lconds)) != sorted(map(str, conds)):
            raise self.fail(f"{l_def.name} and {p.def_} mask different positions")
        lexp = _exp_minus(lsummand)
        if lexp is None or not alpha_equal(lexp[0], score) or lexp[1] != m_read:
            raise self.fail(f"{l_def.name} is not the sum of exp(s - {m_read.tensor}) over the same scores s")
        facts: Facts = {
            "theorem": "online_agg_guard", "tile_index": jo, "tiles": str(ext), "tile": str(t_ext), "inner": ji,
            "masked": [str(c) for c in conds], "denominator": l_def.name, "shift": m_read.tensor,
            "removes": [l_def.name] + ([m_read.tensor] if prog.has_def(m_read.tensor) else []),
            "invariant": "l = exp(-m)·Σ exp(s), acc = exp(-m)·Σ exp(s)·v (any m)",
        }
        facts.update(_fold_names(("m", "l", "acc"), p.names, ji, set(names_in_program(prog))))
        facts["parts"] = (jo, ext, ji, t_ext, conds, score, value)
        return facts

    def denominator_at(self, prog: Program, l_read: Read):
        """The denominator's definition and its body at the read's index (its loops untiled)."""
        l_def = prog.def_named(l_read.tensor)
        if l_def.store != tuple(Aff.of(lp.var) for lp in l_def.loops) or l_def.guard:
            raise self.fail(f"mismatched tilings: {l_def.name}'s own loops are tiled")
        l_body = l_def.body
        for lp in l_def.loops:
            l_body = subst_index(l_body, lp.var, Aff.of("__row_" + lp.var))
        for lp, a in zip(l_def.loops, l_read.idx):
            l_body = subst_index(l_body, "__row_" + lp.var, a)
        return l_def, l_body

    def check_plain(self, prog: Program, p: OnlineAggParams, d, num: Expr, l_read: Read) -> Facts:
        """One element of a softmax, exp(a - M) / L, with L a tiled sum of exp(s - M)."""
        at_score, m_read = _exp_minus(num)
        l_def, l_body = self.denominator_at(prog, l_read)
        parts = _tiled_sum(l_body)
        if parts is None:
            raise self.fail(f"{l_def.name} is not a tiled sum sum(jo: sum(ji: [g] ? exp(s - M) : 0)); tile it first")
        jo, ext, ji, t_ext, conds, summand = parts
        if jo != p.index:
            raise self.fail(f"index {p.index} is not the outer tile index of {l_def.name}'s sum (that is {jo})")
        lexp = _exp_minus(summand)
        if lexp is None or lexp[1] != m_read:
            raise self.fail(f"{l_def.name} is not the sum of exp(s - {m_read.tensor}[..]) with the shift of {p.def_}")
        score = lexp[0]
        moving = {jo, ji} & set().union(*(a.names() for a in m_read.idx))
        if moving:
            raise self.fail(f"the subtracted {m_read.tensor} depends on the summed {sorted(moving)}")
        taken = set(names_in_program(prog))
        for v in (jo, ji):
            if v in free_indices(at_score):
                raise self.fail(f"the numerator of {p.def_} uses {v}, bound by {l_def.name}'s sum")
        facts: Facts = {
            "plain": True, "theorem": "online_softmax", "tile_index": jo, "tiles": str(ext), "tile": str(t_ext), "inner": ji,
            "masked": [str(c) for c in conds], "denominator": l_def.name, "shift": m_read.tensor,
            "removes": [l_def.name] + ([m_read.tensor] if prog.has_def(m_read.tensor) else []),
            "invariant": "l = exp(-m)·Σ exp(s) (any m); the element is exp(a - m) / l",
        }
        facts.update(_fold_names(("m", "l"), p.names[:2], ji, taken))
        facts["parts"] = (jo, ext, ji, t_ext, conds, score, at_score)
        return facts

    def rewrite(self, prog: Program, p: OnlineAggParams, facts: Facts) -> Program:
        if facts.get("plain"):
            return _rewrite_plain(prog, p, facts)
        d = prog.def_named(p.def_)
        jo, ext, ji, t_ext, conds, score, value = facts["parts"]
        m, l, acc, m_new, s_t, p_t, c = (facts[k] for k in ("m", "l", "acc", "m_new", "S_t", "P_t", "c"))
        ninf, zero = Const(float("-inf")), Const(0.0)
        at_c = tuple(x.subst(ji, Aff.of(c)) for x in conds)

        def guard(e: Expr, g: tuple, neutral: Expr) -> Expr:
            return Select(g, e, neutral) if g else e

        s_bind = Binding(s_t, ((c, t_ext),), guard(subst_index(score, ji, Aff.of(c)), at_c, ninf))
        jm, js = facts["j_max"], facts["j_sum"]
        m_bind = Binding(m_new, (), Bin("max", Read(m, ()), Reduce("max", jm, t_ext, Read(s_t, (Aff.of(jm),)))))
        p_bind = Binding(
            p_t, ((c, t_ext),),
            guard(Un("exp", Bin("-", Read(s_t, (Aff.of(c),)), Read(m_new, ()))), at_c, zero),
        )
        p_at = Read(p_t, (Aff.of(ji),))
        alpha = Bin("rescale", Read(m, ()), Read(m_new, ()))
        fold = Fold(
            var=jo,
            ext=ext,
            state=(m, l, acc),
            init=(ninf, zero, zero),
            binds=(s_bind, m_bind, p_bind),
            update=(
                Read(m_new, ()),
                Bin("+", Bin("*", Read(l, ()), alpha), Reduce("sum", js, t_ext, Read(p_t, (Aff.of(js),)))),
                Bin("+", Bin("*", Read(acc, ()), alpha),
                    Reduce("sum", ji, t_ext, guard(Bin("*", p_at, value), conds, zero))),
            ),
            result=Bin("/", Read(acc, ()), Read(l, ())),
        )
        prog = prog.with_def(replace(d, body=fold))
        for name in facts["removes"]:
            if not any(name in tensors_read(x.body) for x in prog.defs if x.name != name):
                prog = drop_def(prog, name)
        return prog



def _rewrite_plain(prog: Program, p: OnlineAggParams, facts: Facts) -> Program:
    """The (m, l) fold of one softmax element (see the module docstring)."""
    d = prog.def_named(p.def_)
    jo, ext, ji, t_ext, conds, score, at_score = facts["parts"]
    m, l, m_new, s_t, p_t, c = (facts[k] for k in ("m", "l", "m_new", "S_t", "P_t", "c"))
    ninf, zero = Const(float("-inf")), Const(0.0)
    at_c = tuple(x.subst(ji, Aff.of(c)) for x in conds)

    def guard(e: Expr, g: tuple, neutral: Expr) -> Expr:
        return Select(g, e, neutral) if g else e

    jm, js = facts["j_max"], facts["j_sum"]
    s_bind = Binding(s_t, ((c, t_ext),), guard(subst_index(score, ji, Aff.of(c)), at_c, ninf))
    m_bind = Binding(m_new, (), Bin("max", Read(m, ()), Reduce("max", jm, t_ext, Read(s_t, (Aff.of(jm),)))))
    p_bind = Binding(p_t, ((c, t_ext),), guard(Un("exp", Bin("-", Read(s_t, (Aff.of(c),)), Read(m_new, ()))), at_c, zero))
    fold = Fold(
        var=jo, ext=ext, state=(m, l), init=(ninf, zero), binds=(s_bind, m_bind, p_bind),
        update=(Read(m_new, ()),
                Bin("+", Bin("*", Read(l, ()), Bin("rescale", Read(m, ()), Read(m_new, ()))),
                    Reduce("sum", js, t_ext, Read(p_t, (Aff.of(js),))))),
        result=Bin("/", Un("exp", Bin("-", at_score, Read(m, ()))), Read(l, ())),
    )
    prog = prog.with_def(replace(d, body=fold))
    for name in facts["removes"]:
        if not any(name in tensors_read(x.body) for x in prog.defs if x.name != name):
            prog = drop_def(prog, name)
    return prog



register(OnlineAgg())
