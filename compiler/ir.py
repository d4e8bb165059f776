"""The derivc IR: a small functional tensor language with schedule facts.

A `Program` is a list of tensor definitions (`Def`).  A `Def` writes one tensor: a nest of
`Loop`s (each a `Gen`: iterations are independent), an affine store index, an optional store
guard, and a scalar `Expr` body.  Expressions are pure: reads with affine indices, scalar
operations, reductions (`Reduce` sum / max), guards (`Select`), softmax, local tile buffers
(`Let`) and the streaming `Fold` that ONLINE-AGG introduces.

Schedule facts ride on nodes and never change meaning: a loop's `Mapping` (grid / warp /
thread), a buffer's memory `level` and pipeline `stages`, a reduction's accumulator
(`AccFact`) and tensor-core mapping (`MmaFact`).

All nodes are frozen dataclasses; rules build new trees, they never mutate.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Union

from .ir_index import SPAN_KEY, SPAN_ROW, Aff, Cond, DataCond, DataRead, DataSpan, Ext, Guard, Or  # noqa: F401 - the index language, part of the IR's names

# --------------------------------------------------------------------------- schedule facts


@dataclass(frozen=True)
class Mapping:
    """Where a parallel loop runs: level in grid | warp | thread, axis for the grid."""

    level: str
    axis: str = ""
    count: int = 0  # warp/thread mapping: how many warps/threads share the loop (0: one per iteration)

    def __str__(self) -> str:
        base = f"{self.level}.{self.axis}" if self.axis else self.level
        return f"{base}({self.count})" if self.count else base


@dataclass(frozen=True)
class AccFact:
    """A reduction's accumulator: memory level and dtype (CACHE accum → register)."""

    level: str
    dtype: str


@dataclass(frozen=True)
class MmaFact:
    """MAP-MMA: an inner tile product computed by tensor-core fragments of shape m×n×k."""

    instr: str
    m: int
    n: int
    k: int


# --------------------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Const:
    value: float
    label: str = ""


@dataclass(frozen=True)
class Read:
    tensor: str
    idx: tuple[Aff, ...]


@dataclass(frozen=True)
class IndexValue:
    """The value of an affine expression of indices and sizes, as a number: `sum(k: …) / C`
    reads the size C, `Slope[h] * (j - i)` the index difference j - i."""

    aff: Aff


@dataclass(frozen=True)
class Bin:
    op: str  # one of BINARY_OPERATORS
    a: "Expr"
    b: "Expr"


@dataclass(frozen=True)
class Un:
    op: str  # one of UNARY_FUNCTIONS
    a: "Expr"


@dataclass(frozen=True)
class Reduce:
    op: str  # sum | max
    var: str
    ext: Ext
    body: "Expr"
    acc: AccFact | None = None
    mma: MmaFact | None = None


@dataclass(frozen=True)
class Select:
    conds: tuple[Cond, ...]
    then: "Expr"
    other: "Expr"


@dataclass(frozen=True)
class Softmax:
    """exp(score[var := at]) / Σ_{var<ext, mask} exp(score); masked positions give 0."""

    var: str
    ext: Ext
    score: "Expr"
    at: Aff
    mask: tuple[Cond, ...] = ()


@dataclass(frozen=True)
class Binding:
    """A local buffer name[dims] = value (dims empty: a scalar), at a memory level."""

    name: str
    dims: tuple[tuple[str, Ext], ...]
    value: "Expr"
    level: str = "register"
    stages: int = 1
    source: str = ""  # the tensor this buffer caches (CACHE), for the reader and the lowering


@dataclass(frozen=True)
class Let:
    bind: Binding
    body: "Expr"


@dataclass(frozen=True)
class Fold:
    """Sequential fold over var < ext carrying scalar state.

    Each step: evaluate `binds` in order (old state visible), then all `update`s at once
    (old state and binds visible).  The value is `result` over the final state.
    """

    var: str
    ext: Ext
    state: tuple[str, ...]
    init: tuple["Expr", ...]
    binds: tuple[Binding, ...]
    update: tuple["Expr", ...]
    result: "Expr"
    # further results over the same final state, one per `AlsoStore` of the enclosing
    # definition (FOLD-STAT: the row statistic m + log(l) beside acc / l)
    also: tuple["Expr", ...] = ()


Expr = Union[Const, Read, IndexValue, Bin, Un, Reduce, Select, Softmax, Let, Fold]

