"""Row vectors between memory and registers for the rowwise printer (codegen/mappings/rowwise.py):
the element offsets of a row access, vector loads and stores of at most 16 bytes (elements taken
from and put into the loaded words by shifts: no type punning), and the count of the passes
over the row each tensor makes in memory (the plan's row_passes).
"""
from __future__ import annotations

from compiler.ir import Aff, Read
from compiler.machine import DTYPES

from ..kir.ir import Kernel
from .cexpr import aff_c
from .rowwise_plan import fixed_value, refuse

RAW = {16: "uint4", 8: "uint2", 4: "unsigned", 2: "unsigned short"}

def pieces(esize: int, vec: int) -> list[tuple[int, int, int]]:
    """(bytes, first element, 32-bit words) of each access of a vector of `vec` elements."""
    nbytes = esize * vec
    if nbytes < 4:
        return [(nbytes, e, 0) for e in range(vec)]
    piece = min(16, nbytes)
    return [(piece, p * piece // esize, piece // 4) for p in range(nbytes // piece)]


def word_names(q: str, n: int) -> list[str]:
    return [q] if n == 1 else [f"{q}.{c}" for c in "xyzw"[:n]]


class RowMemory:
    """Mixed into the rowwise printer: where a row access is and how a vector of it moves."""

    k: Kernel
    names: dict[str, str]
    grid_vars: set[str]
    row: int | None
    row_aff: Aff
    vec: int
    stream: bool
    row_accesses: set[tuple[str, tuple[Aff, ...]]]
    moved: list[str]
    passes: dict[str, int]

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
                raise refuse(f"{what}: index {a} of {r.tensor} is not a row index (grid variables and sizes only)")
        return lead

    def offset(self, name: str, lead: tuple[Aff, ...], last: str) -> str:
        if last == "col0":
            self.row_accesses.add((name, lead))
        parts = [f"(long long){aff_c(a, self.names)} * {s}" for a, s in zip(lead, self.strides(name))]
        return " + ".join(parts + [last])

    def row_dim_ok(self, name: str) -> None:
        dim = self.k.tensor(name).dims[-1]
        if (dim != self.row_aff) if self.row is None else (fixed_value(dim, self.k) != self.row):
            raise refuse(f"tensor {name}'s last dimension {self.k.tensor(name).dims[-1]} is not the row length {self.row}")

    def load_vec(self, name: str, off: str, dst: str, stream: bool = False) -> list[str]:
        """V elements of tensor `name` at element offset `off` into floats dst[0..V) (vector loads of
        at most 16 bytes, elements taken from the loaded words by shifts: no type punning)."""
        dt = DTYPES[self.k.tensor(name).dtype]
        self.moved.append(name)
        out = [f"float {dst}[{self.vec}];"]
        for piece, first, words in pieces(dt.bytes, self.vec):
            q = self.fresh("q_")
            if words == 0:  # one 2-byte element
                out.append(f"{dst}[{first}] = {dt.name}_to_f32(p_{name}[{off} + {first}]);")
                continue
            ptr = f"p_{name} + {off} + {first}"
            if stream and piece == 16:
                out.append(f"const uint4 {q} = ld_stream_u4({ptr});")
            else:
                out.append(f"const {RAW[piece]} {q} = *reinterpret_cast<const {RAW[piece]}*>({ptr});")
            w = word_names(q, words)
            for e in range(piece // dt.bytes):
                if dt.bytes == 4:
                    out.append(f"{dst}[{first + e}] = __uint_as_float({w[e]});")
                else:
                    word = w[e // 2]
                    half = f"(unsigned short)({word} & 0xffffu)" if e % 2 == 0 else f"(unsigned short)({word} >> 16)"
                    out.append(f"{dst}[{first + e}] = {dt.name}_to_f32({half});")
        return out

    def store_vec(self, name: str, off: str, values: list[str]) -> list[str]:
        """values (C floats, one per element) to tensor `name` at element offset `off`."""
        dt = DTYPES[self.k.tensor(name).dtype]
        self.moved.append(name)
        out = []
        conv = [self.fresh("o_") for _ in values]
        for c, v in zip(conv, values):
            out.append(f"const {dt.ctype} {c} = f32_to_{dt.name}({v});")
        for piece, first, words in pieces(dt.bytes, self.vec):
            if words == 0:
                out.append(f"p_{name}[{off} + {first}] = {conv[first]};")
                continue
            ws = []
            for wi in range(words):
                if dt.bytes == 4:
                    ws.append(f"__float_as_uint({conv[first + wi]})")
                else:
                    lo, hi = conv[first + 2 * wi], conv[first + 2 * wi + 1]
                    ws.append(f"((unsigned){lo} | ((unsigned){hi} << 16))")
            val = {1: ws[0], 2: f"make_uint2({', '.join(ws)})", 4: f"make_uint4({', '.join(ws)})"}[words]
            if self.stream and piece == 16:
                out.append(f"st_stream_u4(p_{name} + {off} + {first}, {val});")
            else:
                out.append(f"*reinterpret_cast<{RAW[piece]}*>(p_{name} + {off} + {first}) = {val};")
        return out

    def count_pass(self, mark: int) -> None:
        """One more pass over the row for each tensor moved in memory since `mark`."""
        for name in set(self.moved[mark:]):
            self.passes[name] = self.passes.get(name, 0) + 1
