"""The score of a tensor-core fold, as the printers see it: any element-wise expression of the
contraction Q·K (one tile sum of the kernel IR), index values, sizes, constants and reads of
small tensors, brought to one normal form so that equivalent spellings print the same kernel.

The normal form is a printer-level canonicalisation, not a derivation step: the kernel IR (and
its interpreter, the numeric checks, the proofs) keeps the expression as written; only the C
text is printed from the normal form.  Each rewrite is an identity of the real field, so the
printed value is the kernel IR's value up to the float rounding every printed expression has:

    fold      f(c1, ..) -> c       a subtree without reads, index variables or the contraction
                                   is its value (a fixed size is its number), in float64; every
                                   constant is rounded to float32 at the end, as its C literal is
    divide    a / c  -> (1/c) * a  a / c = c⁻¹ · a for c ≠ 0 (the definition of division)
    commute   a * c  -> c * a      commutativity of ·: the constant factor to the left
    assoc     c1 * (c2 * a) -> (c1·c2) * a                       associativity of ·
    unit      1 * a  -> a                                         1 is the unit of ·
    sign      neg(c) -> -c  (a constant), neg(c * a) -> (-c) * a   -(c·a) = (-c)·a

Rewriting bottom-up reaches a fixpoint in one pass (each rule only builds nodes already in
normal form).  `split_scale` then tells the fast path (a positive constant times the
contraction: the printers fold the constant into exp2's log2(e) factor) from the general one
(the score computed per element from the normal form, then the fold in log2(e) units).
"""
from __future__ import annotations

import math

import numpy as np

from compiler.interp import UNARY, step_gt
from compiler.ir import Bin, Const, Expr, IndexValue, Read, Reduce, Un, map_children


def _const(v: float) -> Const:
    return Const(float(v))


def _fold_binary(op: str, a: float, b: float) -> float | None:
    with np.errstate(all="ignore"):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return a / b if b != 0 else None
        if op == "max":
            return max(a, b)
        if op == "gt":
            return float(step_gt(np.float64(a), np.float64(b)))
    return None  # rescale: left to the printer (never part of a score)


def normal_form(e: Expr, fixed: dict[str, int]) -> Expr:
    """The normal form of the element-wise score expression `e` (see the module docstring);
    `fixed` gives the fixed sizes, which fold to their numbers.  Constants fold in float64 and
    are rounded to float32 once, at the end: two spellings of one constant (1/sqrt(D), the
    parameter's value) differ by an ulp of float64 at most, which float32 rounding removes."""
    return _round(_normal(e, fixed))


def _round(e: Expr) -> Expr:
    if isinstance(e, Const):
        return Const(float(np.float32(e.value)))
    return map_children(e, _round)


def _normal(e: Expr, fixed: dict[str, int]) -> Expr:
    e = map_children(e, lambda x: _normal(x, fixed))
    if isinstance(e, Const):
        return _const(e.value)
    if isinstance(e, IndexValue) and e.aff.names() <= set(fixed):
        return _const(e.aff.evaluate(fixed))
    if isinstance(e, Un) and isinstance(e.a, Const):
        with np.errstate(all="ignore"):
            v = float(UNARY[e.op](np.float64(e.a.value)))
        if math.isfinite(v):
            return _const(v)
    if isinstance(e, Un) and e.op == "neg" and _scaled(e.a) is not None:
        c, rest = _scaled(e.a)
        return _times(-c, rest)
    if not isinstance(e, Bin):
        return e
    if isinstance(e.a, Const) and isinstance(e.b, Const):
        v = _fold_binary(e.op, e.a.value, e.b.value)
        if v is not None and math.isfinite(v):
            return _const(v)
    if e.op == "/" and isinstance(e.b, Const) and e.b.value != 0:
        return _times(1.0 / e.b.value, e.a)
    if e.op == "*" and isinstance(e.b, Const):
        return _times(e.b.value, e.a)
    if e.op == "*" and isinstance(e.a, Const):
        return _times(e.a.value, e.b)
    return e


def _scaled(e: Expr) -> tuple[float, Expr] | None:
    """(c, a) when e is c * a in normal form."""
    if isinstance(e, Bin) and e.op == "*" and isinstance(e.a, Const):
        return e.a.value, e.b
    return None


def _times(c: float, a: Expr) -> Expr:
    """c * a in normal form, a in normal form (assoc, unit)."""
    inner = _scaled(a)
    if inner is not None:
        c, a = c * inner[0], inner[1]
    if c == 1.0:
        return a
    return Bin("*", Const(c), a)


def contraction_in(e: Expr) -> list[Reduce]:
    """The tile sums in e (the score must hold exactly one: its contraction)."""
    out: list[Reduce] = []

    def visit(x: Expr) -> None:
        if isinstance(x, Reduce):
            out.append(x)
            return
        for c in (x.a, x.b) if isinstance(x, Bin) else (x.a,) if isinstance(x, Un) else ():
            visit(c)

    visit(e)
    return out


def substitute(e: Expr, old: Expr, new: Expr) -> Expr:
    """e with every occurrence of the sub-expression `old` replaced by `new`."""
    if e == old:
        return new
    return map_children(e, lambda x: substitute(x, old, new))


def split_scale(score: Expr, acc: Read) -> tuple[float, Expr | None]:
    """(SCALE, None) when the normal-form score is SCALE * acc with SCALE > 0 (or acc alone): the
    fast path; else (1.0, score): the score is computed element-wise before the fold."""
    if score == acc:
        return 1.0, None
    sc = _scaled(score)
    if sc is not None and sc[1] == acc and sc[0] > 0 and math.isfinite(sc[0]):
        return sc[0], None
    return 1.0, score
