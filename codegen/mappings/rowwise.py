"""Row-wise mapping: one thread block per row, the row in registers, row reductions as block
reductions (warp shuffles, then one shared-memory exchange between the warps).

The kernel shape it implements (read off the kernel IR, every part compared; anything else is
refused by name and the next mapping — SIMT — prints the kernel):

- the grid enumerates rows (any grid variables); ONE lane dimension, the column c < C of the
  row, mapped to `thread(NT)` by PARALLEL: thread t owns the vectors (k·NT + t)·V … + V−1 of
  the row (V elements per 16-byte access at most, V divides C; a last partial sweep and the
  threads past NT in a block of whole warps are guarded).  A row of dynamic length (a lane of
  dynamic extent) is swept at run time, every sweep guarded, printed twice: V = 16 bytes where
  C % V == 0 and every base is aligned, V = 1 otherwise; its reused rows keep a register prefix
  (rowwise_dynamic.py).  A kernel with NO lane that stores one value per row (a loss) strides
  PER_ROW_THREADS threads over the one extent of its reductions; thread 0 stores;
- `stage` of a whole row `T[lead, r0]`, r0 < C, at the register level (the CACHE of the row):
  each thread loads its own vectors once and keeps them as floats;
- `compute` of a scalar whose value is built from constants, sizes, earlier scalars, per-row
  reads and row reductions `sum|max(k < C: body)` with an element-wise body in k: each thread
  reduces its own columns, then the block combines the partial values (the sum / max over the
  whole row, in another association: exact in the algebra, a float reordering);
  a sum whose guard pins its index to integer data, sum(g < E: [g == T[r] && …] ? v : 0) (the
  gather X[r, T[r]]), is v read once at g = T[r] where T[r] lies in [0, E) (no sweep);
- a `for` over column tiles (ONLINE-AGG's streaming fold) with a fixed number of tiles, each
  tile a whole number of sweeps (T = K·NT·V columns), carrying per-row state: every thread
  holds its K vectors of the tile, a tile reduction is a block reduction over the tile, the
  states are updated at once after each tile (the loop is unrolled: the row stays in registers).
  Over a row that is not cached (too long for the registers: a vocabulary row) the tiles are
  read from memory in a rolled loop and may end past the row (the last tile's sweeps guarded):
  ONLINE-AGG's one pass for the max and the sum;
- the store `Out[lead, c]` without a guard, with an element-wise value in c.

Element-wise values read the cached rows at their own column, other tensors at [lead…, column]
(vector loads) or at a per-row index (one load), scalars, sizes and the column as a value.
Reading a cached row at another column, a reduction inside an element-wise value, a buffer with
more than one dimension, a shared-memory row, a register row or a tile loop over a row of
dynamic length is refused by name.

The printer is this module (the statements, element-wise and per-row values, the sweeps, the
kernel around them) and its parts: the plan and the refusal (rowwise_plan.py), the vector loads
and stores and the pass count (rowwise_memory.py), the row reductions and gathers
(rowwise_reduce.py), a dynamic row's register prefix (rowwise_dynamic.py), a peeled fixed row
(rowwise_peel.py).
"""
from __future__ import annotations

from typing import Callable

from compiler.ir import Aff, Bin, Const, Expr, IndexValue, Read, Reduce, Select, Un
from compiler.machine import DTYPES

from .cexpr import aff_c, conds_c, float_const_c, gt_c, index_value_c, size_names, unary_c
from .rowwise_dynamic import DynamicRowSweeps
from .rowwise_memory import RowMemory
from .rowwise_peel import PeeledRowSweeps, can_peel, uniform
from .rowwise_plan import MAX_UNROLLED_SWEEPS, RowPlan, fixed_value, refuse, row_of_reductions
from .rowwise_reduce import RowReductions
from ..kir.ir import Compute, Kernel, Stage, TileLoop
from ..source import KernelSource, Launch
from .templates_env import render_template

NAME = "rowwise"
# 16-byte loads of staged rows and stores of the output with the evict-first (.cs) cache hint, an
# instruction choice made for kernels with a streaming fold (a tile loop) only: measured on the
# H200 (perf/2026-11-30f/row/run2) it speeds the fold up (2.34 -> 2.72 TB/s) and slows the
# two-pass kernels down by about 8 % (3.83 -> 3.53 TB/s).  None forces it on or off.
STREAM_HINTS: bool | None = None


