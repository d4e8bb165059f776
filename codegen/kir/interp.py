"""Kernel-IR interpreter (float64, numpy): the translation validation of every build.

It evaluates a `Kernel` the way the GPU runs it — every block of the grid, every lane point of
the block, each tile loop iteration in order with its state carried — vectorised over blocks
and lanes with named axes, and independently of the derivation IR's interpreter.  Reads outside
a tensor or buffer give NaN (only a guard may discard them), a tile loop past its extent leaves
the state unchanged, and the store must write every output element exactly once.

`validate(kernel, program, sizes, seed)` compares it with the final program's interpreter on
fresh random inputs; `rel_error` ≤ 1e-12 or the build stops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from compiler.derive import checked_outputs, output_error
from compiler.int_inputs import span_holds
from compiler.interp import UNARY, random_inputs, run_program, step_gt
from compiler.ir import (
    SPAN_KEY, BINARY_OPERATORS, UNARY_FUNCTIONS, Aff, Bin, Cond, DataCond, DataRead, DataSpan, Or, Const, Expr, Ext, IndexValue, Program, Read, Reduce, Select, Un,
)

from .ir import Compute, Kernel, Stage, Stmt, Store, TileLoop


class KirError(Exception):
    """The kernel IR is not well formed at these sizes (unknown name, bad store coverage)."""


@dataclass(frozen=True)
class _V:
    """An array whose axes are named: arr.ndim == len(dims)."""

    arr: np.ndarray
    dims: tuple[str, ...]


def _align(*vs: _V) -> tuple[tuple[str, ...], list[np.ndarray]]:
    dims: list[str] = []
    for v in vs:
        for d in v.dims:
            if d not in dims:
                dims.append(d)
    out = []
    for v in vs:
        order = [v.dims.index(d) for d in dims if d in v.dims]
        a = np.transpose(v.arr, order) if order else v.arr
        shape = [a.shape[order.index(v.dims.index(d))] if d in v.dims else 1 for d in dims]
        out.append(a.reshape(shape))
    return tuple(dims), out


def _lift(fn, *vs: _V) -> _V:
    dims, arrs = _align(*vs)
    with np.errstate(all="ignore"):
        res = fn(*arrs)
    return _V(np.asarray(res), dims)


def _scalar(x: float) -> _V:
    return _V(np.asarray(x, dtype=np.float64), ())


class _Buf:
    def __init__(self, value: _V, own: tuple[str, ...]):
        self.value, self.own = value, own  # own: axis names of the buffer's own dims, in order


class _Env:
    def __init__(self, k: Kernel, sizes: Mapping[str, int], tensors: Mapping[str, np.ndarray]):
        self.k = k
        self.sizes = dict(sizes)
        self.bufs: dict[str, _Buf] = {}
        for t in k.inputs:
            arr = np.asarray(tensors[t.name], dtype=np.float64)
            own = tuple(f"{t.name}#{i}" for i in range(arr.ndim))
            self.bufs[t.name] = _Buf(_V(arr, own), own)
        self.axes: dict[str, _V] = {}
        self._counter = 0

    # -- indices
    def bind(self, var: str, n: int) -> None:
        self.axes[var] = _V(np.arange(n, dtype=np.int64), (var,))

    def index(self, name: str) -> _V:
        if name in self.axes:
            return self.axes[name]
        if name in self.sizes:
            return _V(np.asarray(self.sizes[name], dtype=np.int64), ())
        raise KirError(f"unbound index {name}")

    def aff(self, a: Aff) -> _V:
        out = _V(np.asarray(a.const, dtype=np.int64), ())
        for n, c in a.terms:
            out = _lift(lambda x, y, c=c: x + c * y, out, self.index(n))
        return out

    def ext(self, x: Ext) -> _V:
        out: _V | None = None
        for num, div in x.parts:
            v = _lift(lambda a, d=div: -(-a // d), self.aff(num))
            out = v if out is None else _lift(np.minimum, out, v)
        assert out is not None
        return _lift(lambda a: np.maximum(a, 0), out)

    def cond(self, conds: tuple[Cond, ...]) -> _V:
        out = _V(np.asarray(True), ())
        for c in conds:
            out = _lift(lambda o, a: o & a, out, self.atom_or(c))
        return out

    def atom_or(self, c: Cond | Or | DataCond) -> _V:
        """One conjunct: a comparison, or a disjunction of comparisons (any holds), or a
        comparison of integer data (a read outside its tensor is NaN: compares false)."""
        if isinstance(c, DataSpan):
            return self.span(c)
        if isinstance(c, DataCond):
            cmp = {"<": np.less, "<=": np.less_equal, "==": np.equal}[c.op]
            return _lift(lambda a, b: cmp(a, b), self.side(c.lhs), self.side(c.rhs))
        if isinstance(c, Or):
            out = self.atom_or(c.parts[0])
            for p in c.parts[1:]:
                out = _lift(lambda a, b: a | b, out, self.atom_or(p))
            return out
        cmp = np.less if c.op == "<" else np.less_equal
        return _lift(lambda a, b: cmp(a, b), self.aff(c.lhs), self.aff(c.rhs))

    def span(self, c: DataSpan) -> _V:
        """A data-derived key-tile span: its private variables bound over their ranges."""
        rows = tuple(v for v, _ in c.rows)
        for v, n in c.rows:
            self.bind(v, n)
        q = self.side(c.query)
        for v in rows:
            del self.axes[v]
        self.bind(SPAN_KEY, int(self.aff(c.key_dim).arr))
        k = self.side(c.key)
        del self.axes[SPAN_KEY]
        t = self.aff(c.tile)
        outer = tuple(dict.fromkeys(d for v in (q, k, t) for d in v.dims if d not in rows and d != SPAN_KEY))
        anchor = _V(np.zeros((1,) * (len(outer) + len(rows) + 1)), outer + rows + (SPAN_KEY,))
        _, (_, qa, ka, ta) = _align(anchor, q, k, t)
        n = len(outer)
        qa, ka, ta = qa[..., 0], ka.reshape(ka.shape[:n] + ka.shape[-1:]), ta.reshape(ta.shape[:n])
        return _V(span_holds(qa, tuple(range(n, n + len(rows))), ka, ta, c.size), outer)

    def side(self, s: Aff | DataRead) -> _V:
        return self.read(Read(s.tensor, s.idx)) if isinstance(s, DataRead) else \
            _lift(lambda a: a.astype(np.float64), self.aff(s))

    # -- values
    def read(self, e: Read) -> _V:
        if e.tensor not in self.bufs:
            raise KirError(f"read of unknown tensor or buffer {e.tensor}")
        buf = self.bufs[e.tensor]
        if len(e.idx) != len(buf.own):
            raise KirError(f"{e.tensor} has rank {len(buf.own)}, read with {len(e.idx)} indices")
        val = buf.value
        dep = tuple(d for d in val.dims if d not in buf.own)
        order = [val.dims.index(d) for d in dep + buf.own]
        arr = np.transpose(val.arr, order) if order else val.arr
        idx = [self.aff(a) for a in e.idx]
        dep_v = [_V(np.arange(arr.shape[i], dtype=np.int64), (d,)) for i, d in enumerate(dep)]
        dims, parts = _align(*dep_v, *idx, _V(np.asarray(0), ()))
        parts = parts[:-1]
        shape = np.broadcast_shapes(*(p.shape for p in parts)) if parts else ()
        valid = np.ones(shape, dtype=bool)
        index = []
        for k, p in enumerate(parts):
            n = arr.shape[k]
            if k >= len(dep):
                valid = valid & (p >= 0) & (p < n)
            index.append(np.clip(p, 0, max(n - 1, 0)))
        if arr.size == 0:
            return _V(np.full(shape, np.nan), dims)
        got = arr[tuple(index)] if index else arr
        return _V(np.where(valid, got, np.nan), dims)

    def eval(self, e: Expr) -> _V:
        if isinstance(e, Const):
            return _scalar(float(e.value))
        if isinstance(e, Read):
            return self.read(e)
        if isinstance(e, IndexValue):
            v = self.aff(e.aff)
            return _V(v.arr.astype(np.float64), v.dims)
        if isinstance(e, Bin):
            a, b = self.eval(e.a), self.eval(e.b)
            fn = _BINARY.get(e.op)
            if fn is None:
                raise KirError(f"unknown operator {e.op}")
            return _lift(fn, a, b)
        if isinstance(e, Un):
            fn = _UNARY.get(e.op)
            if fn is None:
                raise KirError(f"unknown function {e.op}")
            with np.errstate(all="ignore"):
                return _lift(fn, self.eval(e.a))
        if isinstance(e, Select):
            return _lift(np.where, self.cond(e.conds), self.eval(e.then), self.eval(e.other))
        if isinstance(e, Reduce):
            return self.reduce(e)
        raise KirError(f"not a kernel-IR expression: {type(e).__name__}")

    def reduce(self, e: Reduce) -> _V:
        n = self.ext(e.ext)
        top = int(n.arr.max()) if n.arr.size else 0
        axis = self.fresh(e.var)
        saved = self.axes.get(e.var)
        self.axes[e.var] = _V(np.arange(top, dtype=np.int64), (axis,))
        try:
            body = self.eval(e.body)
            live = _lift(lambda i, m: i < m, self.axes[e.var], n)
        finally:
            if saved is None:
                del self.axes[e.var]
            else:
                self.axes[e.var] = saved
        neutral = 0.0 if e.op == "sum" else -np.inf
        masked = _lift(lambda v, ok: np.where(ok, v, neutral), body, live)
        full = _lift(lambda v, i: v + 0 * i, masked, _V(np.arange(top), (axis,)))
        pos = full.dims.index(axis)
        arr = full.arr.sum(axis=pos) if e.op == "sum" else (
            full.arr.max(axis=pos) if top else np.full(np.delete(np.array(full.arr.shape), pos), -np.inf))
        return _V(np.asarray(arr, dtype=np.float64), full.dims[:pos] + full.dims[pos + 1:])

    def fresh(self, var: str) -> str:
        self._counter += 1
        return f"{var}#{self._counter}"

    # -- statements
    def run(self, body: tuple[Stmt, ...]) -> None:
        for s in body:
            if isinstance(s, (Stage, Compute)):
                own = tuple(self.fresh(v) for v, _ in s.buf.dims)
                saved = {v: self.axes.get(v) for v, _ in s.buf.dims}
                for (v, n), ax in zip(s.buf.dims, own):
                    self.axes[v] = _V(np.arange(n, dtype=np.int64), (ax,))
                try:
                    val = self.eval(s.value)
                    for ax, (_, n) in zip(own, s.buf.dims):  # every element of the tile exists
                        val = _lift(lambda a, i: a + 0 * i, val, _V(np.arange(n), (ax,)))
                finally:
                    for v, old in saved.items():
                        if old is None:
                            del self.axes[v]
                        else:
                            self.axes[v] = old
                self.bufs[s.buf.name] = _Buf(val, own)
            elif isinstance(s, TileLoop):
                self.loop(s)
            else:
                raise KirError(f"not a kernel-IR statement: {type(s).__name__}")

    def loop(self, s: TileLoop) -> None:
        state = {st.name: self.eval(st.init) for st in s.state}
        n = self.ext(s.ext)
        steps = int(n.arr.max()) if n.arr.size else 0
        for t in range(steps):
            for name, v in state.items():
                self.bufs[name] = _Buf(v, ())
            self.axes[s.var] = _V(np.asarray(t, dtype=np.int64), ())
            self.run(s.body)
            new = {st.name: self.eval(st.update) for st in s.state}
            live = _lift(lambda m: t < m, n)
            state = {k: _lift(np.where, live, new[k], state[k]) for k in state}
        self.axes.pop(s.var, None)
        for name, v in state.items():
            self.bufs[name] = _Buf(v, ())


_BINARY = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "max": np.maximum,
    "/": lambda a, b: np.where(b == 0, 0.0, a / np.where(b == 0, 1.0, b)),  # the field's x / 0 = 0
    "rescale": lambda a, b: np.where(a == b, 1.0, np.exp(a - b)), "gt": step_gt,
}
_UNARY = UNARY  # the reference interpreter's functions: one meaning of each
assert set(_BINARY) == set(BINARY_OPERATORS) and set(_UNARY) == set(UNARY_FUNCTIONS)


def run_kernel(k: Kernel, sizes: Mapping[str, int], tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    """The output tensor the kernel writes, float64; NaN where nothing was written."""
    return run_kernel_outputs(k, sizes, tensors)[k.store.tensor]


def run_kernel_outputs(k: Kernel, sizes: Mapping[str, int], tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output tensor the kernel writes (the store's and the `also` stores'), float64."""
    env = _Env(k, sizes, tensors)
    for g in k.grid:
        n = env.ext(g.ext)
        if n.arr.ndim:
            raise KirError(f"grid extent of {g.var} varies")
        env.bind(g.var, int(n.arr))
    for ln in k.lanes:
        env.bind(ln.var, ln.extent if ln.extent is not None else ln.ext.evaluate(sizes))
    env.run(k.body)
    return {st.tensor: _store(env, k, st, sizes) for st in k.stores}


