"""GRAD: the gradient program of a spec, by reverse-mode differentiation of its statements.

    forward (IR₀):  S[b,h,i,j] = scale * sum(e: Q[b,h,i,e] * K[b,h,j,e])
                    P[b,h,i,j] = softmax(j_ | j_ <= i: S[b,h,i,j_])@[j]
                    O[b,h,i,d] = sum(j: P[b,h,i,j] * V[b,h,j,d])
    gradient:       S, P as above (the adjoints read them), then
                    dP[b,h,i,j] = sum(d: dO[b,h,i,d] * V[b,h,j,d])
                    dS[b,h,i,j_] = P[b,h,i,j_] * (dP[b,h,i,j_] - sum(j2: P[b,h,i,j2] * dP[b,h,i,j2]))
                    dV[b,h,j,d] = sum(i: dO[b,h,i,d] * P[b,h,i,j])
                    dQ[b,h,i,e] = sum(j: dS[b,h,i,j] * scale * K[b,h,j,e]) …

The definitions are visited last to first.  The adjoint of a definition T (the seed `dO` for
the output) is pushed through T's body: each read X[idx] inside it receives a contribution
(local derivative × adjoint) that still depends on every index bound around the read (T's loops,
the sums around it).  A tensor's adjoint dX[x] is the sum over those indices of the
contributions whose read index equals x: each index of the read that is an index variable (±1
times it, plus a constant) is solved for and substituted, with a range guard where the variable's
extent is not X's dimension; the other bound indices stay sums.
Local derivatives: + - * / of the algebra; max(a, b) → gt(a, b) for a, 1 - gt(a, b) for b (ties
go to b, as torch.relu's gradient at 0); a max reduction → the indicator of its maximum
(1 - gt(M, body): every tied element receives the adjoint); exp, log, sqrt, rsqrt, tanh, erf
their derivatives; `where` and guards route the adjoint to the taken branch; softmax's row
vector-Jacobian product P ∘ (g − Σ P·g), summed over the softmax's own position index (no
δ-sum appears); constants, index values and gt have derivative 0.
A forward definition the output does not depend on whatever its value (a stabilising row max M,
read only through exp(· − M) and M + log Σ exp(· − M): compiler/grad_shift.py) has adjoint 0: its
reads are constants here, so no indicator of the maximum and no second max appear.

Soundness is checked numerically (compiler/grad_check.py: central finite differences of the
forward program in float64); the step is recorded as validated numerically, not proved.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .errors import DerivationError
from .grad_shift import stabilisers
from .ir import (
    Aff, Bin, Cond, Const, Def, Expr, Ext, Loop, Program, Read, Reduce, Select, Softmax, TensorType, Un,
    all_binders, fresh, names_in_program, subst_index, tensors_read,
)

RULE = "grad"


@dataclass(frozen=True)
class Gradient:
    """The gradient program and what it computes: grads[X] = dX, the adjoint of X."""

    program: Program
    of: str
    seed: str
    grads: tuple[tuple[str, str], ...]
    # forward definitions the output does not depend on (a row max read only through
    # exp(· − M) and M + log Σ exp(· − M)): adjoint 0, not pushed through (compiler/grad_shift.py)
    stabilisers: tuple[str, ...] = ()

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(g for _, g in self.grads)


@dataclass(frozen=True)
class _Contribution:
    """Σ_{binders} adj, accumulated into tensor[idx] (idx over the binders)."""

    tensor: str
    idx: tuple[Aff, ...]
    adj: Expr
    binders: tuple[tuple[str, Ext], ...]


# --------------------------------------------------------------------------- expression helpers

ZERO, ONE = Const(0.0), Const(1.0)


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0.0 and not e.label


def _is_one(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 1.0 and not e.label


def mul(a: Expr, b: Expr) -> Expr:
    if _is_one(a):
        return b
    if _is_one(b):
        return a
    return Bin("*", a, b)


def div(a: Expr, b: Expr) -> Expr:
    return a if _is_one(b) else Bin("/", a, b)


def sub(a: Expr, b: Expr) -> Expr:
    return Bin("-", a, b)


def neg(a: Expr) -> Expr:
    return a.a if isinstance(a, Un) and a.op == "neg" else Un("neg", a)


def where(conds: tuple[Cond, ...], then: Expr, other: Expr) -> Expr:
    return Select(conds, then, other) if conds else then


# --------------------------------------------------------------------------- the differentiation


class _Differentiator:
    def __init__(self, prog: Program, differentiable: frozenset[str]):
        self.prog = prog
        self.differentiable = differentiable
        self.taken: set[str] = set(names_in_program(prog))

    def fresh(self, base: str) -> str:
        name = fresh(base, self.taken)
        self.taken.add(name)
        return name

    def depends(self, e: Expr) -> bool:
        return bool(tensors_read(e) & self.differentiable)

    def back(self, e: Expr, adj: Expr, binders: tuple[tuple[str, Ext], ...], site: Def,
             out: list[_Contribution]) -> None:
        """Contributions of e's reads, given the adjoint `adj` of e's value."""
        if not self.depends(e) or _is_zero(adj):
            return
        if isinstance(e, Read):
            out.append(_Contribution(e.tensor, e.idx, adj, binders))
        elif isinstance(e, Bin):
            self.binary(e, adj, binders, site, out)
        elif isinstance(e, Un):
            # the value itself where it is stored: a norm's rsqrt(Σ …) is read, not summed again
            value = Read(site.name, site.store) if e is site.body else e
            self.back(e.a, mul(adj, self.unary_derivative(e, value)), binders, site, out)
        elif isinstance(e, Reduce):
            inner = binders + ((e.var, e.ext),)
            if e.op == "sum":
                self.back(e.body, adj, inner, site, out)
            elif e.op == "max":
                v = self.fresh(e.var)
                whole = Reduce("max", v, e.ext, subst_index(e.body, e.var, Aff.of(v)))
                self.back(e.body, mul(adj, sub(ONE, Bin("gt", whole, e.body))), inner, site, out)
            else:
                raise self.refuse(site, f"a reduction `{e.op}` has no derivative rule")
        elif isinstance(e, Select):
            self.back(e.then, Select(e.conds, adj, ZERO), binders, site, out)
            self.back(e.other, Select(e.conds, ZERO, adj), binders, site, out)
        elif isinstance(e, Softmax):
            self.softmax(e, adj, binders, site, out)
        else:
            raise self.refuse(site, f"{type(e).__name__} is not a construct of a spec")

    def binary(self, e: Bin, adj: Expr, binders: tuple[tuple[str, Ext], ...], site: Def,
               out: list[_Contribution]) -> None:
        a, b = e.a, e.b
        if e.op == "+":
            self.back(a, adj, binders, site, out)
            self.back(b, adj, binders, site, out)
        elif e.op == "-":
            self.back(a, adj, binders, site, out)
            self.back(b, neg(adj), binders, site, out)
        elif e.op == "*":
            self.back(a, mul(adj, b), binders, site, out)
            self.back(b, mul(adj, a), binders, site, out)
        elif e.op == "/":  # d(a/b) = da/b - (a/b)·db/b
            self.back(a, div(adj, b), binders, site, out)
            self.back(b, neg(div(mul(adj, e), b)), binders, site, out)
        elif e.op == "max":
            step = Bin("gt", a, b)
            self.back(a, mul(adj, step), binders, site, out)
            self.back(b, mul(adj, sub(ONE, step)), binders, site, out)
        elif e.op == "gt":
            return  # a step: derivative 0 wherever it is defined
        else:
            raise self.refuse(site, f"the operation `{e.op}` has no derivative rule")

    def unary_derivative(self, e: Un, value: Expr) -> Expr:
        """f'(a) for e = f(a), in terms of e's value where it can be (so the argument, often a
        reduction, is not evaluated again)."""
        a = e.a
        if e.op == "exp":
            return value
        if e.op == "neg":
            return Const(-1.0)
        if e.op == "log":  # 1/a = exp(-log a)
            return Un("exp", neg(value))
        if e.op == "sqrt":
            return div(Const(0.5), value)
        if e.op == "rsqrt":  # d a^(-1/2) = -1/2 · a^(-3/2)
            return mul(Const(-0.5), mul(value, mul(value, value)))
        if e.op == "tanh":
            return sub(ONE, mul(value, value))
        if e.op == "erf":
            return mul(Const(2.0 / math.sqrt(math.pi)), Un("exp", neg(mul(a, a))))
        raise DerivationError(RULE, f"the function `{e.op}` has no derivative rule")

    def softmax(self, e: Softmax, adj: Expr, binders: tuple[tuple[str, Ext], ...], site: Def,
                out: list[_Contribution]) -> None:
        """p = softmax at position j (a bound index): the score at u receives
        Σ_j adj(j)·p_j·(δ(u, j) − p_u) = p_u·(adj(u) − Σ_j adj(j)·p_j); the sum over j is taken
        here, so j leaves the bound indices and the softmax's own index u enters."""
        names = dict(binders)
        at = e.at.terms
        if e.at.const or len(at) != 1 or at[0][1] != 1 or at[0][0] not in names:
            raise self.refuse(site, f"softmax at position {e.at}: the position must be an index of {site.name}")
        j = at[0][0]
        if names[j] != e.ext:
            raise self.refuse(site, f"softmax over {e.ext} at index {j} < {names[j]}: different extents")

        def prob(x: Aff) -> Expr:
            if site.body == e:  # the definition is the softmax: read it
                return Read(site.name, tuple(a.subst(j, x) for a in site.store))
            return Softmax(e.var, e.ext, e.score, x, e.mask)

        j2 = self.fresh(j + "2")
        row = Reduce("sum", j2, e.ext, mul(prob(Aff.of(j2)), subst_index(adj, j, Aff.of(j2))))
        u = Aff.of(e.var)
        g = mul(prob(u), sub(subst_index(adj, j, u), row))
        inner = tuple((v, x) for v, x in binders if v != j) + ((e.var, e.ext),)
        self.back(e.score, g, inner, site, out)

    def refuse(self, site: Def, reason: str) -> DerivationError:
        return DerivationError(RULE, f"cannot differentiate {site.name}: {reason}")

    # ------------------------------------------------------------------ accumulation

    def accumulate(self, name: str, ttype: TensorType, contribs: list[_Contribution]) -> Def:
        """dX[x] = Σ over contributions of Σ_{binders, idx = x} adj."""
        targets = self.target_names(contribs[0], len(ttype.dims))
        terms: dict[Expr, int] = {}  # equal terms (X·X gives two) counted once
        for c in contribs:
            term = self.solve(c, targets, ttype)
            terms[term] = terms.get(term, 0) + 1
        body: Expr | None = None
        for term, count in terms.items():
            term = term if count == 1 else mul(Const(float(count)), term)
            body = term if body is None else Bin("+", body, term)
        assert body is not None
        loops = tuple(Loop(t, Ext.of(dim)) for t, dim in zip(targets, ttype.dims))
        return Def(name, ttype, loops, tuple(Aff.of(t) for t in targets), body)

    def target_names(self, c: _Contribution, rank: int) -> tuple[str, ...]:
        out: list[str] = []
        for k in range(rank):
            a = c.idx[k]
            v = a.terms[0][0] if len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const else None
            out.append(v if v is not None and v not in out else self.fresh(f"x{k}"))
        return tuple(out)

    def solve(self, c: _Contribution, targets: tuple[str, ...], ttype: TensorType) -> Expr:
        adj, idx, binders = c.adj, list(c.idx), list(c.binders)
        # a bound index named like a target (not the one solved for it) is renamed apart first
        busy = set(targets) | set(self.taken)
        for k, (v, x) in enumerate(binders):
            clash = v in targets and not (idx[targets.index(v)] == Aff.of(v))
            if clash:
                new = fresh(v, busy | all_binders(adj))
                busy.add(new)
                adj = subst_index(adj, v, Aff.of(new))
                idx = [a.rename(v, new) for a in idx]
                binders[k] = (new, x)
        conds: list[Cond] = []
        ext_of = dict(binders)
        for k, t in enumerate(targets):
            a = idx[k]
            pick = next((v for v, coef in a.terms if v in ext_of and abs(coef) == 1), None)
            if pick is None:  # no index variable to solve for: the element must equal x
                conds += [Cond(a, "<=", Aff.of(t)), Cond(Aff.of(t), "<=", a)]
                continue
            coef = a.coef(pick)
            rest = a - Aff.of(pick, coef)
            value = (Aff.of(t) - rest).scale(coef)  # coef = ±1: pick = coef·(t − rest)
            ext = ext_of.pop(pick)
            binders = [(v, x) for v, x in binders if v != pick]
            adj = subst_index(adj, pick, value)
            idx = [b.subst(pick, value) for b in idx]
            if not (value == Aff.of(t) and ext == Ext.of(ttype.dims[k])):
                num, den = ext.single()
                if den != 1:
                    raise DerivationError(RULE, f"cannot solve the read index {a}: extent {ext}")
                conds += [Cond(Aff.lit(0), "<=", value), Cond(value, "<", num)]
        term = where(tuple(conds), adj, ZERO)
        for v, x in reversed(binders):
            term = Reduce("sum", v, x, term)
        return term


