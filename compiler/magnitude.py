"""The scale of a program's rounding: each value beside the magnitude of the terms it comes from.

A gradient is often a sum that cancels: dQ[i] = Σ_j P_ij (dP_ij − D_i) K_j is ~0 when the row's
softmax is one-hot (P_ij ≈ 1 where dP_ij ≈ D_i), and its float64 rounding is then not small
relative to dQ itself — only relative to the terms it is summed from.  `magnitudes` evaluates
a statement program (the reference a derivation step is checked against) to M, to first order
a bound of the rounding error a float64 evaluation of the same mathematics makes, in units of u:

    M(constant, input, index value) = |x|
    M(a ± b) = M(a) + M(b)        M(a·b) = M(a)|b| + |a|M(b)      M(a/b) = M(a)/|b| + |a|M(b)/b²
    M(f(a))  = |f(a)| + |f'(a)|·M(a)    (exp, log, sqrt, rsqrt, tanh, erf; rescale = exp(a − b))
    M(Σ_j t) = Σ_j M(t)           M(max_j t) = max_j M(t)          M(max(a, b)) = max(M(a), M(b))
    M(softmax_j s)_j = P_j·(1 + M(s_j) + max_k M(s_k))

M ≥ |value| everywhere.  A rewrite that computes the same values in another order stays within
a small multiple of u·M (the length of the sums); a wrong one — a dropped term, a wrong row
statistic, a mask missing — is off by about a term, i.e. by a fraction of M, not of u·M.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from .interp import (
    UNARY, InterpError, _Env, _lift, _norm, _read, _top, def_env, pick_at, softmax_keep, softmax_rows, store_def,
)
from .interp_matmul import _all, _matmul_sum, guarded_product, operand_keeps
from .ir import Bin, Const, Expr, IndexValue, Program, Read, Reduce, Select, Softmax, Un

Pair = tuple[np.ndarray, np.ndarray]  # (value, magnitude), broadcast over the index stack


def magnitudes(p: Program, sizes: Mapping[str, int], inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """M of every tensor of `p` (inputs: |x|).  `p` must be a statement program (no Let / Fold:
    the references the steps are checked against are)."""
    values = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    mags = {k: np.abs(v) for k, v in values.items()}
    for d in p.defs:
        if d.also:
            raise InterpError(f"the scale of terms is defined on statement programs; def {d.name} writes further tensors")
        env = def_env(d, sizes, values, contract=False)
        menv = _Env(sizes, mags)
        menv.vars = env.vars  # one index stack, two sets of tensors
        v, m = _pair(env, menv, d.body)
        with np.errstate(all="ignore"):
            m = np.where(np.isnan(m), np.abs(v), m)  # inf·0 on a discarded path: the value's own size
        values[d.name], mags[d.name] = store_def(d, env, v), store_def(d, env, m)
    return mags


def _pair(env: _Env, menv: _Env, e: Expr) -> Pair:
    d = env.depth
    if isinstance(e, (Const, IndexValue)):
        v = np.full((1,) * d, e.value) if isinstance(e, Const) else _lift(env.aff(e.aff).astype(np.float64), d)
        return v, np.abs(v)
    if isinstance(e, Read):
        return _read(env, e), _read(menv, e)
    if isinstance(e, Bin):
        return _binary(e.op, _pair(env, menv, e.a), _pair(env, menv, e.b))
    if isinstance(e, Un):
        return _unary(e.op, _pair(env, menv, e.a))
    if isinstance(e, Select):
        (tv, tm), (ov, om), c = _pair(env, menv, e.then), _pair(env, menv, e.other), env.cond(e.conds)
        return np.where(c, tv, ov), np.where(c, tm, om)
    if isinstance(e, Reduce):
        return _reduce(env, menv, e)
    if isinstance(e, Softmax):
        return _softmax(env, menv, e)
    raise InterpError(f"the scale of terms is defined on statement programs, not on {type(e).__name__}")


def _binary(op: str, a: Pair, b: Pair) -> Pair:
    (av, am), (bv, bm) = a, b
    with np.errstate(all="ignore"):
        if op in ("+", "-"):
            return (av + bv if op == "+" else av - bv), am + bm
        if op == "*":
            return av * bv, am * np.abs(bv) + np.abs(av) * bm
        if op == "/":  # the field convention: x / 0 = 0 (inv 0 = 0)
            zero = bv == 0
            q = np.where(zero, 1.0, bv)
            return np.where(zero, 0.0, av / q), np.where(zero, 0.0, am / np.abs(q) + np.abs(av) * bm / (q * q))
        if op == "rescale":  # exp(a - b), exactly 1 when a == b
            v = np.where(av == bv, 1.0, np.exp(av - bv))
            return v, np.where(av == bv, 1.0, v * (1.0 + am + bm))
        if op == "max":
            return np.maximum(av, bv), np.maximum(am, bm)
        if op == "gt":  # a step: exact where it does not flip
            v = np.greater(av, bv).astype(np.float64)
            return v, v
    raise InterpError(f"unknown operator {op}")


def _unary(op: str, a: Pair) -> Pair:
    av, am = a
    if op not in UNARY:
        raise InterpError(f"unknown function {op}")
    with np.errstate(all="ignore"):
        v = UNARY[op](av)
        slope = {
            "neg": lambda: np.ones_like(av),
            "exp": lambda: np.abs(v),
            "log": lambda: 1.0 / np.abs(av),
            "sqrt": lambda: 0.5 / np.abs(v),
            "rsqrt": lambda: 0.5 * np.abs(v) / np.abs(av),
            "tanh": lambda: 1.0 - v * v,
            "erf": lambda: (2.0 / math.sqrt(math.pi)) * np.exp(-av * av),
        }[op]()
        return v, np.abs(v) + np.where(am == 0, 0.0, slope * am)


def _reduce(env: _Env, menv: _Env, e: Reduce) -> Pair:
    if e.op == "sum":
        contracted = _sum_of_product(env, menv, e)
        if contracted is not None:
            return contracted
    n = env.ext(e.ext)
    env.push(e.var, _top(n))
    try:
        v, m = _pair(env, menv, e.body)
        live = env.index(e.var) < _lift(n, env.depth)
    finally:
        env.pop()
    shape = np.broadcast_shapes(v.shape, m.shape, live.shape)
    v, m, live = (np.broadcast_to(x, shape) for x in (v, m, live))
    with np.errstate(all="ignore"):
        if e.op == "sum":
            return np.where(live, v, 0.0).sum(axis=-1), np.where(live, m, 0.0).sum(axis=-1)
        if e.op == "max":
            if shape[-1] == 0:
                return np.full(shape[:-1], -np.inf), np.full(shape[:-1], np.inf)
            # an element at -inf (a masked one) never is the max of a row that has another
            return np.where(live, v, -np.inf).max(axis=-1), np.where(live & (v > -np.inf), m, 0.0).max(axis=-1)
    raise InterpError(f"unknown reduction {e.op}")


def _sum_of_product(env: _Env, menv: _Env, e: Reduce) -> Pair | None:
    """sum(var: [conds] ? a·b : 0) and its M = Σ M(a)|b| + |a|M(b) through matrix products, as
    the interpreter contracts its sums (compiler/interp.py: not materialised over the whole
    index space); elementwise when a term is not finite (IEEE's NaN / ±inf rules); None when
    the sum is not one of a product."""
    product = guarded_product(e.body)
    if product is None:
        return None
    conds, body = product
    n = env.ext(e.ext)
    top = _top(n)
    if top == 0:
        return None
    env.push(e.var, top)
    try:
        a, b = _pair(env, menv, body.a), _pair(env, menv, body.b)
        masks = [env.cond((c,)) for c in conds] + [env.index(e.var) < _lift(n, env.depth)]
    finally:
        env.pop()
    a, b = (np.broadcast_arrays(*x) for x in (a, b))
    keep_a, keep_b = operand_keeps(masks, a[0], b[0])
    (av, am), (bv, bm) = ([np.where(keep, x, 0.0) for x in pair] for keep, pair in ((keep_a, a), (keep_b, b)))
    if all(np.isfinite(x).all() for x in (av, am, bv, bm)):
        return _matmul_sum(av, bv), _matmul_sum(am, np.abs(bv)) + _matmul_sum(np.abs(av), bm)
    tv, tm = _binary("*", a, b)
    live = _all(masks, np.broadcast_shapes(tv.shape, tm.shape, *(m.shape for m in masks)))
    with np.errstate(all="ignore"):
        return np.where(live, tv, 0.0).sum(axis=-1), np.where(live, tm, 0.0).sum(axis=-1)


def _softmax(env: _Env, menv: _Env, e: Softmax) -> Pair:
    top = _top(env.ext(e.ext))
    env.push(e.var, top)
    try:
        sv, sm = _pair(env, menv, e.score)
        keep = softmax_keep(env, e)
    finally:
        env.pop()
    p = softmax_rows(env, sv, keep, top)
    shape = p.shape
    sm = np.where(np.broadcast_to(keep, shape), np.broadcast_to(sm, shape), 0.0)
    with np.errstate(all="ignore"):
        m = p * (1.0 + sm + sm.max(axis=-1, keepdims=True)) if top else p
    return pick_at(env, e, p, top), pick_at(env, e, m, top)


def terms_error(out: np.ndarray, ref: np.ndarray, mag: np.ndarray) -> float:
    """‖out − ref‖ / ‖M‖: the error against the scale of the terms (infinite for a NaN / inf of
    out where ref is finite, or a shape mismatch); the spec's -inf (an empty row's log-sum-exp)
    must be matched exactly."""
    if out.shape != ref.shape:
        return float("inf")
    ninf = ref == -np.inf
    if not np.array_equal(out[ninf], ref[ninf]):
        return float("inf")
    out, ref = np.where(ninf, 0.0, out), np.where(ninf, 0.0, ref)
    if not np.all(np.isfinite(out)):
        return float("inf")
    scale = np.maximum(np.where(np.isfinite(mag), mag, 0.0), np.abs(ref))
    denom, diff = _norm(scale), _norm(out - ref)
    return diff / denom if denom else diff
