"""Reference interpreter: evaluates any program of the IR in float64 with numpy.

Evaluation is vectorised over the bound index variables: every bound variable owns one axis
of an array stack, so a `Reduce` pushes an axis and sums over it, and a `Def` evaluates its
body over the whole loop nest at once.  Extents may depend on outer indices (causal tile
truncation); such loops run to the largest extent with the excess masked out.

Out-of-bounds reads give NaN (a guarded branch discards them; an unguarded one poisons the
result), and every `Def` must write each element of its tensor exactly once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .ir import (
    Aff, Bin, Binding, Cond, Const, Def, Expr, Ext, Fold, Let, Program, Read, Reduce, Select,
    Softmax, Un,
)


class InterpError(Exception):
    """The program is not well formed at these sizes (bad store coverage, unknown name)."""


@dataclass
class _Buffer:
    array: np.ndarray  # shape: (stack extents at bind depth, with 1s) + own dims
    depth: int  # stack depth at binding


class _Env:
    def __init__(self, sizes: Mapping[str, int], tensors: dict[str, np.ndarray]):
        self.sizes = dict(sizes)
        self.globals = tensors
        self.vars: list[tuple[str, np.ndarray]] = []  # (name, index array at its own depth)
        self.locals: list[tuple[str, _Buffer]] = []

    @property
    def depth(self) -> int:
        return len(self.vars)

    def push(self, name: str, values: np.ndarray) -> None:
        d = self.depth
        self.vars.append((name, np.asarray(values).reshape((1,) * d + (-1,))))

    def pop(self) -> None:
        self.vars.pop()

    def index(self, name: str) -> np.ndarray | int:
        for v, arr in reversed(self.vars):
            if v == name:
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
            lhs, rhs = self.aff(c.lhs), self.aff(c.rhs)
            out = out & ((lhs < rhs) if c.op == "<" else (lhs <= rhs))
        return out

    def lookup(self, name: str) -> _Buffer:
        for n, buf in reversed(self.locals):
            if n == name:
                return buf
        if name in self.globals:
            return _Buffer(self.globals[name], 0)
        raise InterpError(f"unknown tensor {name}")


def _lift(a: np.ndarray, depth: int) -> np.ndarray:
    return a.reshape(a.shape + (1,) * (depth - a.ndim)) if a.ndim < depth else a


def _read(env: _Env, e: Read) -> np.ndarray:
    buf = env.lookup(e.tensor)
    arr, d = buf.array, env.depth
    own = arr.ndim - buf.depth
    if own != len(e.idx):
        raise InterpError(f"{e.tensor} has rank {own}, read with {len(e.idx)} indices")
    index: list[np.ndarray] = []
    for axis in range(buf.depth):
        n = arr.shape[axis]
        grid = np.zeros((1,) * d, dtype=np.int64) if n == 1 else np.arange(n).reshape(
            (1,) * axis + (n,) + (1,) * (d - axis - 1))
        index.append(grid)
    valid = np.ones((1,) * d, dtype=bool)
    for k, a in enumerate(e.idx):
        n = arr.shape[buf.depth + k]
        i = env.aff(a)
        valid = valid & (i >= 0) & (i < n)
        index.append(np.clip(i, 0, max(n - 1, 0)))
    if arr.size == 0:
        return np.full(np.broadcast_shapes(*(i.shape for i in index), valid.shape), np.nan)
    out = arr[tuple(index)] if index else arr.reshape((1,) * d)
    return np.where(valid, out, np.nan)


def _reduce_axis(env: _Env, var: str, ext: Ext, body: Expr) -> tuple[np.ndarray, np.ndarray]:
    """Evaluate body with var pushed; return (values broadcast over var axis, in-range mask)."""
    n = env.ext(ext)
    top = int(n.max()) if n.size else 0
    env.push(var, np.arange(top))
    try:
        vals = evaluate(env, body)
        live = env.index(var) < _lift(n, env.depth)
    finally:
        env.pop()
    shape = np.broadcast_shapes(vals.shape, live.shape)
    return np.broadcast_to(vals, shape), np.broadcast_to(live, shape)


def _bind(env: _Env, b: Binding) -> _Buffer:
    depth = env.depth
    for v, x in b.dims:
        n = env.ext(x)
        if n.size != 1 and np.unique(n).size != 1:
            raise InterpError(f"buffer {b.name}: extent of {v} must not vary")
        env.push(v, np.arange(int(n.max()) if n.size else 0))
    try:
        val = evaluate(env, b.value)
        full = tuple(
            arr.shape[-1] if arr.ndim else 1 for _, arr in env.vars[depth:]
        )
        val = np.broadcast_to(val, val.shape[:depth] + full) if val.ndim >= depth else val
    finally:
        for _ in b.dims:
            env.pop()
    return _Buffer(np.asarray(val, dtype=np.float64), depth)


def evaluate(env: _Env, e: Expr) -> np.ndarray:
    """Value of e broadcast over the current index stack (ndim == stack depth)."""
    d = env.depth
    if isinstance(e, Const):
        return np.full((1,) * d, e.value)
    if isinstance(e, Read):
        return _read(env, e)
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
        raise InterpError(f"unknown operator {e.op}")
    if isinstance(e, Un):
        a = evaluate(env, e.a)
        with np.errstate(all="ignore"):
            if e.op == "exp":
                return np.exp(a)
            if e.op == "neg":
                return -a
        raise InterpError(f"unknown function {e.op}")
    if isinstance(e, Select):
        return np.where(env.cond(e.conds), evaluate(env, e.then), evaluate(env, e.other))
    if isinstance(e, Reduce):
        vals, live = _reduce_axis(env, e.var, e.ext, e.body)
        if e.op == "sum":
            return np.where(live, vals, 0.0).sum(axis=-1)
        if e.op == "max":
            if vals.shape[-1] == 0:
                return np.full(vals.shape[:-1], -np.inf)
            return np.where(live, vals, -np.inf).max(axis=-1)
        raise InterpError(f"unknown reduction {e.op}")
    if isinstance(e, Softmax):
        at = env.aff(e.at)
        n = env.ext(e.ext)
        top = int(n.max()) if n.size else 0
        env.push(e.var, np.arange(top))
        try:
            score = evaluate(env, e.score)
            keep = env.cond(e.mask) & (env.index(e.var) < _lift(n, env.depth))
        finally:
            env.pop()
        shape = np.broadcast_shapes(score.shape, keep.shape, at.shape + (1,))
        score = np.where(np.broadcast_to(keep, shape), np.broadcast_to(score, shape), -np.inf)
        with np.errstate(all="ignore"):
            m = score.max(axis=-1, keepdims=True)
            w = np.exp(score - np.where(np.isfinite(m), m, 0.0))
            w = np.where(np.broadcast_to(keep, shape), w, 0.0)
            total = w.sum(axis=-1, keepdims=True)
            p = np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0)
        idx = np.broadcast_to(at, shape[:-1])[..., None]
        valid = (idx >= 0) & (idx < top)
        picked = np.take_along_axis(p, np.clip(idx, 0, max(top - 1, 0)), axis=-1)
        return np.where(valid, picked, np.nan)[..., 0]
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
    steps = int(n.max()) if n.size else 0
    for t in range(steps):
        live = _lift(t < n, depth)
        for name, arr in zip(e.state, state):
            env.locals.append((name, _Buffer(arr, depth)))
        env.push(e.var, np.array([t]))
        pushed = len(e.state)
        try:
            for b in e.binds:
                env.locals.append((b.name, _bind(env, b)))
                pushed += 1
            new = [evaluate(env, u)[..., 0] for u in e.update]
        finally:
            env.pop()
            del env.locals[len(env.locals) - pushed:]
        state = [np.where(live, nv, old) for nv, old in zip(new, state)]
    for name, arr in zip(e.state, state):
        env.locals.append((name, _Buffer(arr, depth)))
    try:
        return evaluate(env, e.result)
    finally:
        del env.locals[len(env.locals) - len(e.state):]


def shape_of(p: Program, name: str, sizes: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(a.evaluate(sizes) for a in p.tensor_type(name).dims)


def run_def(d: Def, sizes: Mapping[str, int], tensors: dict[str, np.ndarray]) -> np.ndarray:
    env = _Env(sizes, tensors)
    shape = tuple(a.evaluate(sizes) for a in d.type.dims)
    for lp in d.loops:
        n = env.ext(lp.ext)
        env.push(lp.var, np.arange(int(n.max()) if n.size else 0))
        # a loop whose extent varies with outer indices is masked below
    values = evaluate(env, d.body)
    live = env.cond(d.guard)
    for k, lp in enumerate(d.loops):
        env_n = _loop_extent_mask(env, lp, k)
        live = live & env_n
    full = tuple(arr.shape[-1] for _, arr in env.vars)
    live = np.broadcast_to(live, full)
    values = np.broadcast_to(values, full)
    idx = [np.broadcast_to(env.aff(a), full)[live] for a in d.store]
    out = np.full(shape, np.nan)
    count = np.zeros(shape, dtype=np.int64)
    for k, (i, n) in enumerate(zip(idx, shape)):
        if i.size and (i.min() < 0 or i.max() >= n):
            raise InterpError(f"def {d.name} stores outside dimension {k} (extent {n})")
    if shape and idx:
        np.add.at(count, tuple(idx), 1)
        out[tuple(idx)] = values[live]
    elif not shape:
        count[()] = int(live.sum())
        if live.any():
            out[()] = values[live][0]
    if np.any(count != 1):
        bad = np.argwhere(count != 1)[0]
        raise InterpError(
            f"def {d.name} writes element {tuple(int(x) for x in bad)} "
            f"{int(count[tuple(bad)])} times (must be exactly once)"
        )
    return out


def _loop_extent_mask(env: _Env, lp, k: int) -> np.ndarray:
    n = env.ext(lp.ext)
    name, arr = env.vars[k]
    return _lift(arr, env.depth) < n


def run_program(
    p: Program, sizes: Mapping[str, int], inputs: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Evaluate every def in order; returns all tensors (inputs included)."""
    tensors: dict[str, np.ndarray] = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    for d in p.defs:
        tensors[d.name] = run_def(d, sizes, tensors)
    return tensors


def random_inputs(
    p: Program, sizes: Mapping[str, int], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    return {n: rng.standard_normal(shape_of(p, n, sizes)) for n, _ in p.inputs}


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    """‖out − ref‖ / ‖ref‖, infinite when out has a NaN or the shapes differ."""
    if out.shape != ref.shape or not np.all(np.isfinite(out)):
        return float("inf")
    denom = float(np.linalg.norm(ref))
    diff = float(np.linalg.norm(out - ref))
    return diff / denom if denom else diff
