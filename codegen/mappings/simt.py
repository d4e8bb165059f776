"""SIMT mapping: prints ANY kernel IR as plain CUDA (fp32 arithmetic, 64-bit index math; fp64
arithmetic when a tensor of the kernel is f64 — the one mapping that prints f64).

The printer that makes the lowering total in practice: every statement, expression, condition
and index map of the kernel IR is printed as written.  Each thread owns lane points
`tid + q * threads` of the block's tile (the last lane dimension fastest, so neighbouring
threads touch neighbouring elements); loop-carried state lives in per-thread arrays indexed by
q.  A buffer that does not depend on the lane point (a CACHE copy of a tile, a block-level
tile) is filled cooperatively into shared memory between barriers; one that does (a score row)
is a per-thread array.  A reduction prints as an immediately invoked lambda with its own loop.
Staging depth and tensor-core facts are not implemented here: a schedule that asks for them is
mapped by the tensor-core printers, and this mapping says in its summary that it runs one stage.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.ir import Aff, Bin, Const, Expr, IndexValue, Read, Reduce, Select, Un, free_indices, walk
from compiler.machine import DEVICE, DTYPES

from .cexpr import aff_c, conds_c, ext_c, float_const_c, gt_c, index_value_c, size_names, unary_c
from ..kir.grid import block_index_c
from ..kir.ir import Buffer, Compute, Kernel, Stage, Stmt, TileLoop
from ..kir.lower import UnsupportedMapping
from ..source import KernelSource, Launch
from .templates_env import render_template

NAME = "simt"
LOCAL_FLOATS_LIMIT = 16384  # per-thread buffer elements (64 KB of local memory)


def _tensor_strides(dims: tuple[Aff, ...], names: dict[str, str]) -> list[str]:
    strides, acc = [], "1LL"
    for d in reversed(dims):
        strides.append(acc)
        acc = f"{acc} * (long long){aff_c(d, names)}"
    return list(reversed(strides))


@dataclass
class _Ctx:
    k: Kernel
    names: dict[str, str]  # index variables and sizes -> C
    shared: dict[str, Buffer]  # block-level buffers in shared memory
    local: dict[str, Buffer]  # per-lane-point buffers
    states: set[str]
    pts: int  # lane points per thread


class _Printer:
    def __init__(self, k: Kernel):
        self.k = k
        self.lane_vars = {ln.var for ln in k.lanes}
        self.names = size_names(k.sizes)
        for g in k.grid:
            self.names[g.var] = f"v_{g.var}"
        for ln in k.lanes:
            self.names[ln.var] = f"v_{ln.var}"
        self.lanes = math.prod(ln.extent for ln in k.lanes) if k.lanes else 1
        warps = math.prod((ln.mapping.count or 1) for ln in k.lanes if ln.mapping and ln.mapping.level == "warp")
        self.threads = max(32, min(32 * max(1, warps), -(-self.lanes // 32) * 32, DEVICE.max_threads_per_block))
        self.pts = -(-self.lanes // self.threads)
        self.shared: dict[str, Buffer] = {}
        self.local: dict[str, Buffer] = {}
        self.states: set[str] = set()
        self.strides = {t.name: _tensor_strides(t.dims, self.names) for t in k.tensors}
        self.dtypes = {t.name: t.dtype for t in k.tensors}
        self.real = "double" if "f64" in self.dtypes.values() else "float"  # the C type of every value
        self.compute_dtype = "f64" if self.real == "double" else "f32"  # ... as the dtype of a computed buffer
        self.smem = 0
        self.offsets: dict[str, int] = {}

    # -- classification
    def per_lane(self, e: Expr) -> bool:
        if free_indices(e) & self.lane_vars:
            return True
        return any(isinstance(x, Read) and (x.tensor in self.local or x.tensor in self.states) for x in walk(e))

    def declare(self, s: Stage | Compute) -> None:
        b = s.buf
        size = math.prod(n for _, n in b.dims)
        if self.per_lane(s.value):
            if self.pts * size > LOCAL_FLOATS_LIMIT:
                raise UnsupportedMapping(f"SIMT: buffer {b.name} ({size} elements per lane point, {self.pts} points "
                                         "per thread) does not fit in per-thread memory")
            self.local[b.name] = b
        else:
            dt = DTYPES[self.dtypes[b.source]] if isinstance(s, Stage) else DTYPES[self.compute_dtype]
            self.offsets[b.name] = self.smem
            self.smem = -(-(self.smem + size * dt.bytes) // 16) * 16
            self.shared[b.name] = b

    # -- expressions
    def flat(self, b: Buffer, idx: tuple[Aff, ...], names: dict[str, str]) -> str:
        terms, stride = [], 1
        for (_, n), a in reversed(list(zip(b.dims, idx))):
            terms.append(f"{aff_c(a, names)} * {stride}" if stride != 1 else aff_c(a, names))
            stride *= n
        return " + ".join(reversed(terms)) if terms else "0"

    def load(self, dtype: str, stored: str) -> str:
        """A stored element of `dtype` as a value of the kernel's real type."""
        if self.real == "float" or dtype == "f64":
            return f"{dtype}_to_{self.compute_dtype}({stored})"
        return f"((double){dtype}_to_f32({stored}))"

    def store(self, dtype: str, value: str) -> str:
        """A value of the kernel's real type as a stored element of `dtype`."""
        if self.real == "float" or dtype == "f64":
            return f"{self.compute_dtype}_to_{dtype}({value})"
        return f"f32_to_{dtype}((float)({value}))"

    def ex(self, e: Expr, names: dict[str, str]) -> str:
        if isinstance(e, Const):
            return float_const_c(e.value, self.real)
        if isinstance(e, Read):
            if e.tensor in self.states:
                return f"st_{e.tensor}[q]"
            if e.tensor in self.local:
                return f"lb_{e.tensor}[q][{self.flat(self.local[e.tensor], e.idx, names)}]"
            if e.tensor in self.shared:
                b = self.shared[e.tensor]
                conv = DTYPES[self.dtypes[b.source]].name if b.source else self.compute_dtype
                return self.load(conv, f"sb_{e.tensor}[{self.flat(b, e.idx, names)}]")
            if e.tensor in self.strides:
                off = " + ".join(f"(long long){aff_c(a, names)} * {s}" for a, s in zip(e.idx, self.strides[e.tensor]))
                return self.load(self.dtypes[e.tensor], f"p_{e.tensor}[{off or '0'}]")
            raise UnsupportedMapping(f"SIMT: read of unknown buffer {e.tensor}")
        if isinstance(e, Bin):
            a, b = self.ex(e.a, names), self.ex(e.b, names)
            if e.op in "+-*":
                return f"({a} {e.op} {b})"
            fmax = "fmaxf" if self.real == "float" else "fmax"
            return {"/": f"div0({a}, {b})", "max": f"{fmax}({a}, {b})", "rescale": f"rescale({a}, {b})",
                    "gt": gt_c(a, b, self.real)}[e.op]
        if isinstance(e, Un):
            try:
                return unary_c(e.op, self.ex(e.a, names), self.real)
            except KeyError as exc:
                raise UnsupportedMapping(f"SIMT: {exc.args[0]}") from None
        if isinstance(e, IndexValue):
            return index_value_c(e.aff, names, self.real)
        if isinstance(e, Select):
            return f"({conds_c(e.conds, names)} ? {self.ex(e.then, names)} : {self.ex(e.other, names)})"
        if isinstance(e, Reduce):
            inner = dict(names)
            inner[e.var] = f"v_{e.var}"
            real = self.real
            init = float_const_c(0.0 if e.op == "sum" else float("-inf"), real)
            step = "r_ + v_" if e.op == "sum" else ("fmaxf(r_, v_)" if real == "float" else "fmax(r_, v_)")
            return (f"([&]() -> {real} {{ {real} r_ = {init}; "
                    f"for (long long v_{e.var} = 0; v_{e.var} < {ext_c(e.ext, names)}; ++v_{e.var}) "
                    f"{{ const {real} v_ = {self.ex(e.body, inner)}; r_ = {step}; }} return r_; }}())")
        raise UnsupportedMapping(f"SIMT: no printer for {type(e).__name__}")

    # -- statements
    def lane_loop(self, body: list[str]) -> list[str]:
        coords, stride = [], 1
        for ln in reversed(self.k.lanes):
            coords.append(f"const long long v_{ln.var} = (lane_ / {stride}LL) % {ln.extent}LL; (void)v_{ln.var};")
            stride *= ln.extent
        head = [f"for (int q = 0; q < {self.pts}; ++q) {{",
                f"    const long long lane_ = (long long)threadIdx.x + (long long)q * {self.threads};",
                f"    if (lane_ >= {self.lanes}LL) break;"]
        return head + ["    " + c for c in reversed(coords)] + ["    " + line for line in body] + ["}"]

    def fill(self, s: Stage | Compute) -> list[str]:
        b = s.buf
        names = dict(self.names)
        coords, stride = [], 1
        for v, n in reversed(b.dims):
            names[v] = f"v_{v}"
            coords.append(f"const long long v_{v} = (e_ / {stride}LL) % {n}LL; (void)v_{v};")
            stride *= n
        value = self.ex(s.value, names)
        if b.name in self.local:
            if self.k.store.guard:  # a lane point past a tail stores nothing: it must read nothing either
                value = f"(({conds_c(self.k.store.guard, names)}) ? {value} : {float_const_c(0.0, self.real)})"
            body = [f"for (long long e_ = 0; e_ < {stride}; ++e_) {{"] + ["    " + c for c in reversed(coords)]
            body += [f"    lb_{b.name}[q][e_] = {value};", "}"]
            return self.lane_loop(body)
        store = self.store(DTYPES[self.dtypes[b.source]].name, value) if b.source else value
        return (["__syncthreads();", f"for (long long e_ = threadIdx.x; e_ < {stride}; e_ += {self.threads}) {{"]
                + ["    " + c for c in reversed(coords)] + [f"    sb_{b.name}[e_] = {store};", "}", "__syncthreads();"])

    def block(self, body: tuple[Stmt, ...]) -> list[str]:
        out: list[str] = []
        for s in body:
            if isinstance(s, (Stage, Compute)):
                self.declare(s)
                out += self.fill(s)
            elif isinstance(s, TileLoop):
                out += self.loop(s)
        return out

    def loop(self, s: TileLoop) -> list[str]:
        if s.ext.names() & self.lane_vars:
            raise UnsupportedMapping(f"SIMT: the extent of tile loop {s.var} depends on a lane index")
        out = [f"{self.real} st_{st.name}[{self.pts}];" for st in s.state]
        self.states |= {st.name for st in s.state}
        names = dict(self.names)
        out += self.lane_loop([f"st_{st.name}[q] = {self.ex(st.init, names)};" for st in s.state])
        self.names[s.var] = f"v_{s.var}"
        inner = self.block(s.body)
        upd = [f"const {self.real} n_{st.name} = {self.ex(st.update, self.names)};" for st in s.state]
        upd += [f"st_{st.name}[q] = n_{st.name};" for st in s.state]
        out += [f"for (long long v_{s.var} = 0; v_{s.var} < {ext_c(s.ext, self.names)}; ++v_{s.var}) {{"]
        out += ["    " + line for line in inner + self.lane_loop(upd)] + ["}"]
        del self.names[s.var]
        return out