# The unary functions of the language (`neg` is unary minus); every pass that evaluates,
# exports or prints expressions covers exactly these.
UNARY_FUNCTIONS = ("exp", "neg", "log", "sqrt", "rsqrt", "tanh", "erf")
# The binary operators: the infix arithmetic, and the functions written `op(a, b)`:
# max; rescale(a, b) = exp(a - b), exactly 1 when a == b (also at -inf); the step
# gt(a, b) = 1 if a > b else 0 (NaN compares false: 0), the derivative of max.
INFIX_OPERATORS = ("+", "-", "*", "/")
BINARY_FUNCTIONS = ("max", "rescale", "gt")
BINARY_OPERATORS = INFIX_OPERATORS + BINARY_FUNCTIONS

# --------------------------------------------------------------------------- statements


@dataclass(frozen=True)
class Loop:
    var: str
    ext: Ext
    mapping: Mapping | None = None


@dataclass(frozen=True)
class TensorType:
    dims: tuple[Aff, ...]
    dtype: str


@dataclass(frozen=True)
class AlsoStore:
    """A second tensor a definition writes (FOLD-STAT): name[store[k] for k in keep] =
    v_n for every point of the definition's nest where its guards hold and store[k] == 0 for
    every position k not kept (written once per kept index: the lanes at d == 0), where v_n is
    the definition's body with its tail fold's `result` replaced by the fold's `also[n]`
    (n: this store's position in `Def.also`).  Expressed through the definition's own store
    index, so the loop renames of later rules (TILE) carry it along."""

    name: str
    type: TensorType
    keep: tuple[int, ...]


@dataclass(frozen=True)
class Def:
    """name[store] = body for every point of the loop nest where all guards hold."""

    name: str
    type: TensorType
    loops: tuple[Loop, ...]
    store: tuple[Aff, ...]
    body: Expr
    guard: tuple[Cond, ...] = ()
    level: str = "global"
    # "" : computed by this program's kernel; otherwise the build step that writes the tensor
    # ("forward", "kernel LSE"): the definition still gives its meaning, the kernel reads it.
    computed_by: str = ""
    also: tuple[AlsoStore, ...] = ()  # further tensors written from the tail fold's final state


def tail_fold(e: "Expr") -> "Fold | None":
    """The fold a body ends in: the body itself or the body of Lets around it."""
    while isinstance(e, Let):
        e = e.body
    return e if isinstance(e, Fold) else None


def also_def(d: Def, n: int) -> Def:
    """The definition that writes d's n-th further output, as a plain definition (its meaning)."""
    fold = tail_fold(d.body)
    a = d.also[n]
    if fold is None or len(fold.also) != len(d.also):
        raise ValueError(f"def {d.name} writes {len(d.also)} further outputs, its body's tail fold has "
                         f"{0 if fold is None else len(fold.also)} further results")
    body = _replace_tail(d.body, replace(fold, result=fold.also[n], also=()))
    guard = d.guard + tuple(Cond(d.store[k], "<=", Aff.lit(0)) for k in range(len(d.store)) if k not in a.keep)
    return Def(a.name, a.type, d.loops, tuple(d.store[k] for k in a.keep), body, guard, d.level)


def _replace_tail(e: "Expr", fold: "Fold") -> "Expr":
    if isinstance(e, Let):
        return Let(e.bind, _replace_tail(e.body, fold))
    return fold


@dataclass(frozen=True)
class Program:
    sizes: tuple[tuple[str, int | None], ...]  # None: dynamic
    inputs: tuple[tuple[str, TensorType], ...]
    defs: tuple[Def, ...]
    output: str
    facts: tuple[tuple[str, str], ...] = field(default=())

    def size_map(self) -> dict[str, int | None]:
        return dict(self.sizes)

    def input_map(self) -> dict[str, TensorType]:
        return dict(self.inputs)

    def def_named(self, name: str) -> Def:
        for d in self.defs:
            if d.name == name:
                return d
        raise KeyError(name)

    def writer_of(self, name: str) -> Def:
        """The definition that writes `name`: its own, or one writing it as a further output."""
        for d in self.defs:
            if d.name == name or any(a.name == name for a in d.also):
                return d
        raise KeyError(name)

    def has_def(self, name: str) -> bool:
        return any(d.name == name for d in self.defs)

    def with_def(self, new: Def) -> "Program":
        return replace(self, defs=tuple(new if d.name == new.name else d for d in self.defs))

    def tensor_type(self, name: str) -> TensorType:
        inputs = self.input_map()
        if name in inputs:
            return inputs[name]
        d = self.writer_of(name)
        return d.type if d.name == name else next(a.type for a in d.also if a.name == name)

    def intermediate_dtype(self) -> str:
        """The dtype of a tensor a rule or GRAD introduces: f64 in a program with an f64 tensor
        (it computes in double end to end), else f32."""
        dtypes = {t.dtype for _, t in self.inputs} | {d.type.dtype for d in self.defs}
        return "f64" if "f64" in dtypes else "f32"

    def also_outputs(self) -> tuple[str, ...]:
        """The outputs beside `output` (a spec's `output.also`, a gradient program's other
        gradients): every numeric check compares each of them too."""
        return tuple(n for n in dict(self.facts).get("also_outputs", "").split(",") if n and n != self.output)

    def digest(self) -> str:
        from .printer import show_program

        return hashlib.sha256(show_program(self).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- traversal


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (Const, Read, IndexValue)):
        return ()
    if isinstance(e, Bin):
        return (e.a, e.b)
    if isinstance(e, Un):
        return (e.a,)
    if isinstance(e, Reduce):
        return (e.body,)
    if isinstance(e, Select):
        return (e.then, e.other)
    if isinstance(e, Softmax):
        return (e.score,)
    if isinstance(e, Let):
        return (e.bind.value, e.body)
    if isinstance(e, Fold):
        return (*e.init, *(b.value for b in e.binds), *e.update, e.result, *e.also)
    raise TypeError(f"not an expression: {e!r}")