class _Printer(RowMemory, RowReductions, DynamicRowSweeps, PeeledRowSweeps):
    def __init__(self, k: Kernel, vec: int | None = None, peel: bool = False):
        """vec: the vector width of a row of dynamic length (the caller prints one body per width);
        peel: a fixed row the vector does not divide is cut at its first 16-byte boundary."""
        self.k = k
        if len(k.lanes) > 1:
            raise refuse(f"the kernel is not one row per block: {len(k.lanes)} lane dimensions (one column loop expected)")
        lane = k.lanes[0] if k.lanes else row_of_reductions(k)
        m = lane.mapping
        if m is None or m.level != "thread" or not m.count:
            raise refuse(f"the kernel is not one row per block: column loop {lane.var} is not mapped to threads "
                         "(PARALLEL to: thread with a count)")
        if m.count > 1024:
            raise refuse(f"{m.count} threads per row is more than a block (1024)")
        self.col, self.row, self.threads = lane.var, lane.extent, m.count
        self.per_row = not k.lanes  # one value per row: the store is a scalar
        self.block = -(-m.count // 32) * 32  # threads past the count own no column
        self.grid_vars = {g.var for g in k.grid}
        self.names = size_names(k.sizes)
        for g in k.grid:
            self.names[g.var] = f"v_{g.var}"
        width = min(DTYPES[t.dtype].bytes for t in k.tensors)
        if self.row is None:  # a dynamic row: threads stride over it, every sweep guarded
            num, div = lane.ext.parts[0] if len(lane.ext.parts) == 1 else (None, 0)
            if div != 1:
                raise refuse(f"the row length {lane.ext} is not a size expression")
            self.row_aff = num
            self.row_c = f"(long long){aff_c(num, self.names)}"
            self.vec = vec or 1
            self.sweeps: int | None = None
            self.tail = True
        else:
            self.row_aff = Aff.lit(self.row)
            self.row_c = f"{self.row}LL"
            self.vec = next(v for v in (16 // width, 8, 4, 2, 1) if v <= 16 // width and self.row % v == 0)
            self.sweeps = -(-self.row // (self.threads * self.vec))
            self.tail = self.row % (self.threads * self.vec) != 0 or self.block != self.threads
        self.peeled = peel and self.row is not None and can_peel(k, self.row, self.vec, width)
        if self.peeled:
            assert self.row is not None
            self.vec = 16 // width
            self.sweeps = -(-(self.row // self.vec) // self.threads)  # whole vectors past any head
            self.tail = True
        self.row_accesses: set[tuple[str, tuple[Aff, ...]]] = set()
        self.init_dynamic(k, self.col)
        self.cached: dict[str, str] = {}  # row buffer -> source tensor
        self.scalars: set[str] = set()
        self.states: set[str] = set()
        self.tilebufs: dict[str, int] = {}  # tile buffer -> tile length
        self.tile: tuple[str, int, int] | None = None  # (tile loop var, tile length T, sweeps per tile)
        self.reductions: list[str] = []
        self.moved: list[str] = []  # tensors loaded / stored in memory, in order (row_passes)
        self.passes: dict[str, int] = {}
        self.tmp = 0
        self.lines: list[str] = []
        self.stream = any(isinstance(s, TileLoop) for s in k.body) if STREAM_HINTS is None else STREAM_HINTS

    # ------------------------------------------------------------------ helpers
    def fresh(self, base: str) -> str:
        self.tmp += 1
        return f"{base}{self.tmp}"

    def sweep_row(self, make: Callable[[], list[str]]) -> list[str]:
        """The sweep over the row (not a tile) of the body `make` prints, by the row's kind."""
        if self.sweeps is None:
            return self.sweep_dynamic(make)
        if self.peeled:
            return self.sweep_peeled(make, "#pragma unroll" if self.sweeps <= MAX_UNROLLED_SWEEPS else "#pragma unroll 4")
        return self.sweep(make())

    def sweep(self, body: list[str], tile: bool = False) -> list[str]:
        """Run body for each of this thread's vectors (k, col0) of the row, or of the current tile
        (kk the vector within the tile); j indexes the vector."""
        if tile:
            assert self.tile is not None
            _, _, kt = self.tile
            head = ["#pragma unroll", f"for (int kk = 0; kk < {kt}; ++kk) {{",
                    f"    const int k = co_ * {kt} + kk;"]
        else:
            # unrolled when it indexes a register row (xb_) or is short; a long sweep over global
            # memory (a vocabulary-wide row) unrolled would only spill
            registers = any("xb_" in x or "tb_" in x for x in body)
            unroll = "#pragma unroll" if registers or self.sweeps <= MAX_UNROLLED_SWEEPS else "#pragma unroll 4"
            head = [unroll, f"for (int k = 0; k < {self.sweeps}; ++k) {{"]
        head.append(f"    const long long col0 = ((long long)k * {self.threads} + threadIdx.x) * {self.vec};")
        if self.tail:
            live = f"col0 < {self.row_c}" + (f" && threadIdx.x < {self.threads}" if self.block != self.threads else "")
            return head + [f"    if ({live}) {{"] + ["        " + x for x in body] + ["    }", "}"]
        return head + ["    " + x for x in body] + ["}"]

    # ------------------------------------------------------------------ element-wise values
    def elementwise(self, e: Expr, var: str, tile: bool = False) -> tuple[list[str], str]:
        """(loads for one vector, the value at element j of it) of an element-wise value in var:
        var is the column of the row, or (tile) the column within the current tile."""
        loads: list[str] = []
        seen: dict[Read, str] = {}
        names = dict(self.names)
        column = Aff.of(var)
        names[var] = "(col0 + j)"
        if tile:
            assert self.tile is not None
            co, t, _ = self.tile
            column = Aff.of(var) + Aff.of(co).scale(t)
            names[var] = f"(col0 + j - (long long){t} * co_)"

        def go(x: Expr) -> str:
            if isinstance(x, Const):
                return float_const_c(x.value)
            if isinstance(x, Read):
                if x.tensor in self.cached:
                    if x.idx != (column,):
                        raise refuse(f"the cached row {x.tensor} is read at {x.idx[0]}, not at the column {column}")
                    return f"xb_{x.tensor}[k][j]"
                if x.tensor in self.tilebufs:
                    if not tile or x.idx != (Aff.of(var),):
                        raise refuse(f"the tile buffer {x.tensor} is read at {', '.join(map(str, x.idx))}, "
                                     f"not at the tile column {var}")
                    return f"tb_{x.tensor}[kk][j]"
                if x.tensor in self.scalars and not x.idx:
                    return f"sc_{x.tensor}"
                if x.tensor in self.states and not x.idx:
                    return f"st_{x.tensor}"
                return self.tensor_read(x, var, loads, seen, column)
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
                raise refuse(f"a reduction over {x.var} inside an element-wise value (over {var})")
            raise refuse(f"no element-wise form for {type(x).__name__}")

        return loads, go(e)

    def tensor_read(self, x: Read, var: str, loads: list[str], seen: dict[Read, str], column: Aff | None = None) -> str:
        """A read of an input in an element-wise value over var: at the column (a vector, var the
        row's column or a tile's; `column` is then var's place in the row), or at a row index."""
        column = Aff.of(var) if column is None else column
        if x.tensor not in {t.name for t in self.k.inputs}:
            raise refuse(f"read of {x.tensor}, which is neither an input, a cached row nor a scalar")
        if x in seen:
            return seen[x]
        if not x.idx:
            raise refuse(f"rank-0 tensor {x.tensor}")
        last = x.idx[-1]
        if var in last.names() or any(var in a.names() for a in x.idx[:-1]):
            if last != column:
                raise refuse(f"{x.tensor} is read at column {last}, not at {column}")
            lead = self.row_lead(x, f"read of {x.tensor}")
            self.row_dim_ok(x.tensor)
            off = self.offset(x.tensor, lead, "col0")
            reg = self.register_read((x.tensor, lead), lambda dst: self.load_vec(x.tensor, off, dst), loads)
            if reg is None:
                dst = self.fresh("rd_")
                loads += self.load_vec(x.tensor, off, dst)
            seen[x] = reg or f"{dst}[j]"
        else:
            sizes = {n for n, _ in self.k.sizes}
            for a in x.idx:
                if not a.names() <= self.grid_vars | sizes:
                    raise refuse(f"{x.tensor}[{', '.join(map(str, x.idx))}]: index {a} is neither a row nor a column index")
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
        if op == "gt":
            return gt_c(a, b)
        raise refuse(f"operator {op}")

    # ------------------------------------------------------------------ per-row (scalar) values
    def scalar(self, e: Expr) -> str:
        if isinstance(e, Const):
            return float_const_c(e.value)
        if isinstance(e, Read):
            if e.tensor in self.scalars and not e.idx:
                return f"sc_{e.tensor}"
            if e.tensor in self.states and not e.idx:
                return f"st_{e.tensor}"
            if e.tensor in self.cached or e.tensor in self.tilebufs:
                raise refuse(f"the cached row {e.tensor} is read outside a row reduction or the store")
            if any(self.col in a.names() for a in e.idx):
                raise refuse(f"a per-row value reads {e.tensor} at the column {self.col}")
            return self.tensor_read(e, self.col, [], {})
        if isinstance(e, IndexValue):
            if self.col in e.aff.names():
                raise refuse(f"a per-row value uses the column {self.col}")
            return index_value_c(e.aff, self.names)
        if isinstance(e, Bin):
            return self.binary(e.op, self.scalar(e.a), self.scalar(e.b))
        if isinstance(e, Un):
            return unary_c(e.op, self.scalar(e.a))
        if isinstance(e, Select):
            if any(self.col in c.names() for c in e.conds):
                raise refuse(f"a per-row value has a condition on the column {self.col}")
            return f"({conds_c(e.conds, self.names)} ? {self.scalar(e.then)} : {self.scalar(e.other)})"
        if isinstance(e, Reduce):
            return self.row_reduce(e)
        raise refuse(f"no per-row form for {type(e).__name__}")

    # ------------------------------------------------------------------ statements
    def stage(self, s: Stage) -> None:
        b = s.buf
        if self.row is None:
            raise refuse(f"staged buffer {b.name}: a row of dynamic length {self.row_aff} has no register copy")
        if len(b.dims) != 1 or b.dims[0][1] != self.row:
            raise refuse(f"staged buffer {b.name} is not one row of {self.row} elements")
        if b.level != "register":
            raise refuse(f"staged buffer {b.name} is at level {b.level}; this mapping keeps rows in registers")
        if b.stages != 1:
            raise refuse(f"staged buffer {b.name} asks for {b.stages} pipeline stages")
        r0 = b.dims[0][0]
        v = s.value
        if not (isinstance(v, Read) and v.tensor == b.source and v.idx and v.idx[-1] == Aff.of(r0)):
            raise refuse(f"staged buffer {b.name} is not a plain row copy {b.source}[…, {r0}]")
        lead = self.row_lead(v, f"staged buffer {b.name}")
        self.row_dim_ok(v.tensor)
        dst = self.fresh("ld_")
        self.lines.append(f"float xb_{b.name}[{self.sweeps}][{self.vec}];")
        mark = len(self.moved)
        body = self.load_vec(v.tensor, self.offset(v.tensor, lead, "col0"), dst, stream=self.stream)
        body += ["#pragma unroll", f"for (int j = 0; j < {self.vec}; ++j) xb_{b.name}[k][j] = {dst}[j];"]
        if self.tail:
            self.lines += ["#pragma unroll", f"for (int k = 0; k < {self.sweeps}; ++k) {{", "    #pragma unroll",
                           f"    for (int j = 0; j < {self.vec}; ++j) xb_{b.name}[k][j] = 0.0f;", "}"]
        self.lines += self.sweep(body)
        self.count_pass(mark)
        self.cached[b.name] = b.source

    def compute(self, s: Compute) -> None:
        b = s.buf
        if b.dims:
            if self.tile is None or len(b.dims) != 1 or b.dims[0][1] != self.tile[1] or b.level != "register":
                raise refuse(f"computed buffer {b.name}[{', '.join(f'{v} < {n}' for v, n in b.dims)}] @{b.level} is "
                             "neither a per-row scalar nor a register tile of the current tile loop")
            loads, value = self.elementwise(s.value, b.dims[0][0], tile=True)
            kt = self.tile[2]
            self.lines.append(f"float tb_{b.name}[{kt}][{self.vec}];")
            self.lines += self.sweep(loads + ["#pragma unroll",
                                              f"for (int j = 0; j < {self.vec}; ++j) tb_{b.name}[kk][j] = {value};"], True)
            self.tilebufs[b.name] = b.dims[0][1]
            return
        value = self.scalar(s.value)
        self.lines.append(f"const float sc_{b.name} = {value};")
        self.scalars.add(b.name)

    def tile_loop(self, s: TileLoop) -> None:
        if self.tile is not None:
            raise refuse(f"tile loop over {s.var} inside another tile loop")
        if self.row is None:
            raise refuse(f"tile loop over {s.var}: the row's length {self.row_aff} is dynamic (a fold unrolls fixed tiles)")
        n = fixed_value(s.ext.single()[0], self.k) if len(s.ext.parts) == 1 else None
        tiles = -(-n // s.ext.parts[0][1]) if n is not None else None
        if tiles is None:
            raise refuse(f"tile loop over {s.var} < {s.ext} has no fixed number of tiles")
        lens = {b.buf.dims[0][1] for b in s.body if isinstance(b, Compute) and len(b.buf.dims) == 1}
        if len(lens) != 1:
            raise refuse(f"tile loop over {s.var}: its tile buffers do not have one tile length ({sorted(lens)})")
        t = lens.pop()
        per = self.threads * self.vec
        # a cached row is indexed by the sweep: the tiles are exactly its sweeps; a row read from
        # memory (too long for the registers) may end inside the last tile, its sweeps guarded
        in_memory = not self.cached
        if t % per or (tiles * (t // per) < self.sweeps if in_memory else tiles * (t // per) != self.sweeps):
            raise refuse(f"tile loop over {s.var}: {tiles} tiles of {t} columns are not whole sweeps of "
                         f"{self.threads} x {self.vec} covering the row ({self.sweeps} sweeps)")
        if tiles * t > self.row:
            self.tail = True
        for st in s.state:
            if st.acc is not None and st.acc.dtype != "f32":
                raise refuse(f"state {st.name} accumulates in {st.acc.dtype}")
            self.lines.append(f"float st_{st.name} = {self.scalar(st.init)};")
        self.names[s.var] = "(long long)co_"
        mark = len(self.moved)
        self.lines += ["#pragma unroll 1" if in_memory else "#pragma unroll", f"for (int co_ = 0; co_ < {tiles}; ++co_) {{"]
        outer, self.lines = self.lines, []
        self.states |= {st.name for st in s.state}
        self.tile = (s.var, t, t // per)
        for x in s.body:
            if isinstance(x, Compute):
                self.compute(x)
            else:
                raise refuse(f"{type(x).__name__} inside the tile loop over {s.var}")
        updates = [(st.name, self.scalar(st.update)) for st in s.state]
        self.lines += [f"const float n_{name} = {v};" for name, v in updates]
        self.lines += [f"st_{name} = n_{name};" for name, _ in updates]
        self.lines = outer + ["    " + x for x in self.lines] + ["}"]
        self.count_pass(mark)  # the tiles together are one pass over the row
        self.tile = None
        for x in s.body:
            self.tilebufs.pop(x.buf.name, None)
            self.scalars.discard(x.buf.name)
        del self.names[s.var]

    def store(self) -> None:
        st, out = self.k.store, self.k.output
        if self.per_row:
            lead = self.row_lead(Read(st.tensor, st.index + (Aff.lit(0),)), "the store")
            if st.guard:
                raise refuse(f"the store is guarded ({' && '.join(map(str, st.guard))})")
            value = self.scalar(st.value)
            dt = DTYPES[out.dtype]
            off = " + ".join(f"(long long){aff_c(a, self.names)} * {s}" for a, s in zip(lead, self.strides(out.name)))
            self.lines.append(f"if (threadIdx.x == 0) p_{out.name}[{off or '0'}] = f32_to_{dt.name}({value});")
            return
        if st.guard:
            raise refuse(f"the store is guarded ({' && '.join(map(str, st.guard))}); a row store writes the whole row")
        if not st.index or st.index[-1] != Aff.of(self.col):
            raise refuse(f"the store {st.tensor}[{', '.join(map(str, st.index))}] does not write column {self.col} last")
        lead = self.row_lead(Read(st.tensor, st.index), "the store")
        self.row_dim_ok(out.name)

        def body() -> list[str]:
            loads, value = self.elementwise(st.value, self.col)
            out_ = loads + [f"float ov_[{self.vec}];", "#pragma unroll", f"for (int j = 0; j < {self.vec}; ++j) ov_[j] = {value};"]
            return out_ + self.store_vec(out.name, self.offset(out.name, lead, "col0"), [f"ov_[{j}]" for j in range(self.vec)])

        mark = len(self.moved)
        self.lines += self.sweep_row(body)
        self.count_pass(mark)


def render(k: Kernel, options: tuple[str, ...]) -> tuple[KernelSource, Launch, RowPlan]:
    """CUDA source, launch and plan of a row kernel; UnsupportedMapping naming what does not fit."""
    try:
        return _render(k, options)
    except KeyError as exc:  # an index with no C name here: a column index used outside its place
        raise refuse(f"index {exc.args[0]}") from None


def _body(k: Kernel, vec: int | None = None, peel: bool = False) -> _Printer:
    p = _Printer(k, vec, peel)
    for s in k.body:
        if isinstance(s, Stage):
            p.stage(s)
        elif isinstance(s, Compute):
            p.compute(s)
        elif isinstance(s, TileLoop):
            p.tile_loop(s)
        else:
            raise refuse(f"statement {type(s).__name__}")
    p.store()
    return p


def _aligned(k: Kernel, p: _Printer) -> str:
    """The condition under which a row of dynamic length takes p's vector accesses: the row
    length a multiple of the vector, every tensor's base aligned to its access (a piece)."""
    conds = [f"{p.row_c} % {p.vec} == 0"]
    for t in k.tensors:
        piece = min(16, DTYPES[t.dtype].bytes * p.vec)
        conds.append(f"reinterpret_cast<unsigned long long>(p_{t.name}) % {piece} == 0")
    return " && ".join(conds)


def _render(k: Kernel, options: tuple[str, ...]) -> tuple[KernelSource, Launch, RowPlan]:
    p = _body(k)
    lines = p.lines
    if p.row is None:
        # one body per vector width: 16-byte accesses where the row length and the bases allow,
        # one element per access otherwise (any width; the same arithmetic in the same order
        # per element, only the columns a thread owns differ)
        wide = _body(k, 16 // min(DTYPES[t.dtype].bytes for t in k.tensors))
        if wide.vec > 1:
            lines = ([f"if ({_aligned(k, wide)}) {{"] + ["    " + x for x in wide.lines] + ["} else {"]
                     + ["    " + x for x in p.lines] + ["}"])
            p = wide
    else:
        peeled = _body(k, peel=True)
        if peeled.peeled and uniform(k, peeled.row_accesses):
            # vectors from each row's first 16-byte boundary where the bases share their place in
            # a 16-byte word (then every row access has the same head), one element per access otherwise
            names = sorted({n for n, _ in peeled.row_accesses})
            same = [f"((reinterpret_cast<unsigned long long>(p_{names[0]}) ^ reinterpret_cast<unsigned long long>(p_{n})) & 15ULL) == 0"
                    for n in names[1:]]
            body = peeled.head_lines(peeled.offset) + peeled.lines
            lines = ([f"if ({' && '.join(same)}) {{"] + ["    " + x for x in body] + ["} else {"]
                     + ["    " + x for x in p.lines] + ["}"]) if same else body
            p = peeled
    out = k.output
    params = [f"const {DTYPES[t.dtype].ctype}* __restrict__ p_{t.name}" for t in k.inputs]
    params.append(f"{DTYPES[out.dtype].ctype}* __restrict__ p_{out.name}")
    params += [f"int sz_{n}" for n in k.dynamic()]
    grid = [f"const long long v_{g.var} = blockIdx.{g.axis};" for g in k.grid]
    passes = tuple(sorted(p.passes.items()))
    plan = RowPlan(p.threads, p.block, p.row, p.vec, p.sweeps, p.tail, tuple(p.cached), tuple(p.reductions), p.stream,
                   peeled=p.peeled, row_passes=passes)
    ctx = dict(kname=k.name, threads=p.block, params=", ".join(params), grid=grid,
               body=lines, summary=f"rowwise: {', '.join(f'{n} {c}x' for n, c in passes)} over the row in memory"
                                   + (" past its register prefix" if p.row is None and p.reused else "")
                                   + f", {p.threads} threads per row, "
                                   + (f"{p.sweeps} x {p.vec} elements per thread from the row's first 16-byte "
                                      "boundary (head and tail one element per thread)" if p.peeled else
                                      f"{p.sweeps} x {p.vec} elements per thread" if p.sweeps else
                                      f"a row of dynamic length {p.row_aff} in sweeps of {p.threads} x {p.vec} "
                                      "(x 1 where unaligned)"))
    src = render_template("rowwise.cu.j2", ctx)
    ks = KernelSource(src, k.name, tuple(t.name for t in k.tensors) + k.dynamic(), p.block, 0, options)
    launch = Launch(tuple((g.axis, g.ext) for g in k.grid), p.block, 0, tuple(t.name for t in k.tensors), k.dynamic())
    return ks, launch, plan


def _print(k: Kernel, options: tuple[str, ...]):
    from .registry import Printed, Variant

    ks, launch, plan = render(k, options)
    return Printed(NAME, k, plan, (Variant("kernel", ks, launch),),
                   {"expect_mma": None, "expect_async_copy": False, "forbid_spills": True})


def _register() -> None:
    from .registry import Mapping, register

    register(Mapping(NAME, "rowwise", None, _print, dynamic_lanes=True))


_register()
