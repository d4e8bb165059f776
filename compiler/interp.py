"""Reference interpreter: evaluates any program of the IR in float64 with numpy.

Evaluation is vectorised over the bound index variables: every bound variable owns one axis
of an array stack, so a `Reduce` pushes an axis and sums over it, and a `Def` evaluates its
body over the whole loop nest at once.  An expression's array has size 1 along every axis it
does not depend on, so nothing is materialised over indices it does not use.  Extents may
depend on outer indices (causal tile truncation); such loops run to the largest extent with the
excess masked out.  A `Fold` runs its steps in order, each step vectorised over every other
index.

A sum of a product (`sum(k: [guard] ? a * b : 0)`) is contracted with a batched matrix product
instead of materialising a·b over the whole index space, when its factors are finite; with a
non-finite factor it is summed elementwise, so NaN and ±inf propagate exactly as in the plain
definition.  `run_program(..., contract=False)` evaluates every sum elementwise (the tests
compare the two).

Out-of-bounds reads give NaN (a guarded branch discards them; an unguarded one poisons the
result), and every `Def` must write each element of its tensor exactly once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .ir import (
    SPAN_KEY, Aff, Bin, Binding, Cond, Const, DataCond, DataRead, DataSpan, Def, Or, Expr, Ext, Fold, IndexValue, Let, Program, Read, Reduce, also_def,
    Select, Softmax, Un,
)
from .int_inputs import span_holds
from .interp_matmul import _matmul_sum, _nonfinite_sum, guarded_product, operand_keeps

_erf_scalar = np.frompyfunc(math.erf, 1, 1)


def erf(a: np.ndarray) -> np.ndarray:
    """The error function elementwise in float64 (numpy has none; NaN and ±inf pass through)."""
    return np.asarray(_erf_scalar(np.asarray(a, dtype=np.float64)), dtype=np.float64)


UNARY = {
    "exp": np.exp, "neg": np.negative, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda a: 1.0 / np.sqrt(a),
    "tanh": np.tanh, "erf": erf,
}


def step_gt(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gt(a, b): 1.0 where a > b, else 0.0 (a NaN operand compares false: 0)."""
    return np.greater(a, b).astype(np.float64)


class InterpError(Exception):
    """The program is not well formed at these sizes (bad store coverage, unknown name)."""


@dataclass
class _Buffer:
    array: np.ndarray  # shape: (stack extents at bind depth, with 1s) + own dims
    depth: int  # stack depth at binding


