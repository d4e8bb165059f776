"""The IR's index language: affine index expressions (`Aff`), loop extents (`Ext`) and the
comparisons that guard stores and values (`Cond`, a disjunction `Or`).  Re-exported by
compiler.ir, where the rest of the IR lives."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping as TMapping, Union



@dataclass(frozen=True)
class Aff:
    """An affine integer expression Σ cᵥ·v + const over index variables and size names."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(name: str, coef: int = 1) -> "Aff":
        return Aff(((name, coef),), 0) if coef else Aff()

    @staticmethod
    def lit(value: int) -> "Aff":
        return Aff((), value)

    @staticmethod
    def build(coefs: TMapping[str, int], const: int = 0) -> "Aff":
        return Aff(tuple(sorted((n, c) for n, c in coefs.items() if c)), const)

    def coef(self, name: str) -> int:
        return dict(self.terms).get(name, 0)

    def names(self) -> frozenset[str]:
        return frozenset(n for n, _ in self.terms)

    def __add__(self, other: "Aff | int") -> "Aff":
        other = other if isinstance(other, Aff) else Aff.lit(other)
        coefs = dict(self.terms)
        for n, c in other.terms:
            coefs[n] = coefs.get(n, 0) + c
        return Aff.build(coefs, self.const + other.const)

    def __sub__(self, other: "Aff | int") -> "Aff":
        other = other if isinstance(other, Aff) else Aff.lit(other)
        return self + other.scale(-1)

    def scale(self, k: int) -> "Aff":
        return Aff.build({n: c * k for n, c in self.terms}, self.const * k)

    def subst(self, name: str, value: "Aff") -> "Aff":
        c = self.coef(name)
        if not c:
            return self
        rest = Aff.build({n: k for n, k in self.terms if n != name}, self.const)
        return rest + value.scale(c)

    def rename(self, old: str, new: str) -> "Aff":
        return self.subst(old, Aff.of(new))

    def is_const(self) -> bool:
        return not self.terms

    def evaluate(self, env: TMapping[str, int]) -> int:
        return self.const + sum(c * env[n] for n, c in self.terms)

    def __str__(self) -> str:
        parts: list[str] = []
        for n, c in self.terms:
            if c == 1:
                parts.append(n)
            elif c == -1:
                parts.append(f"-{n}")
            else:
                parts.append(f"{c}*{n}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


@dataclass(frozen=True)
class Ext:
    """A loop extent: min over parts of ceil(num / div).  One part is the common case."""

    parts: tuple[tuple[Aff, int], ...]

    @staticmethod
    def of(num: Aff | int | str, div: int = 1) -> "Ext":
        if isinstance(num, int):
            num = Aff.lit(num)
        elif isinstance(num, str):
            num = Aff.of(num)
        return Ext(((num, div),))

    def single(self) -> tuple[Aff, int]:
        if len(self.parts) != 1:
            raise ValueError(f"extent {self} is a min of several parts")
        return self.parts[0]

    def const_value(self) -> int | None:
        if all(a.is_const() for a, _ in self.parts):
            return min(-(-a.const // d) for a, d in self.parts)
        return None

    def names(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for a, _ in self.parts:
            out |= a.names()
        return out

    def subst(self, name: str, value: Aff) -> "Ext":
        return Ext(tuple((a.subst(name, value), d) for a, d in self.parts))

    def evaluate(self, env: TMapping[str, int]) -> int:
        return max(0, min(-(-a.evaluate(env) // d) for a, d in self.parts))

    def __str__(self) -> str:
        def one(a: Aff, d: int) -> str:
            if d == 1:
                return str(a)
            return f"ceil({a}/{d})" if len(a.terms) + bool(a.const) <= 1 else f"ceil(({a})/{d})"

        if len(self.parts) == 1:
            return one(*self.parts[0])
        return "min(" + ", ".join(one(a, d) for a, d in self.parts) + ")"


@dataclass(frozen=True)
class Cond:
    """lhs < rhs or lhs <= rhs over affine expressions."""

    lhs: Aff
    op: str
    rhs: Aff

    def __post_init__(self) -> None:
        if self.op not in ("<", "<="):
            raise ValueError(f"bad comparison {self.op}")

    def names(self) -> frozenset[str]:
        return self.lhs.names() | self.rhs.names()

    def subst(self, name: str, value: Aff) -> "Cond":
        return Cond(self.lhs.subst(name, value), self.op, self.rhs.subst(name, value))

    def __str__(self) -> str:
        return f"{self.lhs} {self.op} {self.rhs}"


@dataclass(frozen=True)
class Or:
    """A disjunction of comparisons, one conjunct of a guard: `j <= i || j < P` (prefix-LM).

    A guard stays a conjunction (a tuple); an element is a Cond or an Or of at least two Conds
    (conjunctive normal form with atomic disjuncts).  Passes that need a half-space (a tile
    bound, a staging fill) take Cond only and refuse an Or by name."""

    parts: tuple[Cond, ...]

    def __post_init__(self) -> None:
        if len(self.parts) < 2 or not all(isinstance(c, Cond) for c in self.parts):
            raise ValueError("a disjunction joins at least two comparisons")

    def names(self) -> frozenset[str]:
        return frozenset().union(*(c.names() for c in self.parts))

    def subst(self, name: str, value: Aff) -> "Or":
        return Or(tuple(c.subst(name, value) for c in self.parts))

    def __str__(self) -> str:  # parenthesised: it is printed inside a conjunction
        return "(" + " || ".join(map(str, self.parts)) + ")"


@dataclass(frozen=True)
class DataRead:
    """A read of an integer input tensor (dtype i32) at affine indices: an integer value that a
    condition compares (`Doc[b, i] == Doc[b, j]`, the gather's `c == T[r]`).  Integer tensors
    are read only here, never as a float value."""

    tensor: str
    idx: tuple[Aff, ...]
    dims: tuple[Aff, ...]  # the tensor's shape (sizes): printers address and bound-check the read with it

    def names(self) -> frozenset[str]:
        return frozenset().union(*(a.names() for a in self.idx))

    def subst(self, name: str, value: Aff) -> "DataRead":
        return DataRead(self.tensor, tuple(a.subst(name, value) for a in self.idx), self.dims)

    def __str__(self) -> str:
        return f"{self.tensor}[{', '.join(map(str, self.idx))}]"


Side = Union[Aff, DataRead]


@dataclass(frozen=True)
class DataCond:
    """A comparison on integer tensor data, one conjunct of a guard: lhs op rhs with op one of
    <, <=, ==, each side an affine expression or a read of an integer input, at least one a
    read.  False when a read leaves its tensor (an out-of-range element compares false).

    Passes that need a half-space of the indices (a tile bound, a staging fill) take Cond only
    and refuse a DataCond by name, as they refuse an Or."""

    lhs: Side
    op: str
    rhs: Side

    def __post_init__(self) -> None:
        if self.op not in ("<", "<=", "=="):
            raise ValueError(f"bad comparison {self.op}")
        if not (isinstance(self.lhs, DataRead) or isinstance(self.rhs, DataRead)):
            raise ValueError("a data comparison reads an integer tensor on one side at least")

    def names(self) -> frozenset[str]:
        return self.lhs.names() | self.rhs.names()

    def reads(self) -> tuple[DataRead, ...]:
        return tuple(s for s in (self.lhs, self.rhs) if isinstance(s, DataRead))

    def subst(self, name: str, value: Aff) -> "DataCond":
        return DataCond(self.lhs.subst(name, value), self.op, self.rhs.subst(name, value))

    def __str__(self) -> str:
        return f"{self.lhs} {self.op} {self.rhs}"


SPAN_ROW = "_span_r"  # the query rows' private variables of a DataSpan: _span_r0, _span_r1, ...
SPAN_KEY = "_span_k"  # a DataSpan's key position variable


@dataclass(frozen=True)
class DataSpan:
    """The key tile `tile` lies in the key-tile span of its query block, derived from integer data:
    one conjunct of a guard, the same for every element of a tile (MASK-DATA adds it beside the
    comparison `query == key` it is derived from; compiler/rules/skip_data_span.py).

    V: the values `query` reads over its row box (each private row variable rows[n] = (name, count)
    runs over [0, count); reads outside the tensor are left out).  H: the key positions
    p < key_dim (p the variable SPAN_KEY of `key`) whose value key[p] lies in [min V, max V].  The
    span is [min H // size, max H // size + 1), empty when H is.  Wherever query == key holds for a
    row of the box at a key position p, p // size lies in the span (for any data): the tiles
    outside it are fully masked.  Its variables are private: substitution leaves them alone."""

    query: DataRead
    rows: tuple[tuple[str, int], ...]
    key: DataRead
    key_dim: Aff
    tile: Aff
    size: int

    def private(self) -> frozenset[str]:
        return frozenset(v for v, _ in self.rows) | {SPAN_KEY}

    def names(self) -> frozenset[str]:
        return ((self.query.names() | self.key.names()) - self.private()) | self.tile.names() | self.key_dim.names()

    def reads(self) -> tuple[DataRead, ...]:
        return (self.query, self.key)

    def subst(self, name: str, value: Aff) -> "DataSpan":
        if name in self.private():
            return self
        return DataSpan(self.query.subst(name, value), self.rows, self.key.subst(name, value),
                        self.key_dim.subst(name, value), self.tile.subst(name, value), self.size)

    def __str__(self) -> str:
        rows = ", ".join(f"{v} < {n}" for v, n in self.rows)
        return (f"{self.tile} in span({self.query} for {rows}; {self.key} for {SPAN_KEY} < {self.key_dim}; "
                f"/{self.size})")


Guard = Union[Cond, Or, DataCond, DataSpan]