def walk(e: Expr) -> Iterator[Expr]:
    """Every sub-expression, pre-order."""
    yield e
    for c in children(e):
        yield from walk(c)


def map_children(e: Expr, f: Callable[[Expr], Expr]) -> Expr:
    """Rebuild e with f applied to each direct child."""
    if isinstance(e, (Const, Read, IndexValue)):
        return e
    if isinstance(e, Bin):
        return Bin(e.op, f(e.a), f(e.b))
    if isinstance(e, Un):
        return Un(e.op, f(e.a))
    if isinstance(e, Reduce):
        return replace(e, body=f(e.body))
    if isinstance(e, Select):
        return Select(e.conds, f(e.then), f(e.other))
    if isinstance(e, Softmax):
        return replace(e, score=f(e.score))
    if isinstance(e, Let):
        return Let(replace(e.bind, value=f(e.bind.value)), f(e.body))
    if isinstance(e, Fold):
        return replace(
            e,
            init=tuple(f(x) for x in e.init),
            binds=tuple(replace(b, value=f(b.value)) for b in e.binds),
            update=tuple(f(x) for x in e.update),
            result=f(e.result),
            also=tuple(f(x) for x in e.also),
        )
    raise TypeError(f"not an expression: {e!r}")


def bound_here(e: Expr) -> frozenset[str]:
    """Index variables bound by this node (visible in some children)."""
    if isinstance(e, (Reduce, Softmax, Fold)):
        return frozenset({e.var})
    if isinstance(e, Let):
        return frozenset(v for v, _ in e.bind.dims)
    return frozenset()


def free_indices(e: Expr) -> frozenset[str]:
    """Index variables and size names used free in e (tensor names excluded)."""
    if isinstance(e, Const):
        return frozenset()
    if isinstance(e, IndexValue):
        return e.aff.names()
    if isinstance(e, Read):
        out: frozenset[str] = frozenset()
        for a in e.idx:
            out |= a.names()
        return out
    if isinstance(e, Select):
        out = frozenset()
        for c in e.conds:
            out |= c.names()
        return out | free_indices(e.then) | free_indices(e.other)
    if isinstance(e, Reduce):
        return e.ext.names() | (free_indices(e.body) - {e.var})
    if isinstance(e, Softmax):
        mask: frozenset[str] = frozenset()
        for c in e.mask:
            mask |= c.names()
        return e.ext.names() | e.at.names() | ((free_indices(e.score) | mask) - {e.var})
    if isinstance(e, Let):
        dims = {v for v, _ in e.bind.dims}
        exts: frozenset[str] = frozenset()
        for _, x in e.bind.dims:
            exts |= x.names()
        return exts | (free_indices(e.bind.value) - dims) | free_indices(e.body)
    if isinstance(e, Fold):
        out = e.ext.names()
        for x in e.init:
            out |= free_indices(x)
        inner: frozenset[str] = free_indices(e.result)
        for x in e.also:
            inner |= free_indices(x)
        for b in e.binds:
            dims = {v for v, _ in b.dims}
            inner |= free_indices(b.value) - dims
            for _, x in b.dims:
                inner |= x.names()
        for x in e.update:
            inner |= free_indices(x)
        return out | (inner - {e.var})
    if isinstance(e, (Bin, Un)):
        out = frozenset()
        for c in children(e):
            out |= free_indices(c)
        return out
    raise TypeError(f"not an expression: {e!r}")