def render(k: Kernel, options: tuple[str, ...]) -> tuple[KernelSource, Launch]:
    """CUDA source and launch of any kernel IR on the SIMT mapping."""
    p = _Printer(k)
    body = p.block(k.body)
    for st in k.stores:  # the output, then any further output (FOLD-STAT's LSE) from the final state
        out = k.tensor(st.tensor)
        store_off = " + ".join(f"(long long){aff_c(a, p.names)} * {s}" for a, s in zip(st.index, p.strides[out.name]))
        value = p.ex(st.value, p.names)
        body += p.lane_loop([f"if ({conds_c(st.guard, p.names)}) p_{out.name}[{store_off or '0'}] = "
                             f"{p.store(out.dtype, value)};"])
    if p.smem > DEVICE.smem_per_block:
        raise UnsupportedMapping(f"SIMT: block-level buffers need {p.smem} bytes of shared memory "
                                 f"> {DEVICE.smem_per_block}")
    params = [f"const {DTYPES[t.dtype].ctype}* __restrict__ p_{t.name}" for t in k.inputs]
    params += [f"{DTYPES[t.dtype].ctype}* __restrict__ p_{t.name}" for t in k.outputs]
    params += [f"int sz_{n}" for n in k.dynamic()]
    shared = []
    for name, b in p.shared.items():
        ct = DTYPES[p.dtypes[b.source]].ctype if b.source else p.real
        shared.append(f"{ct}* sb_{name} = reinterpret_cast<{ct}*>(smem_ + {p.offsets[name]});")
    local = [f"{p.real} lb_{n}[{p.pts}][{math.prod(x for _, x in b.dims)}];" for n, b in p.local.items()]
    bidx = block_index_c([(g.var, ext_c(g.ext, p.names), g.axis) for g in k.grid])
    grid = [f"const long long v_{g.var} = {bidx[g.var]};" for g in k.grid]
    ctx = dict(kname=k.name, threads=p.threads, params=", ".join(params), smem=p.smem, shared=shared,
               local=local, grid=grid, body=body,
               summary=f"SIMT {'fp64' if p.real == 'double' else 'fp32'}, {p.threads} threads, {p.pts} lane points "
                       "per thread, one stage")
    src = render_template("simt.cu.j2", ctx)
    ks = KernelSource(src, k.name, tuple(t.name for t in k.tensors) + k.dynamic(), p.threads, p.smem, options)
    launch = Launch(tuple((g.axis, g.ext) for g in k.grid), p.threads, p.smem,
                    tuple(t.name for t in k.tensors), k.dynamic())
    return ks, launch


def _print(k: Kernel, options: tuple[str, ...]):
    from .registry import Printed, Variant

    ks, launch = render(k, options)
    return Printed(NAME, k, None, (Variant("kernel", ks, launch),),
                   {"expect_mma": None, "expect_async_copy": False, "forbid_spills": False})


def _register() -> None:
    from .registry import Mapping, register

    register(Mapping(NAME, "any", None, _print, prints_also=True))


_register()
