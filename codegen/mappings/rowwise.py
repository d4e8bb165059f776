"""Row-wise mapping: one thread block per row, the row in registers, row reductions as block
reductions (warp shuffles, then one shared-memory exchange between the warps).

The kernel shape it implements (read off the kernel IR, every part compared; anything else is
refused by name and the next mapping — SIMT — prints the kernel):

- the grid enumerates rows (any grid variables); ONE lane dimension, the column c < C of the
  row, mapped to `thread(NT)` by PARALLEL: thread t owns the vectors (k·NT + t)·V … + V−1 of
  the row (V elements per 16-byte access at most, V divides C; a last partial sweep is
  guarded);
- `stage` of a whole row `T[lead, r0]`, r0 < C, at the register level (the CACHE of the row):
  each thread loads its own vectors once and keeps them as floats;
- `compute` of a scalar whose value is built from constants, sizes, earlier scalars, per-row
  reads and row reductions `sum|max(k < C: body)` with an element-wise body in k: each thread
  reduces its own columns, then the block combines the partial values (the sum / max over the
  whole row, in another association: exact in the algebra, a float reordering);
- a `for` over column tiles carrying state (ONLINE-AGG's running max and sum) is refused;
- the store `Out[lead, c]` without a guard, with an element-wise value in c.

Element-wise values read the cached rows at their own column, other tensors at [lead…, column]
(vector loads) or at a per-row index (one load), scalars, sizes and the column as a value.
Reading a cached row at another column, a reduction inside an element-wise value, a buffer with
more than one dimension, a shared-memory row, or a dynamic row length is refused by name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.ir import Aff, Bin, Const, Expr, IndexValue, Read, Reduce, Select, Un
from compiler.machine import DTYPES

from ..cexpr import aff_c, conds_c, index_value_c, size_names, unary_c
from ..kir import Compute, Kernel, Stage, TileLoop
from ..lower import UnsupportedMapping
from ..source import KernelSource, Launch
from ..templates_env import render_template

NAME = "rowwise"
_RAW = {16: "uint4", 8: "uint2", 4: "unsigned", 2: "unsigned short"}


def _refuse(what: str) -> UnsupportedMapping:
    return UnsupportedMapping(f"rowwise mapping: {what}")


@dataclass(frozen=True)
class RowPlan:
    """The instruction choices: threads per row, vector width, vectors per thread."""

    threads: int
    row: int  # C, the row length (elements)
    vec: int  # elements per vector access
    sweeps: int  # vectors per thread
    tail: bool  # the last sweep is partly past the row end (guarded)
    rows_cached: tuple[str, ...]
    reductions: tuple[str, ...]


def _fixed(a: Aff, k: Kernel) -> int | None:
    for n, v in k.fixed().items():
        a = a.subst(n, Aff.lit(v))
    return a.const if a.is_const() else None


class _Printer:
    def __init__(self, k: Kernel):
        self.k = k
        if len(k.lanes) != 1:
            raise _refuse(f"the kernel is not one row per block: {len(k.lanes)} lane dimensions (one column loop expected)")
        lane = k.lanes[0]
        m = lane.mapping
        if m is None or m.level != "thread" or not m.count:
            raise _refuse(f"the kernel is not one row per block: column loop {lane.var} is not mapped to threads "
                          "(PARALLEL to: thread with a count)")
        if m.count % 32 or m.count > 1024:
            raise _refuse(f"{m.count} threads per row is not a whole number of warps (at most 1024)")
        self.col, self.row, self.threads = lane.var, lane.extent, m.count
        self.grid_vars = {g.var for g in k.grid}
        self.names = size_names(k.sizes)
        for g in k.grid:
            self.names[g.var] = f"v_{g.var}"
        width = min(DTYPES[t.dtype].bytes for t in k.tensors)
        self.vec = next(v for v in (16 // width, 8, 4, 2, 1) if v <= 16 // width and self.row % v == 0)
        self.sweeps = -(-self.row // (self.threads * self.vec))
        self.tail = self.row % (self.threads * self.vec) != 0
        self.cached: dict[str, str] = {}  # row buffer -> source tensor
        self.scalars: set[str] = set()
        self.reductions: list[str] = []
        self.tmp = 0
        self.lines: list[str] = []

    # ------------------------------------------------------------------ helpers
    def fresh(self, base: str) -> str:
        self.tmp += 1
        return f"{base}{self.tmp}"

    def strides(self, name: str) -> list[str]:
        dims = self.k.tensor(name).dims
        out, acc = [], "1LL"
        for d in reversed(dims):
            out.append(acc)
            acc = f"{acc} * (long long){aff_c(d, self.names)}"
        return list(reversed(out))

    def row_lead(self, r: Read, what: str) -> tuple[Aff, ...]:
        """The read's leading indices, which must use grid variables and sizes only."""
        lead = r.idx[:-1]
        sizes = {n for n, _ in self.k.sizes}
        for a in lead:
            if not a.names() <= self.grid_vars | sizes:
                raise _refuse(f"{what}: index {a} of {r.tensor} is not a row index (grid variables and sizes only)")
        return lead

    def offset(self, name: str, lead: tuple[Aff, ...], last: str) -> str:
        parts = [f"(long long){aff_c(a, self.names)} * {s}" for a, s in zip(lead, self.strides(name))]
        return " + ".join(parts + [last])

    def row_dim_ok(self, name: str) -> None:
        n = _fixed(self.k.tensor(name).dims[-1], self.k)
        if n != self.row:
            raise _refuse(f"tensor {name}'s last dimension {self.k.tensor(name).dims[-1]} is not the row length {self.row}")

    def load_vec(self, name: str, off: str, dst: str) -> list[str]:
        dt = DTYPES[self.k.tensor(name).dtype]
        nbytes = dt.bytes * self.vec
        piece = min(16, nbytes)
        n = nbytes // piece
        u = self.fresh("u_")
        return [f"union {{ {_RAW[piece]} v[{n}]; {dt.ctype} e[{self.vec}]; }} {u};",
                f"#pragma unroll", f"for (int p_ = 0; p_ < {n}; ++p_) "
                f"{u}.v[p_] = reinterpret_cast<const {_RAW[piece]}*>(p_{name} + {off})[p_];",
                f"float {dst}[{self.vec}];",
                f"#pragma unroll", f"for (int j = 0; j < {self.vec}; ++j) {dst}[j] = {dt.name}_to_f32({u}.e[j]);"]

    def sweep(self, body: list[str]) -> list[str]:
        """Run body for each of this thread's vectors (k, col0); j indexes the vector."""
        head = ["#pragma unroll", f"for (int k = 0; k < {self.sweeps}; ++k) {{",
                f"    const long long col0 = ((long long)k * {self.threads} + threadIdx.x) * {self.vec};"]
        if self.tail:
            return head + [f"    if (col0 < {self.row}LL) {{"] + ["        " + x for x in body] + ["    }", "}"]
        return head + ["    " + x for x in body] + ["}"]

    # ------------------------------------------------------------------ element-wise values
    def elementwise(self, e: Expr, var: str) -> tuple[list[str], str]:
        """(loads for one vector, the value at element j of it) of an element-wise value in var."""
        loads: list[str] = []
        seen: dict[Read, str] = {}
        names = dict(self.names)
        names[var] = "(col0 + j)"

        def go(x: Expr) -> str:
            if isinstance(x, Const):
                if math.isinf(x.value):
                    return "neg_inf()" if x.value < 0 else "(-neg_inf())"
                return f"{float(x.value)!r}f"
            if isinstance(x, Read):
                if x.tensor in self.cached:
                    if x.idx != (Aff.of(var),):
                        raise _refuse(f"the cached row {x.tensor} is read at {x.idx[0]}, not at its own column {var}")
                    return f"xb_{x.tensor}[k][j]"
                if x.tensor in self.scalars and not x.idx:
                    return f"sc_{x.tensor}"
                return self.tensor_read(x, var, loads, seen)
            if isinstance(x, IndexValue):
                return index_value_c(x.aff, names)
            if isinstance(x, Bin):
                a, b = go(x.a), go(x.b)
                return self.binary(x.op, a, b)
            if isinstance(x, Un):
                return unary_c(x.op, go(x.a))
            if isinstance(x, Select):
                return f"({conds_c(x.conds, names)} ? {go(x.then)} : {go(x.other)})"
            if isinstance(x, Reduce):
                raise _refuse(f"a reduction over {x.var} inside an element-wise value (over {var})")
            raise _refuse(f"no element-wise form for {type(x).__name__}")

        return loads, go(e)

    def tensor_read(self, x: Read, var: str, loads: list[str], seen: dict[Read, str]) -> str:
        if x.tensor not in {t.name for t in self.k.inputs}:
            raise _refuse(f"read of {x.tensor}, which is neither an input, a cached row nor a scalar")
        if x in seen:
            return seen[x]
        if not x.idx:
            raise _refuse(f"rank-0 tensor {x.tensor}")
        last = x.idx[-1]
        if var in last.names() or any(var in a.names() for a in x.idx[:-1]):
            if last != Aff.of(var):
                raise _refuse(f"{x.tensor} is read at column {last}, not at {var}")
            lead = self.row_lead(x, f"read of {x.tensor}")
            self.row_dim_ok(x.tensor)
            dst = self.fresh("rd_")
            loads += self.load_vec(x.tensor, self.offset(x.tensor, lead, "col0"), dst)
            seen[x] = f"{dst}[j]"
        else:
            sizes = {n for n, _ in self.k.sizes}
            for a in x.idx:
                if not a.names() <= self.grid_vars | sizes:
                    raise _refuse(f"{x.tensor}[{', '.join(map(str, x.idx))}]: index {a} is neither a row nor a column index")
            dt = DTYPES[self.k.tensor(x.tensor).dtype]
            off = " + ".join(f"(long long){aff_c(a, self.names)} * {s}" for a, s in zip(x.idx, self.strides(x.tensor)))
            seen[x] = f"{dt.name}_to_f32(p_{x.tensor}[{off}])"
        return seen[x]

    @staticmethod
    def binary(op: str, a: str, b: str) -> str:
        if op in ("+", "-", "*"):
            return f"({a} {op} {b})"
        if op == "/":
            return f"div0({a}, {b})"
        if op == "max":
            return f"fmaxf({a}, {b})"
        if op == "rescale":
            return f"rescale({a}, {b})"
        raise _refuse(f"operator {op}")

    # ------------------------------------------------------------------ per-row (scalar) values
    def scalar(self, e: Expr) -> str:
        if isinstance(e, Const):
            if math.isinf(e.value):
                return "neg_inf()" if e.value < 0 else "(-neg_inf())"
            return f"{float(e.value)!r}f"
        if isinstance(e, Read):
            if e.tensor in self.scalars and not e.idx:
                return f"sc_{e.tensor}"
            if e.tensor in self.cached:
                raise _refuse(f"the cached row {e.tensor} is read outside a row reduction or the store")
            if any(self.col in a.names() for a in e.idx):
                raise _refuse(f"a per-row value reads {e.tensor} at the column {self.col}")
            return self.tensor_read(e, self.col, [], {})
        if isinstance(e, IndexValue):
            if self.col in e.aff.names():
                raise _refuse(f"a per-row value uses the column {self.col}")
            return index_value_c(e.aff, self.names)
        if isinstance(e, Bin):
            return self.binary(e.op, self.scalar(e.a), self.scalar(e.b))
        if isinstance(e, Un):
            return unary_c(e.op, self.scalar(e.a))
        if isinstance(e, Select):
            if any(self.col in c.names() for c in e.conds):
                raise _refuse(f"a per-row value has a condition on the column {self.col}")
            return f"({conds_c(e.conds, self.names)} ? {self.scalar(e.then)} : {self.scalar(e.other)})"
        if isinstance(e, Reduce):
            return self.row_reduce(e)
        raise _refuse(f"no per-row form for {type(e).__name__}")

    def row_reduce(self, e: Reduce) -> str:
        if e.op not in ("sum", "max"):
            raise _refuse(f"reduction {e.op}")
        if e.mma is not None:
            raise _refuse(f"the row reduction over {e.var} is mapped to {e.mma.instr}")
        n = e.ext.single()[0] if len(e.ext.parts) == 1 and e.ext.parts[0][1] == 1 else None
        if n is None or _fixed(n, self.k) != self.row:
            raise _refuse(f"the reduction over {e.var} < {e.ext} does not span the row of {self.row} columns")
        loads, value = self.elementwise(e.body, e.var)
        acc = self.fresh("red_")
        init, step = ("0.0f", f"{acc} += v_;") if e.op == "sum" else ("neg_inf()", f"{acc} = fmaxf({acc}, v_);")
        self.lines.append(f"float {acc} = {init};")
        self.lines += self.sweep(loads + ["#pragma unroll", f"for (int j = 0; j < {self.vec}; ++j) {{",
                                          f"    const float v_ = {value}; {step}", "}"])
        self.lines.append(f"{acc} = block_{e.op}<{self.threads // 32}>({acc}, red_smem_);")
        self.reductions.append(f"{e.op} over {e.var}")
        return acc

    # ------------------------------------------------------------------ statements
    def stage(self, s: Stage) -> None:
        b = s.buf
        if len(b.dims) != 1 or b.dims[0][1] != self.row:
            raise _refuse(f"staged buffer {b.name} is not one row of {self.row} elements")
        if b.level != "register":
            raise _refuse(f"staged buffer {b.name} is at level {b.level}; this mapping keeps rows in registers")
        if b.stages != 1:
            raise _refuse(f"staged buffer {b.name} asks for {b.stages} pipeline stages")
        r0 = b.dims[0][0]
        v = s.value
        if not (isinstance(v, Read) and v.tensor == b.source and v.idx and v.idx[-1] == Aff.of(r0)):
            raise _refuse(f"staged buffer {b.name} is not a plain row copy {b.source}[…, {r0}]")
        lead = self.row_lead(v, f"staged buffer {b.name}")
        self.row_dim_ok(v.tensor)
        dst = self.fresh("ld_")
        self.lines.append(f"float xb_{b.name}[{self.sweeps}][{self.vec}];")
        body = self.load_vec(v.tensor, self.offset(v.tensor, lead, "col0"), dst)
        body += ["#pragma unroll", f"for (int j = 0; j < {self.vec}; ++j) xb_{b.name}[k][j] = {dst}[j];"]
        if self.tail:
            self.lines += ["#pragma unroll", f"for (int k = 0; k < {self.sweeps}; ++k)",
                           f"    for (int j = 0; j < {self.vec}; ++j) xb_{b.name}[k][j] = 0.0f;"]
        self.lines += self.sweep(body)
        self.cached[b.name] = b.source

    def compute(self, s: Compute) -> None:
        b = s.buf
        if b.dims:
            raise _refuse(f"computed buffer {b.name} has dimensions {[v for v, _ in b.dims]} (only per-row scalars)")
        value = self.scalar(s.value)
        self.lines.append(f"const float sc_{b.name} = {value};")
        self.scalars.add(b.name)

    def store(self) -> None:
        st, out = self.k.store, self.k.output
        if st.guard:
            raise _refuse(f"the store is guarded ({' && '.join(map(str, st.guard))}); a row store writes the whole row")
        if not st.index or st.index[-1] != Aff.of(self.col):
            raise _refuse(f"the store {st.tensor}[{', '.join(map(str, st.index))}] does not write column {self.col} last")
        lead = self.row_lead(Read(st.tensor, st.index), "the store")
        self.row_dim_ok(out.name)
        loads, value = self.elementwise(st.value, self.col)
        dt = DTYPES[out.dtype]
        nbytes = dt.bytes * self.vec
        piece = min(16, nbytes)
        n = nbytes // piece
        body = loads + [f"union {{ {_RAW[piece]} v[{n}]; {dt.ctype} e[{self.vec}]; }} o_;",
                        "#pragma unroll", f"for (int j = 0; j < {self.vec}; ++j) o_.e[j] = f32_to_{dt.name}({value});",
                        "#pragma unroll", f"for (int p_ = 0; p_ < {n}; ++p_) "
                        f"reinterpret_cast<{_RAW[piece]}*>(p_{out.name} + {self.offset(out.name, lead, 'col0')})[p_] = o_.v[p_];"]
        self.lines += self.sweep(body)