class _Env:
    def __init__(self, sizes: Mapping[str, int], tensors: dict[str, np.ndarray], contract: bool = True):
        self.sizes = dict(sizes)
        self.globals = tensors
        self.contract = contract
        # (name, first value, index array at its own depth): a bound index runs over
        # first, first + 1, …, one axis of the stack
        self.vars: list[tuple[str, int, np.ndarray]] = []
        self.locals: list[tuple[str, _Buffer]] = []

    @property
    def depth(self) -> int:
        return len(self.vars)

    def push(self, name: str, count: int, first: int = 0) -> None:
        d = self.depth
        self.vars.append((name, first, np.arange(first, first + count).reshape((1,) * d + (-1,))))

    def pop(self) -> None:
        self.vars.pop()

    def axis_of(self, name: str) -> int | None:
        for k in range(self.depth - 1, -1, -1):
            if self.vars[k][0] == name:
                return k
        return None

    def index(self, name: str) -> np.ndarray | int:
        k = self.axis_of(name)
        if k is not None:
            arr = self.vars[k][2]
            return arr.reshape(arr.shape + (1,) * (self.depth - arr.ndim))
        if name in self.sizes:
            return self.sizes[name]
        raise InterpError(f"unbound index {name}")

    def aff(self, a: Aff) -> np.ndarray:
        out: np.ndarray | int = a.const
        for n, c in a.terms:
            out = out + c * self.index(n)
        return _lift(np.asarray(out, dtype=np.int64), self.depth)

    def ext(self, x: Ext) -> np.ndarray:
        vals = []
        for num, div in x.parts:
            vals.append(-(-self.aff(num) // div))
        out = vals[0]
        for v in vals[1:]:
            out = np.minimum(out, v)
        return np.maximum(out, 0)

    def cond(self, conds: tuple[Cond, ...]) -> np.ndarray:
        out = np.ones((1,) * self.depth, dtype=bool)
        for c in conds:
            out = out & self.atom_or(c)
        return out

    def atom_or(self, c: Cond | Or | DataCond) -> np.ndarray:
        """One conjunct: a comparison, or a disjunction of comparisons (any holds), or a
        comparison of integer data (false where a read leaves its tensor: NaN compares false)."""
        if isinstance(c, DataSpan):
            return self.span(c)
        if isinstance(c, DataCond):
            lhs, rhs = self.side(c.lhs), self.side(c.rhs)
            return (lhs < rhs) if c.op == "<" else (lhs <= rhs) if c.op == "<=" else (lhs == rhs)
        if isinstance(c, Or):
            out = self.atom_or(c.parts[0])
            for p in c.parts[1:]:
                out = out | self.atom_or(p)
            return out
        lhs, rhs = self.aff(c.lhs), self.aff(c.rhs)
        return (lhs < rhs) if c.op == "<" else (lhs <= rhs)

    def span(self, c: DataSpan) -> np.ndarray:
        """A data-derived key-tile span (its private variables pushed over their ranges)."""
        d0 = self.depth
        for v, n in c.rows:
            self.push(v, n)
        try:
            q = self.side(c.query)
        finally:
            for _ in c.rows:
                self.pop()
        self.push(SPAN_KEY, _top(self.aff(c.key_dim)))
        try:
            k = self.side(c.key)
        finally:
            self.pop()
        return span_holds(q, tuple(range(d0, d0 + len(c.rows))), k, self.aff(c.tile), c.size)

    def side(self, s: Aff | DataRead) -> np.ndarray:
        if isinstance(s, Aff):
            return self.aff(s).astype(np.float64)
        if s.tensor not in self.globals:
            raise InterpError(f"unknown integer tensor {s.tensor}")
        return _gather_read(self, _Buffer(self.globals[s.tensor], 0), s.idx)

    def lookup(self, name: str) -> _Buffer:
        for n, buf in reversed(self.locals):
            if n == name:
                return buf
        if name in self.globals:
            return _Buffer(self.globals[name], 0)
        raise InterpError(f"unknown tensor {name}")


def _lift(a: np.ndarray, depth: int) -> np.ndarray:
    return a.reshape(a.shape + (1,) * (depth - a.ndim)) if a.ndim < depth else a


def _top(n: np.ndarray) -> int:
    return int(n.max()) if n.size else 0


def _read(env: _Env, e: Read) -> np.ndarray:
    buf = env.lookup(e.tensor)
    own = buf.array.ndim - buf.depth
    if own != len(e.idx):
        raise InterpError(f"{e.tensor} has rank {own}, read with {len(e.idx)} indices")
    view = _strided_read(env, buf, e.idx)
    return view if view is not None else _gather_read(env, buf, e.idx)


def _strided_read(env: _Env, buf: _Buffer, idx: tuple[Aff, ...]) -> np.ndarray | None:
    """The read as a strided view of the buffer (padded with NaN where an index leaves it):
    an affine index of the stack's index ranges is a strided walk through memory.  None when
    the padding would be much larger than the read."""
    arr, stack = buf.array, env.vars
    extents = [v[2].shape[-1] for v in stack]
    if 0 in extents or arr.size == 0:
        return None
    axis_of = {v[0]: k for k, v in enumerate(stack)}  # the innermost binding of a name wins
    bd, own = buf.depth, arr.shape[buf.depth:]
    starts, coefs, pad_lo, pad_hi = [], [], [], []
    for a, n in zip(idx, own):
        start, coef = a.const, {}
        for name, c in a.terms:
            axis = axis_of.get(name)
            if axis is None:
                start += c * env.index(name)
            else:
                start += c * stack[axis][1]
                coef[axis] = coef.get(axis, 0) + c
        lo = hi = start
        for axis, c in coef.items():
            if c < 0:
                lo += c * (extents[axis] - 1)
            else:
                hi += c * (extents[axis] - 1)
        starts.append(start)
        coefs.append(coef)
        pad_lo.append(max(0, -lo))
        pad_hi.append(max(0, hi - (n - 1)))
    src = arr
    if any(pad_lo) or any(pad_hi):
        padded = tuple(n + lo + hi for n, lo, hi in zip(own, pad_lo, pad_hi))
        shape = arr.shape[:bd] + padded
        if math.prod(shape) > 4 * math.prod(extents) + 4096:
            return None
        src = np.full(shape, np.nan)
        src[(slice(None),) * bd + tuple(slice(lo, lo + n) for lo, n in zip(pad_lo, own))] = arr
    d = len(stack)
    strides = [0] * d
    shape = [1] * d
    for j in range(bd):
        if src.shape[j] > 1:
            strides[j] += src.strides[j]
            shape[j] = extents[j]
    for k, coef in enumerate(coefs):
        step = src.strides[bd + k]
        for j, c in coef.items():
            if c:
                strides[j] += c * step
                shape[j] = extents[j]
    base = src[(slice(None, 1),) * bd + tuple(slice(s + lo, None) for s, lo in zip(starts, pad_lo))]
    return np.lib.stride_tricks.as_strided(base, tuple(shape), tuple(strides), writeable=False)


def _gather_read(env: _Env, buf: _Buffer, idx: tuple[Aff, ...]) -> np.ndarray:
    arr, d = buf.array, env.depth
    index: list[np.ndarray] = []
    for axis in range(buf.depth):
        n = arr.shape[axis]
        grid = np.zeros((1,) * d, dtype=np.int64) if n == 1 else np.arange(n).reshape(
            (1,) * axis + (n,) + (1,) * (d - axis - 1))
        index.append(grid)
    valid = np.ones((1,) * d, dtype=bool)
    for k, a in enumerate(idx):
        n = arr.shape[buf.depth + k]
        i = env.aff(a)
        valid = valid & (i >= 0) & (i < n)
        index.append(np.clip(i, 0, max(n - 1, 0)))
    if arr.size == 0:
        return np.full(np.broadcast_shapes(*(i.shape for i in index), valid.shape), np.nan)
    out = arr[tuple(index)] if index else arr.reshape((1,) * d)
    return out if valid.all() else np.where(valid, out, np.nan)


def _reduce_axis(env: _Env, var: str, ext: Ext, body: Expr) -> tuple[np.ndarray, np.ndarray]:
    """Evaluate body with var pushed; return (values broadcast over var axis, in-range mask)."""
    n = env.ext(ext)
    env.push(var, _top(n))
    try:
        vals = evaluate(env, body)
        live = env.index(var) < _lift(n, env.depth)
    finally:
        env.pop()
    shape = np.broadcast_shapes(vals.shape, live.shape)
    return np.broadcast_to(vals, shape), np.broadcast_to(live, shape)


# --------------------------------------------------------------------------- contractions


def _contract(env: _Env, e: Reduce) -> np.ndarray | None:
    """sum(var: [conds] ? a · b : 0) through a matrix product; None when it is not one."""
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
        # the two operands of the product as written: regrouping a product of three could
        # turn an underflow into 0 (0·inf = NaN where the definition has tiny·inf = inf)
        a, b = evaluate(env, body.a), evaluate(env, body.b)
        masks = [env.cond((c,)) for c in conds]
        if n.size != 1 or int(n.reshape(())) != top:
            masks.append(env.index(e.var) < _lift(n, env.depth))
    finally:
        env.pop()
    # The term is a·b where every guard holds and 0 elsewhere, whatever a·b is there.
    keep_a, keep_b = operand_keeps(masks, a, b)
    if not keep_a.all():
        a = np.where(keep_a, a, 0.0)
    if not keep_b.all():
        b = np.where(keep_b, b, 0.0)
    fin_a, fin_b = np.isfinite(a), np.isfinite(b)
    if fin_a.all() and fin_b.all():
        return _matmul_sum(a, b)
    return _nonfinite_sum(a, b, keep_a, keep_b, fin_a, fin_b)


# --------------------------------------------------------------------------- expressions


def _bind(env: _Env, b: Binding) -> _Buffer:
    depth = env.depth
    for v, x in b.dims:
        n = env.ext(x)
        if n.size != 1 and np.unique(n).size != 1:
            raise InterpError(f"buffer {b.name}: extent of {v} must not vary")
        env.push(v, _top(n))
    try:
        val = evaluate(env, b.value)
        full = tuple(
            arr.shape[-1] for _, _, arr in env.vars[depth:]
        )
        val = np.broadcast_to(val, val.shape[:depth] + full) if val.ndim >= depth else val
    finally:
        for _ in b.dims:
            env.pop()
    return _Buffer(np.asarray(val, dtype=np.float64), depth)


def _softmax(env: _Env, e: Softmax) -> np.ndarray:
    top = _top(env.ext(e.ext))
    env.push(e.var, top)
    try:
        score = evaluate(env, e.score)
        keep = softmax_keep(env, e)
    finally:
        env.pop()
    return pick_at(env, e, softmax_rows(env, score, keep, top), top)


def softmax_keep(env: _Env, e: Softmax) -> np.ndarray:
    """Where the softmax's row is live (its mask, its extent), with e.var pushed."""
    n = env.ext(e.ext)
    return env.cond(e.mask) & (env.index(e.var) < _lift(n, env.depth))


def softmax_rows(env: _Env, score: np.ndarray, keep: np.ndarray, top: int) -> np.ndarray:
    """The distribution over the softmax's index (the last axis; 0 off `keep`, a row without a
    live element all 0), computed once per point of the indices the score uses."""
    shape = np.broadcast_shapes(score.shape, keep.shape, (1,) * env.depth + (top,))
    keep = np.broadcast_to(keep, shape)
    score = np.where(keep, np.broadcast_to(score, shape), -np.inf)
    with np.errstate(all="ignore"):
        m = score.max(axis=-1, keepdims=True) if top else np.full(shape[:-1] + (1,), -np.inf)
        w = np.exp(score - np.where(np.isfinite(m), m, 0.0))
        w = np.where(keep, w, 0.0)
        total = w.sum(axis=-1, keepdims=True)
        return np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0)


def pick_at(env: _Env, e: Softmax, p: np.ndarray, top: int) -> np.ndarray:
    """A row array over the softmax's index (last axis) read at e.at (NaN outside the row)."""
    at = env.aff(e.at)
    d = env.depth
    valid = (at >= 0) & (at < top)
    if top == 0:
        return np.full(np.broadcast_shapes(p.shape[:-1], at.shape), np.nan)
    index: list[np.ndarray] = []
    for axis in range(d):
        k = p.shape[axis]
        index.append(np.zeros((1,) * d, dtype=np.int64) if k == 1 else np.arange(k).reshape(
            (1,) * axis + (k,) + (1,) * (d - axis - 1)))
    index.append(np.clip(at, 0, top - 1))
    picked = p[tuple(index)]
    return picked if valid.all() else np.where(valid, picked, np.nan)


def evaluate(env: _Env, e: Expr) -> np.ndarray:
    """Value of e broadcast over the current index stack (ndim == stack depth)."""
    d = env.depth
    if isinstance(e, Const):
        return np.full((1,) * d, e.value)
    if isinstance(e, Read):
        return _read(env, e)
    if isinstance(e, IndexValue):
        return _lift(env.aff(e.aff).astype(np.float64), d)
    if isinstance(e, Bin):
        a, b = evaluate(env, e.a), evaluate(env, e.b)
        with np.errstate(all="ignore"):
            if e.op == "+":
                return a + b
            if e.op == "-":
                return a - b
            if e.op == "*":
                return a * b
            if e.op == "/":  # the field convention: x / 0 = 0 (inv 0 = 0)
                return np.where(b == 0, 0.0, a / np.where(b == 0, 1.0, b))
            if e.op == "rescale":  # exp(a - b), and exactly 1 when a == b (also at -inf)
                return np.where(a == b, 1.0, np.exp(a - b))
            if e.op == "max":
                return np.maximum(a, b)
            if e.op == "gt":
                return step_gt(a, b)
        raise InterpError(f"unknown operator {e.op}")
    if isinstance(e, Un):
        a = evaluate(env, e.a)
        fn = UNARY.get(e.op)
        if fn is None:
            raise InterpError(f"unknown function {e.op}")
        with np.errstate(all="ignore"):
            return fn(a)
    if isinstance(e, Select):
        return np.where(env.cond(e.conds), evaluate(env, e.then), evaluate(env, e.other))
    if isinstance(e, Reduce):
        if e.op == "sum" and env.contract:
            out = _contract(env, e)
            if out is not None:
                return out
        vals, live = _reduce_axis(env, e.var, e.ext, e.body)
        with np.errstate(all="ignore"):
            if e.op == "sum":
                return np.where(live, vals, 0.0).sum(axis=-1)
            if e.op == "max":
                if vals.shape[-1] == 0:
                    return np.full(vals.shape[:-1], -np.inf)
                return np.where(live, vals, -np.inf).max(axis=-1)
        raise InterpError(f"unknown reduction {e.op}")
    if isinstance(e, Softmax):
        return _softmax(env, e)
    if isinstance(e, Let):
        env.locals.append((e.bind.name, _bind(env, e.bind)))
        try:
            return evaluate(env, e.body)
        finally:
            env.locals.pop()
    if isinstance(e, Fold):
        return _fold(env, e)
    raise InterpError(f"not an expression: {e!r}")


def _fold(env: _Env, e: Fold) -> np.ndarray:
    depth = env.depth
    state = [np.asarray(evaluate(env, x), dtype=np.float64) for x in e.init]
    n = env.ext(e.ext)
    for t in range(_top(n)):
        live = _lift(t < n, depth)
        for name, arr in zip(e.state, state):
            env.locals.append((name, _Buffer(arr, depth)))
        env.push(e.var, 1, t)
        pushed = len(e.state)
        try:
            for b in e.binds:
                env.locals.append((b.name, _bind(env, b)))
                pushed += 1
            new = [evaluate(env, u)[..., 0] for u in e.update]
        finally:
            env.pop()
            del env.locals[len(env.locals) - pushed:]
        state = [nv if live.all() else np.where(live, nv, old) for nv, old in zip(new, state)]
    for name, arr in zip(e.state, state):
        env.locals.append((name, _Buffer(arr, depth)))
    try:
        return evaluate(env, e.result)
    finally:
        del env.locals[len(env.locals) - len(e.state):]


# --------------------------------------------------------------------------- definitions


def shape_of(p: Program, name: str, sizes: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(a.evaluate(sizes) for a in p.tensor_type(name).dims)


def run_def(
    d: Def, sizes: Mapping[str, int], tensors: dict[str, np.ndarray], *, contract: bool = True
) -> np.ndarray:
    env = def_env(d, sizes, tensors, contract)
    return store_def(d, env, evaluate(env, d.body))


def def_env(d: Def, sizes: Mapping[str, int], tensors: dict[str, np.ndarray], contract: bool = True) -> _Env:
    """The environment a def's body is evaluated in: its loops pushed (a loop whose extent
    varies with outer indices runs to the largest, masked by `store_def`)."""
    env = _Env(sizes, tensors, contract)
    for lp in d.loops:
        env.push(lp.var, _top(env.ext(lp.ext)))
    return env


def store_def(d: Def, env: _Env, values: np.ndarray) -> np.ndarray:
    """The def's tensor from its body's values over its loops (each element written once)."""
    shape = tuple(a.evaluate(env.sizes) for a in d.type.dims)
    live = env.cond(d.guard)
    for k, lp in enumerate(d.loops):
        live = live & _loop_extent_mask(env, lp, k)
    full = tuple(arr.shape[-1] for _, _, arr in env.vars)
    every = bool(live.all())
    if every and _stores_in_loop_order(d, env, shape):  # each element once, in order: no index arithmetic
        out = np.empty(shape)
        out[...] = np.broadcast_to(values, full).reshape(shape)
        return out
    live = np.broadcast_to(live, full)
    values = np.broadcast_to(values, full)
    affs = [env.aff(a) for a in d.store]
    # Every live point's store index, flattened (C order) into the tensor.
    flat: np.ndarray | int = 0
    for k, (i, n) in enumerate(zip(affs, shape)):
        if not every:
            i = np.broadcast_to(i, full)[live]
        if i.size and live.size and (i.min() < 0 or i.max() >= n):
            raise InterpError(f"def {d.name} stores outside dimension {k} (extent {n})")
        flat = flat * n + i
    if every:
        flat = np.broadcast_to(flat, full).reshape(-1)
        stored = values.reshape(-1)
    else:
        flat = np.broadcast_to(flat, (int(live.sum()),))
        stored = values[live]
    out = np.full(shape, np.nan)
    count = np.bincount(flat, minlength=out.size).reshape(shape)
    out.reshape(-1)[flat] = stored
    if np.any(count != 1):
        bad = np.unravel_index(int(np.argmax(count != 1)), shape) if shape else ()
        raise InterpError(
            f"def {d.name} writes element {tuple(int(x) for x in bad)} "
            f"{int(count[tuple(bad)])} times (must be exactly once)"
        )
    return out


def _stores_in_loop_order(d: Def, env: _Env, shape: tuple[int, ...]) -> bool:
    """Whether the store index is the loop nest itself: dimension k written at the k-th loop's
    index, which runs over 0 … extent − 1 (the common `def C[i, j] = …`)."""
    if len(d.store) != len(env.vars) or len(shape) != len(env.vars) or len({v[0] for v in env.vars}) != len(env.vars):
        return False
    for a, (name, first, arr), n in zip(d.store, env.vars, shape):
        if a.const != 0 or len(a.terms) != 1 or a.terms[0] != (name, 1) or first != 0 or arr.shape[-1] != n:
            return False
    return True


def _loop_extent_mask(env: _Env, lp, k: int) -> np.ndarray:
    n = env.ext(lp.ext)
    arr = env.vars[k][2]
    return _lift(arr, env.depth) < n


def run_program(
    p: Program, sizes: Mapping[str, int], inputs: Mapping[str, np.ndarray], *, contract: bool = True
) -> dict[str, np.ndarray]:
    """Evaluate every def in order; returns all tensors (inputs included)."""
    tensors: dict[str, np.ndarray] = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    for d in p.defs:
        tensors[d.name] = run_def(d, sizes, tensors, contract=contract)
        for n, a in enumerate(d.also):  # further outputs: the tail fold's further results
            tensors[a.name] = run_def(also_def(d, n), sizes, tensors, contract=contract)
    return tensors


def random_inputs(
    p: Program, sizes: Mapping[str, int], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    from .int_inputs import int_input

    return {n: int_input(p, n, shape_of(p, n, sizes), sizes, rng) if t.dtype == "i32"
            else rng.standard_normal(shape_of(p, n, sizes)) for n, t in p.inputs}


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    """‖out − ref‖ / ‖ref‖, infinite when out has a NaN or the shapes differ.  An infinity of
    ref that out has too counts as exact (a fully masked row's log-sum-exp is -inf in both)."""
    if out.shape != ref.shape:
        return float("inf")
    same_inf = np.isinf(ref) & (out == ref)
    if same_inf.any():
        out, ref = np.where(same_inf, 0.0, out), np.where(same_inf, 0.0, ref)
    if not np.all(np.isfinite(out)):
        return float("inf")
    denom = _norm(ref)
    diff = _norm(out - ref)
    return diff / denom if denom else diff


def _norm(x: np.ndarray) -> float:
    """The 2-norm, scaled against overflow.  Not np.linalg.norm: its BLAS call wakes a thread
    pool, which on a loaded machine costs milliseconds per call."""
    a = np.abs(np.asarray(x, dtype=np.float64))
    top = float(a.max()) if a.size else 0.0
    if top == 0.0 or not np.isfinite(top):
        return top
    return top * float(np.sqrt(np.sum(np.square(a / top))))
