"""Kernel IR: the tile-level program one thread block runs.

The lowering (`codegen.kir.lower`) translates the final derivation program into this form; the
kernel-IR interpreter (`codegen.kir.interp`) checks it against the final program in every
build; the printers of `codegen.mappings` print it.  It is the last program the checks talk
about: a printer decides instructions and data movement, never meaning.

A `Kernel` writes one output tensor, and any further ones `also` stores (FOLD-STAT's row
statistic, read off the tile loop's final state).  Its blocks enumerate the `grid` dimensions;
inside a block every `LaneDim` point (the output tile's element coordinates) runs `body` and
then the guarded `store` (and the `also` stores).  Statements:

- `Stage`   buf[dims] = value: a staged copy of a global tile (CACHE), with its guard and fill
            written in `value` (`[conds] ? T[index map] : 0`), at a memory level with pipeline
            stages;
- `Compute` buf[dims] = value: a register tile (scores, probabilities, a running maximum);
- `TileLoop` a sequential loop over tiles carrying `State` (ONLINE-AGG's m, l, acc; a
            contraction's accumulator): each iteration runs its body, then assigns every
            state's `update` at once (old state visible).

Values are expressions of the derivation IR (`compiler.ir`): reads of tensors, buffers and
state (a state is read as a rank-0 tensor), arithmetic, `Select` with the program's own
conditions, and tile reductions (`Reduce`, with the MMA and accumulator facts of the
schedule).  `Let`, `Fold` and `Softmax` never occur here: the lowering turned them into
statements or refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Union

from compiler.ir import AccFact, Aff, Cond, Expr, Ext, Mapping, walk


@dataclass(frozen=True)
class TensorArg:
    """A global tensor parameter: row-major over `dims` (affine in the size names)."""

    name: str
    dims: tuple[Aff, ...]
    dtype: str
    output: bool = False


@dataclass(frozen=True)
class GridDim:
    """Blocks along `axis` enumerate var < ext.

    Several grid dimensions may share one axis (PARALLEL of a second loop to a used axis): the
    axis then enumerates the product of their extents, row-major in the kernel's grid order —
    the first is the outermost, the last varies fastest.  With dims (v1 < E1, …, vk < Ek) on
    axis a, vi = (blockIdx.a / (E(i+1) * … * Ek)) mod Ei (printed by `codegen.kir.grid`)."""

    var: str
    ext: Ext
    axis: str


@dataclass(frozen=True)
class LaneDim:
    """A coordinate of the block's output tile: var < extent, spread over warps / threads.

    extent None: a lane of dynamic extent var < ext (sizes only), which only a thread-strided
    lane has (PARALLEL to threads with a count: thread t runs var = t, t + count, … below ext);
    a mapping prints it or is refused by name (registry: `dynamic_lanes`)."""

    var: str
    extent: int | None
    mapping: Mapping | None = None
    ext: Ext | None = None

    def bound(self) -> str:
        return str(self.extent) if self.extent is not None else str(self.ext)


@dataclass(frozen=True)
class Buffer:
    """A tile held by the block: name[dims] at a memory level, `source` the tensor it copies."""

    name: str
    dims: tuple[tuple[str, int], ...]
    level: str
    stages: int = 1
    source: str = ""


@dataclass(frozen=True)
class Stage:
    buf: Buffer
    value: Expr


@dataclass(frozen=True)
class Compute:
    buf: Buffer
    value: Expr


@dataclass(frozen=True)
class State:
    """Loop-carried per-lane scalar: starts at `init`, becomes `update` after each iteration."""

    name: str
    init: Expr
    update: Expr
    acc: AccFact | None = None


@dataclass(frozen=True)
class TileLoop:
    var: str
    ext: Ext
    state: tuple[State, ...]
    body: tuple["Stmt", ...]


Stmt = Union[Stage, Compute, TileLoop]


@dataclass(frozen=True)
class Store:
    """tensor[index] = value for every lane point where all guards hold."""

    tensor: str
    index: tuple[Aff, ...]
    guard: tuple[Cond, ...]
    value: Expr


@dataclass(frozen=True)
class Kernel:
    name: str
    sizes: tuple[tuple[str, int | None], ...]  # None: a dynamic size, a kernel argument
    tensors: tuple[TensorArg, ...]  # inputs in argument order, then the output
    grid: tuple[GridDim, ...]
    lanes: tuple[LaneDim, ...]
    body: tuple[Stmt, ...]
    store: Store
    also: tuple[Store, ...] = ()  # further outputs, written after the store (FOLD-STAT's LSE)

    def tensor(self, name: str) -> TensorArg:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def inputs(self) -> tuple[TensorArg, ...]:
        return tuple(t for t in self.tensors if not t.output)

    @property
    def output(self) -> TensorArg:
        return next(t for t in self.tensors if t.output)

    @property
    def outputs(self) -> tuple[TensorArg, ...]:
        """Every output, the main one first (then `also`'s tensors, in order)."""
        return tuple(t for t in self.tensors if t.output)

    @property
    def stores(self) -> tuple[Store, ...]:
        return (self.store,) + self.also

    def fixed(self) -> dict[str, int]:
        return {n: v for n, v in self.sizes if v is not None}

    def dynamic(self) -> tuple[str, ...]:
        return tuple(n for n, v in self.sizes if v is None)


def statements(body: tuple[Stmt, ...]) -> Iterator[Stmt]:
    """Every statement, loops before their bodies."""
    for s in body:
        yield s
        if isinstance(s, TileLoop):
            yield from statements(s.body)


def expressions(k: Kernel) -> Iterator[Expr]:
    """Every top-level expression of the kernel (values, inits, updates, the stored value)."""
    for s in statements(k.body):
        if isinstance(s, (Stage, Compute)):
            yield s.value
        else:
            for st in s.state:
                yield st.init
                yield st.update
    for st in k.stores:
        yield st.value


def sub_expressions(k: Kernel) -> Iterator[Expr]:
    for e in expressions(k):
        yield from walk(e)


def show_kernel(k: Kernel) -> str:
    """A readable listing of the kernel IR (kir.txt in the build directory)."""
    from compiler.printer import show_expr

    def bufdecl(b: Buffer) -> str:
        dims = ", ".join(f"{v} < {n}" for v, n in b.dims)
        facts = b.level + (f"; stages {b.stages}" if b.stages > 1 else "") + (f"; copies {b.source}" if b.source else "")
        return f"{b.name}[{dims}] @{{{facts}}}" if dims else f"{b.name} @{{{facts}}}"

    def block(body: tuple[Stmt, ...], pad: str) -> list[str]:
        out: list[str] = []
        for s in body:
            if isinstance(s, Stage):
                out.append(f"{pad}stage {bufdecl(s.buf)} = {show_expr(s.value)}")
            elif isinstance(s, Compute):
                out.append(f"{pad}compute {bufdecl(s.buf)} = {show_expr(s.value)}")
            else:
                init = ", ".join(f"{st.name} = {show_expr(st.init)}" for st in s.state)
                out.append(f"{pad}for {s.var} < {s.ext} carrying ({init}):")
                out.extend(block(s.body, pad + "  "))
                for st in s.state:
                    acc = f" @{{acc {st.acc.level} {st.acc.dtype}}}" if st.acc else ""
                    out.append(f"{pad}  {st.name} := {show_expr(st.update)}{acc}")
        return out

    sizes = ", ".join(f"{n}={'?' if v is None else v}" for n, v in k.sizes)
    args = "; ".join(f"{'out ' if t.output else ''}{t.name}[{', '.join(map(str, t.dims))}] : {t.dtype}" for t in k.tensors)
    grid = ", ".join(f"{g.var} < {g.ext} @{g.axis}" for g in k.grid)
    lanes = ", ".join(f"{ln.var} < {ln.bound()}" + (f" @{ln.mapping}" if ln.mapping else "") for ln in k.lanes)
    lines = [f"kernel {k.name}", f"  sizes {sizes}", f"  tensors {args}", f"  grid {grid}", f"  lanes {lanes}"]
    lines += block(k.body, "  ")
    for st in k.stores:
        guard = " && ".join(map(str, st.guard))
        where = f" where {guard}" if guard else ""
        idx = ", ".join(map(str, st.index))
        lines.append(f"  store {st.tensor}[{idx}] = {show_expr(st.value)}{where}")
    return "\n".join(lines) + "\n"
