"""Stabilising statistics: a definition the output does not depend on, whatever its value.

    M[r] = max(k: X[r, k])                          (the row max, for the range of exp)
    L[r] = sum(k: exp(X[r, k] - M[r]))              L · e^(−δ) when M[r] becomes M[r] + δ
    loss[r] = M[r] + log(L[r]) - X[r, T[r]]         (M + δ) + (log L − δ): unchanged

If replacing M[idx] by M[idx] + δ(idx), for every function δ of M's own index, leaves the output
unchanged (the later definitions recomputed from the shifted M), then the output's derivative with
respect to M's value is 0: the adjoint of M is 0 and GRAD need not push it through M's body.  For a
max that removes the indicator term dM · [X == M] (0 in exact arithmetic, rounding noise in floats,
and a step the algebra cannot state where M may be −inf) and the second max a kernel would compute.

The shift of each value is followed syntactically: a value either moves by c·δ(at) (`add`, an
integer c) or is multiplied by e^(c·δ(at)) (`mul`); a literal 0 is both (0 · anything = 0).
  M[at]               add 1
  a ± b               add c_a ± c_b; mul c when both are mul c (a common factor)
  a · b, a / b        mul c_a ± c_b
  exp(add c)          mul c              log(mul c)   add c (log of 0 stays −inf)
  −a                  add −c / mul c     max(a, b)    the common shift of a and b
  Σ_k / max_k body    the body's mul c / add c, when δ's index does not run with k
  softmax(add c)      invariant (softmax is shift invariant along its row)
  where(g, a, b)      the common shift of a and b (guards read indices and integer tensors)
Anything else (a shift under tanh, a sum of shifted terms, two shifts at different indices) is
not followed: the definition is then differentiated as usual.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ir import Aff, Bin, Const, Def, Expr, IndexValue, Program, Read, Reduce, Select, Softmax, Un, tensors_read


@dataclass(frozen=True)
class Shift:
    """value + coef·δ(at) (kind add) or value · e^(coef·δ(at)) (kind mul); coef 0: unchanged."""

    kind: str  # add | mul | zero (the literal 0: unchanged under either)
    coef: int = 0
    at: tuple[Aff, ...] = ()

    @property
    def invariant(self) -> bool:
        return self.coef == 0


UNCHANGED = Shift("add")
ZERO = Shift("zero")


def _as(s: Shift, kind: str) -> Shift | None:
    """s read as a shift of `kind` (an unchanged value is add 0 and mul 0; 0 is either)."""
    if s.kind == kind:
        return s
    if s.kind == "zero" or s.invariant:
        return Shift(kind)
    return None


def _combine(a: Shift, b: Shift, kind: str, sign: int) -> Shift | None:
    """The shift of a op b where op adds the coefficients (sign 1) or subtracts them (-1)."""
    x, y = _as(a, kind), _as(b, kind)
    if x is None or y is None:
        return None
    if x.coef and y.coef and x.at != y.at:
        return None
    coef = x.coef + sign * y.coef
    return Shift(kind, coef, (x.at or y.at) if coef else ())


def _same(a: Shift, b: Shift) -> Shift | None:
    """The common shift of two values one of which is taken (where, max, a comparison): the
    literal 0 goes with a product's shift (0 · e^(cδ) = 0), not with a moved sum's."""
    if a.kind == "zero" or b.kind == "zero":
        other = b if a.kind == "zero" else a
        return other if other.kind != "add" or other.invariant else None
    if a.invariant and b.invariant:
        return UNCHANGED
    if (a.kind, a.coef, a.at) == (b.kind, b.coef, b.at):
        return a
    return None


class _Shifts:
    def __init__(self, prog: Program, moved: str):
        self.moved = moved
        self.defs: dict[str, tuple[Def, Shift | None]] = {}
        for d in prog.defs:
            if d.name != moved:
                self.defs[d.name] = (d, self.of(d.body))

    def read(self, e: Read) -> Shift | None:
        if e.tensor == self.moved:
            return Shift("add", 1, e.idx)
        if e.tensor not in self.defs:
            return UNCHANGED  # an input
        d, s = self.defs[e.tensor]
        if s is None or s.invariant:
            return s
        at = _substitute(s.at, tuple(lp.var for lp in d.loops), e.idx)
        return Shift(s.kind, s.coef, at)

    def of(self, e: Expr) -> Shift | None:
        if isinstance(e, Const):
            return ZERO if e.value == 0.0 and not e.label else UNCHANGED
        if isinstance(e, IndexValue):
            return UNCHANGED
        if isinstance(e, Read):
            return self.read(e)
        if isinstance(e, Un):
            return self.unary(e.op, self.of(e.a))
        if isinstance(e, Bin):
            a, b = self.of(e.a), self.of(e.b)
            return None if a is None or b is None else self.binary(e.op, a, b)
        if isinstance(e, Reduce):
            body = self.of(e.body)
            if body is None or body.kind == "zero" or body.invariant:
                return body
            if any(e.var in a.names() for a in body.at):
                return None  # δ runs with the reduction
            if e.op == "sum":
                return body if body.kind == "mul" else None
            return body if e.op == "max" else None
        if isinstance(e, Select):
            a, b = self.of(e.then), self.of(e.other)
            return None if a is None or b is None else _same(a, b)
        if isinstance(e, Softmax):
            score = self.of(e.score)
            if score is None:
                return None
            if score.kind == "zero" or score.invariant:
                return UNCHANGED
            ok = score.kind == "add" and not any(e.var in a.names() for a in score.at)
            return UNCHANGED if ok else None
        return None  # Let, Fold: not in a spec's statements

    @staticmethod
    def unary(op: str, a: Shift | None) -> Shift | None:
        if a is None:
            return None
        if a.kind == "zero" or a.invariant:
            return UNCHANGED if op != "neg" else a
        if op == "neg":
            return Shift("add", -a.coef, a.at) if a.kind == "add" else a
        if op == "exp" and a.kind == "add":
            return Shift("mul", a.coef, a.at)
        if op == "log" and a.kind == "mul":
            return Shift("add", a.coef, a.at)
        return None

    @staticmethod
    def binary(op: str, a: Shift, b: Shift) -> Shift | None:
        if op in ("+", "-"):
            sign = 1 if op == "+" else -1
            added = _combine(a, b, "add", sign)
            if added is not None:
                return added
            return _same(a, b) if a.kind == "mul" or b.kind == "mul" else None
        if op in ("*", "/"):
            if op == "*" and (a.kind == "zero" or b.kind == "zero"):
                return ZERO
            return _combine(a, b, "mul", 1 if op == "*" else -1)
        if op == "max":
            return _same(a, b)
        if op == "rescale":  # exp(a - b)
            return _Shifts.unary("exp", _combine(a, b, "add", -1))
        if op == "gt":  # a step of a − b (or of a / b by a positive factor)
            same = _same(a, b)
            return UNCHANGED if same is not None else None
        return None


def _substitute(at: tuple[Aff, ...], names: tuple[str, ...], values: tuple[Aff, ...]) -> tuple[Aff, ...]:
    """at with names := values, simultaneously (through placeholder names no index uses)."""
    held = tuple(f"\x00{k}" for k in range(len(names)))
    out = at
    for n, h in zip(names, held):
        out = tuple(a.rename(n, h) for a in out)
    for h, v in zip(held, values):
        out = tuple(a.subst(h, v) for a in out)
    return out


def stabilisers(prog: Program, of: str) -> tuple[str, ...]:
    """The definitions before `of` that `of` reads (transitively) and does not depend on: moving
    any one of them by δ(its index) leaves `of` unchanged."""
    names = [d.name for d in prog.defs]
    upto = names.index(of)
    read = {of}
    for d in reversed(prog.defs[: upto + 1]):
        if d.name in read:
            read |= tensors_read(d.body)
    found: list[str] = []
    for d in prog.defs[:upto]:
        if d.name in read:
            entry = _Shifts(prog, d.name).defs[of][1]
            if entry is not None and entry.invariant:
                found.append(d.name)
    return tuple(found)