def _store(env: _Env, k: Kernel, store: Store, sizes: Mapping[str, int]) -> np.ndarray:
    value = env.eval(store.value)
    live = env.cond(store.guard)
    idx = [env.aff(a) for a in store.index]
    every = [env.index(g.var) for g in k.grid] + [env.index(ln.var) for ln in k.lanes]
    dims, parts = _align(value, live, *idx, *every)
    shape = np.broadcast_shapes(*(p.shape for p in parts))
    value_a, live_a = np.broadcast_to(parts[0], shape), np.broadcast_to(parts[1], shape)
    out_shape = tuple(a.evaluate(sizes) for a in k.tensor(store.tensor).dims)
    out = np.full(out_shape, np.nan)
    count = np.zeros(out_shape, dtype=np.int64)
    where = [np.broadcast_to(p, shape)[live_a] for p in parts[2:2 + len(idx)]]
    for axis, (i, n) in enumerate(zip(where, out_shape)):
        if i.size and (i.min() < 0 or i.max() >= n):
            raise KirError(f"the store writes outside dimension {axis} of {store.tensor} (extent {n})")
    if out_shape:
        np.add.at(count, tuple(where), 1)
        out[tuple(where)] = value_a[live_a]
    else:
        count[()] = int(live_a.sum())
        if live_a.any():
            out[()] = value_a[live_a][0]
    if np.any(count != 1):
        bad = tuple(int(x) for x in np.argwhere(count != 1)[0])
        raise KirError(f"the store writes element {bad} of {store.tensor} {int(count[bad])} times (must be once)")
    return out


def validate(k: Kernel, program: Program, sizes: Mapping[str, int], seed: int) -> dict:
    """Kernel IR vs the final program on fresh random inputs: {sizes, seed, rel_error}."""
    rng = np.random.default_rng(seed)
    inputs = random_inputs(program, sizes, rng)
    tensors = run_program(program, sizes, inputs)  # with the tensors other steps write
    got = run_kernel_outputs(k, sizes, tensors)
    outputs = checked_outputs(program)
    if set(got) != set(outputs):
        raise KirError(f"the kernel writes {sorted(got)}, the program's outputs are {sorted(outputs)}")
    err = max(output_error(got[n], tensors[n]) for n in outputs)
    return {"sizes": dict(sizes), "seed": seed, "rel_error": err}