def render(k: Kernel, options: tuple[str, ...]) -> tuple[KernelSource, Launch, RowPlan]:
    """CUDA source, launch and plan of a row kernel; UnsupportedMapping naming what does not fit."""
    try:
        return _render(k, options)
    except KeyError as exc:  # an index with no C name here: a column index used outside its place
        raise _refuse(f"index {exc.args[0]}") from None


def _render(k: Kernel, options: tuple[str, ...]) -> tuple[KernelSource, Launch, RowPlan]:
    p = _Printer(k)
    for s in k.body:
        if isinstance(s, Stage):
            p.stage(s)
        elif isinstance(s, Compute):
            p.compute(s)
        elif isinstance(s, TileLoop):
            raise _refuse(f"tile loop over {s.var} carrying {[st.name for st in s.state]} (a streaming fold) "
                          "is not implemented by this mapping")
        else:
            raise _refuse(f"statement {type(s).__name__}")
    p.store()
    out = k.output
    params = [f"const {DTYPES[t.dtype].ctype}* __restrict__ p_{t.name}" for t in k.inputs]
    params.append(f"{DTYPES[out.dtype].ctype}* __restrict__ p_{out.name}")
    params += [f"int sz_{n}" for n in k.dynamic()]
    grid = [f"const long long v_{g.var} = blockIdx.{g.axis};" for g in k.grid]
    plan = RowPlan(p.threads, p.row, p.vec, p.sweeps, p.tail, tuple(p.cached), tuple(p.reductions))
    ctx = dict(kname=k.name, threads=p.threads, warps=p.threads // 32, params=", ".join(params), grid=grid,
               body=p.lines, summary=f"rowwise: {p.threads} threads per row, {p.sweeps} x {p.vec} elements per thread")
    src = render_template("rowwise.cu.j2", ctx)
    ks = KernelSource(src, k.name, tuple(t.name for t in k.tensors) + k.dynamic(), p.threads, 0, options)
    launch = Launch(tuple((g.axis, g.ext) for g in k.grid), p.threads, 0, tuple(t.name for t in k.tensors), k.dynamic())
    return ks, launch, plan


def _print(k: Kernel, options: tuple[str, ...]):
    from .registry import Printed, Variant

    ks, launch, plan = render(k, options)
    return Printed(NAME, k, plan, (Variant("kernel", ks, launch),),
                   {"expect_mma": None, "expect_async_copy": False, "forbid_spills": True})


def _register() -> None:
    from .registry import Mapping, register

    register(Mapping(NAME, "rowwise", None, _print))


_register()