def tensors_read(e: Expr) -> frozenset[str]:
    """The tensors e reads: as values, and as data of its conditions (integer inputs)."""
    out = {x.tensor for x in walk(e) if isinstance(x, Read)}
    for x in walk(e):
        conds = x.conds if isinstance(x, Select) else x.mask if isinstance(x, Softmax) else ()
        out |= {r.tensor for c in conds if isinstance(c, DataCond) for r in c.reads()}
    return frozenset(out)


def subst_index(e: Expr, name: str, value: Aff) -> Expr:
    """Substitute index variable `name` := value (capture-avoiding: binders must not clash)."""
    if isinstance(e, Const):
        return e
    if isinstance(e, IndexValue):
        return IndexValue(e.aff.subst(name, value))
    if isinstance(e, Read):
        return Read(e.tensor, tuple(a.subst(name, value) for a in e.idx))
    if isinstance(e, Select):
        return Select(
            tuple(c.subst(name, value) for c in e.conds),
            subst_index(e.then, name, value),
            subst_index(e.other, name, value),
        )
    if isinstance(e, Reduce):
        ext = e.ext.subst(name, value)
        if e.var == name:
            return replace(e, ext=ext)
        _check_capture(e.var, value)
        return replace(e, ext=ext, body=subst_index(e.body, name, value))
    if isinstance(e, Softmax):
        ext, at = e.ext.subst(name, value), e.at.subst(name, value)
        if e.var == name:
            return replace(e, ext=ext, at=at)
        _check_capture(e.var, value)
        return replace(
            e,
            ext=ext,
            at=at,
            score=subst_index(e.score, name, value),
            mask=tuple(c.subst(name, value) for c in e.mask),
        )
    if isinstance(e, Let):
        b = e.bind
        dims = tuple((v, x.subst(name, value)) for v, x in b.dims)
        dim_names = {v for v, _ in b.dims}
        for v in dim_names:
            _check_capture(v, value)
        new_value = b.value if name in dim_names else subst_index(b.value, name, value)
        return Let(replace(b, dims=dims, value=new_value), subst_index(e.body, name, value))
    if isinstance(e, Fold):
        ext = e.ext.subst(name, value)
        init = tuple(subst_index(x, name, value) for x in e.init)
        if e.var == name:
            return replace(e, ext=ext, init=init)
        _check_capture(e.var, value)
        binds = []
        for b in e.binds:
            dim_names = {v for v, _ in b.dims}
            binds.append(
                replace(
                    b,
                    dims=tuple((v, x.subst(name, value)) for v, x in b.dims),
                    value=b.value if name in dim_names else subst_index(b.value, name, value),
                )
            )
        return replace(
            e,
            ext=ext,
            init=init,
            binds=tuple(binds),
            update=tuple(subst_index(x, name, value) for x in e.update),
            result=subst_index(e.result, name, value),
            also=tuple(subst_index(x, name, value) for x in e.also),
        )
    return map_children(e, lambda c: subst_index(c, name, value))


def _check_capture(binder: str, value: Aff) -> None:
    if binder in value.names():
        raise ValueError(f"substitution would capture index {binder}")


def rename_tensor(e: Expr, old: str, new: str) -> Expr:
    """Replace reads of tensor `old` by reads of `new` (same indices)."""
    if isinstance(e, Read):
        return Read(new, e.idx) if e.tensor == old else e
    return map_children(e, lambda c: rename_tensor(c, old, new))


def replace_reads(e: Expr, tensor: str, f: Callable[[Read], Expr]) -> Expr:
    """Replace every read of `tensor` by f(read)."""
    if isinstance(e, Read):
        return f(e) if e.tensor == tensor else e
    return map_children(e, lambda c: replace_reads(c, tensor, f))


def all_binders(e: Expr) -> frozenset[str]:
    out: frozenset[str] = frozenset()
    for x in walk(e):
        out |= bound_here(x)
        if isinstance(x, Let):
            out |= {x.bind.name}
        if isinstance(x, Fold):
            out |= set(x.state) | {b.name for b in x.binds}
    return out


def fresh(base: str, taken: frozenset[str] | set[str]) -> str:
    """A name starting with `base` that is not in `taken`."""
    if base not in taken:
        return base
    k = 2
    while f"{base}{k}" in taken:
        k += 1
    return f"{base}{k}"


def names_in_program(p: Program) -> frozenset[str]:
    out: set[str] = {n for n, _ in p.sizes} | {n for n, _ in p.inputs}
    for d in p.defs:
        out.add(d.name)
        out |= {a.name for a in d.also}
        out |= {lp.var for lp in d.loops}
        out |= all_binders(d.body)
    return frozenset(out)


def sub_exprs_of_def(d: Def) -> Iterator[Expr]:
    yield from walk(d.body)