def differentiate(prog: Program, of: str, wrt: Sequence[str], seed: str,
                  names: dict[str, str] | None = None) -> Gradient:
    """The gradient program of `prog` (IR₀): adjoints of `wrt` given the seed adjoint of `of`.

    Its inputs are prog's plus the seed (of's shape and dtype); its definitions the forward
    definitions the adjoints read, then the adjoints, ending in one gradient per `wrt` input
    (named d<X> unless `names` says otherwise, dtype of X)."""
    inputs = prog.input_map()
    if not prog.has_def(of):
        raise DerivationError(RULE, f"grad.of: {of} is not a definition of the spec")
    for x in wrt:
        if x not in inputs:
            raise DerivationError(RULE, f"grad.wrt: {x} is not an input of the spec")
    for d in prog.defs:
        if d.guard or d.store != tuple(Aff.of(lp.var) for lp in d.loops):
            raise DerivationError(RULE, f"{d.name} is not a statement of the spec (a scheduled program)")
    upto = [d.name for d in prog.defs].index(of)
    fwd = prog.defs[: upto + 1]
    steady = frozenset(stabilisers(prog, of))
    diff = _Differentiator(prog, frozenset(d.name for d in fwd if d.name not in steady) | frozenset(wrt))
    names = dict(names or {})
    grad_names = {x: names.get(x) or diff.fresh("d" + x) for x in wrt}
    for g in grad_names.values():
        diff.taken.add(g)
    if seed in diff.taken - {seed} or seed in names_in_program(prog):
        raise DerivationError(RULE, f"grad.seed: the name {seed} is already used in the spec")
    diff.taken.add(seed)
    contribs: dict[str, list[_Contribution]] = {}
    adjoint_defs: list[Def] = []
    for d in reversed(fwd):
        if d.name == of:
            adj_name = seed
        elif d.name in contribs:
            adj_name = diff.fresh("d" + d.name)
            adjoint_defs.append(diff.accumulate(adj_name, TensorType(d.type.dims, prog.intermediate_dtype()),
                                                contribs.pop(d.name)))
        else:
            continue  # the output does not depend on d
        adj = Read(adj_name, tuple(Aff.of(lp.var) for lp in d.loops))
        found: list[_Contribution] = []
        diff.back(d.body, adj, tuple((lp.var, lp.ext) for lp in d.loops), d, found)
        for c in found:
            contribs.setdefault(c.tensor, []).append(c)
    grad_defs: list[Def] = []
    for x in wrt:
        t = inputs[x]
        if x in contribs:
            grad_defs.append(diff.accumulate(grad_names[x], t, contribs[x]))
        else:  # the output does not depend on x
            loops = tuple(Loop(diff.fresh(f"x{k}"), Ext.of(dim)) for k, dim in enumerate(t.dims))
            grad_defs.append(Def(grad_names[x], t, loops, tuple(Aff.of(lp.var) for lp in loops), ZERO))
    of_type = prog.def_named(of).type
    # every forward definition stays (a rule may read the forward output: FA2's row term);
    # kernels are cut out of this program and keep only what they read
    defs = list(fwd) + [d for d in needed_defs(adjoint_defs + grad_defs, {d.name for d in grad_defs})
                        if d.name not in {f.name for f in fwd}]
    program = Program(
        sizes=prog.sizes, inputs=prog.inputs + ((seed, of_type),), defs=tuple(defs),
        output=grad_defs[0].name,
        facts=(("grad_of", of), ("also_outputs", ",".join(d.name for d in grad_defs))),
    )
    return Gradient(program, of, seed, tuple((x, grad_names[x]) for x in wrt),
                    tuple(d.name for d in fwd if d.name in steady))


def needed_defs(defs: list[Def], roots: set[str]) -> list[Def]:
    """The definitions the roots read, transitively, in their order."""
    live = set(roots)
    for d in reversed(defs):
        if d.name in live:
            live |= tensors_read(d.body)
    return [d for d in defs if d.name in live]
