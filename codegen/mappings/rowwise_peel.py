"""Vector accesses over a fixed row the vector does not divide, for the rowwise printer
(codegen/mappings/rowwise.py): a vocabulary row, C = 50257 f16 elements, starts at a different
place in a 16-byte word on each row, so the plain printer reads it one element at a time.

Here each row is cut at run time where its first 16-byte boundary is: a head of hd_ < V elements
(one per thread), then whole V-element vectors from that boundary (the sweeps), then a tail of
tl_ < V elements (one per thread).  Every thread folds its head, vectors and tail elements into
its partial value as before; only which columns a thread owns and how they are loaded differ (a
float reordering of the block reduction, as any thread count is).  It applies when every row the
kernel reads or writes at the column has the same shape, element size and row index (the same
offset: one head for all), nothing is staged in registers and there is no tile loop; at run time
the tensors' bases must lie at the same place in a 16-byte word, else the kernel takes the body
printed one element at a time (rowwise._render prints both).
"""
from __future__ import annotations

from typing import Callable

from compiler.ir import Aff
from compiler.machine import DTYPES

from ..kir.ir import Kernel, Stage, TileLoop

# a row access: (tensor, its leading indices)
RowAccess = tuple[str, tuple[Aff, ...]]


def can_peel(k: Kernel, row: int, vec: int, width: int) -> bool:
    """A fixed row the widest vector does not divide, no register row, no tile loop."""
    wide = 16 // width
    return wide > vec and row % wide != 0 and not any(isinstance(s, (Stage, TileLoop)) for s in k.body)


def uniform(k: Kernel, accesses: set[RowAccess]) -> bool:
    """The row accesses share one offset: same shape, element size and leading indices."""
    shapes = {(k.tensor(n).dims, DTYPES[k.tensor(n).dtype].bytes, lead) for n, lead in accesses}
    return len(shapes) == 1


class PeeledRowSweeps:
    """Mixed into the rowwise printer: the head / vectors / tail sweep of a peeled fixed row."""

    threads: int
    block: int
    vec: int
    row: int | None
    sweeps: int | None
    row_accesses: set[RowAccess]

    def head_lines(self, offset: Callable[[str, tuple[Aff, ...], str], str]) -> list[str]:
        """hd_ and tl_ of this block's row, from the first row access's address."""
        name, lead = sorted(self.row_accesses, key=lambda a: a[0])[0]
        esize = DTYPES[self.k.tensor(name).dtype].bytes  # type: ignore[attr-defined]
        addr = f"reinterpret_cast<unsigned long long>(p_{name} + {offset(name, lead, '0')})"
        head = f"(long long)(((16ULL - ({addr} & 15ULL)) & 15ULL) / {esize}ULL)"
        return [f"const long long hd_ = {head} < {self.row}LL ? {head} : {self.row}LL;",
                f"const long long tl_ = ({self.row}LL - hd_) % {self.vec};"]

    def sweep_peeled(self, make: Callable[[], list[str]], unroll: str) -> list[str]:
        """The head (one element per thread), the aligned vectors, the tail (one element per thread)."""
        vec = self.vec
        main = make()
        self.vec = 1
        try:
            head, tail = make(), make()
        finally:
            self.vec = vec

        def one(col0: str, live: str, body: list[str]) -> list[str]:
            return (["{", f"    const long long col0 = {col0};", f"    if ({live}) {{"]
                    + ["        " + x for x in body] + ["    }", "}"])

        owner = f" && threadIdx.x < {self.threads}" if self.block != self.threads else ""
        vectors = ([unroll, f"for (int k = 0; k < {self.sweeps}; ++k) {{",
                    f"    const long long col0 = hd_ + ((long long)k * {self.threads} + threadIdx.x) * {vec};",
                    f"    if (col0 + {vec} <= {self.row}LL{owner}) {{"]
                   + ["        " + x for x in main] + ["    }", "}"])
        return (one("(long long)threadIdx.x", "(long long)threadIdx.x < hd_", head) + vectors
                + one(f"{self.row}LL - tl_ + threadIdx.x", "(long long)threadIdx.x < tl_", tail))
