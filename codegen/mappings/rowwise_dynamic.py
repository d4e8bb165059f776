"""The sweeps of a row of dynamic length for the rowwise printer (codegen/mappings/rowwise.py).

A row of dynamic length C has no register copy in the program (CACHE stages a row of a fixed
size), so every pass over it — each row reduction, the store — reads its tensors again.  Where
the data movement is the printer's to choose, it keeps a prefix of the row in registers: a
tensor row read at the column by two sweeps or more is loaded by the first of them into the
registers of the thread that owns the columns, for the first K sweeps (K·threads·V ≤ 8192
columns, at most 64 floats per thread and tensor), and read there by the later sweeps; the
columns past the prefix are read from memory each time.  Each sweep is then two loops: the
prefix (unrolled: the register arrays are indexed by the loop counter) and the rest (rolled),
both guarded at the row's end.  The values and their order are those of the plain sweep; only
where they are read from differs.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

from compiler.ir import Aff, Read, Reduce, walk

from ..kir.ir import Compute, Kernel

# columns of a dynamic row kept in registers per reused tensor row, and the most floats per thread
REGISTER_ROW_COLUMNS = 8192
REGISTER_ROW_FLOATS = 64

RowKey = tuple[str, tuple[Aff, ...]]  # (tensor, leading indices)


def reused_rows(k: Kernel, col: str) -> frozenset[RowKey]:
    """Tensor rows read at the column by two sweeps or more: each row reduction is a sweep over
    its bound index, the store a sweep over the column."""
    sweeps: list[tuple[str, object]] = [(x.var, x.body) for s in k.body if isinstance(s, Compute)
                                        for x in walk(s.value) if isinstance(x, Reduce)]
    sweeps += [(x.var, x.body) for x in walk(k.store.value) if isinstance(x, Reduce)]
    sweeps.append((col, k.store.value))
    count: Counter[RowKey] = Counter()
    for var, body in sweeps:
        count.update({(x.tensor, x.idx[:-1]) for x in walk(body)
                      if isinstance(x, Read) and x.idx and x.idx[-1] == Aff.of(var)})
    return frozenset(key for key, n in count.items() if n >= 2)


class DynamicRowSweeps:
    """Mixed into the rowwise printer: the state and the sweep of a dynamic row."""

    threads: int
    block: int
    vec: int
    row_c: str

    def init_dynamic(self, k: Kernel, col: str) -> None:
        self.reused = reused_rows(k, col)
        self.prefix = max(1, min(REGISTER_ROW_COLUMNS // (self.threads * self.vec), REGISTER_ROW_FLOATS // self.vec))
        self.in_registers = False  # printing the prefix loop's body
        self.register_rows: dict[RowKey, str] = {}  # reused row -> its register array
        self.named_rows: dict[RowKey, str] = {}  # arrays the other copy of this prefix declared
        self.declarations: list[str] = []  # register arrays to declare before the current sweep

    def register_read(self, key: RowKey, load: Callable[[str], list[str]], loads: list[str]) -> str | None:
        """The element j of this thread's vector k of a reused row, in the prefix loop: loaded
        into the register array by the first sweep that reads it, read there by the others.
        None outside the prefix loop or for a row read once."""
        if not self.in_registers or key not in self.reused:
            return None
        name = self.register_rows.get(key)
        if name is not None:
            return f"{name}[k][j]"
        name = self.named_rows.get(key)
        if name is None:
            name = self.fresh("xr_")  # type: ignore[attr-defined]
            self.declarations.append(f"float {name}[{self.prefix}][{self.vec}];")
        self.register_rows[key] = name
        dst = self.fresh("rd_")  # type: ignore[attr-defined]
        loads += load(dst)
        loads += ["#pragma unroll", f"for (int j = 0; j < {self.vec}; ++j) {name}[k][j] = {dst}[j];"]
        return f"{name}[k][j]"

    def sweep_dynamic(self, make: Callable[[], list[str]]) -> list[str]:
        """The sweep over a dynamic row of the body `make` prints: the register prefix, then the rest.
        The prefix is printed twice: without the row-end guard where the row covers it (every
        column of it exists: its loads are independent, the compiler issues them all at once, as
        in a fixed-width kernel), and guarded for a shorter row (a guard per vector orders them)."""
        self.in_registers = True
        before = dict(self.register_rows)
        try:
            prefix = make()
            # the guarded copy (the other branch) loads the same register rows into the same arrays
            self.named_rows, self.register_rows = dict(self.register_rows), before
            prefix_short = make()
        finally:
            self.in_registers = False
            self.named_rows = {}
        rest = make()
        decls, self.declarations = self.declarations, []
        owner = f"threadIdx.x < {self.threads}" if self.block != self.threads else ""
        live = f"col0 < {self.row_c}" + (f" && {owner}" if owner else "")
        col0 = f"    const long long col0 = ((long long)k * {self.threads} + threadIdx.x) * {self.vec};"

        def loop(head: list[str], body: list[str], guard: str) -> list[str]:
            if not guard:
                return head + [col0] + ["    " + x for x in body] + ["}"]
            return head + [col0, f"    if ({guard}) {{"] + ["        " + x for x in body] + ["    }", "}"]

        unrolled = ["#pragma unroll", f"for (int k = 0; k < {self.prefix}; ++k) {{"]
        covered = f"{self.row_c} >= {self.prefix * self.threads * self.vec}LL"
        return (decls + [f"if ({covered}) {{"] + ["    " + x for x in loop(unrolled, prefix, owner)] + ["} else {"]
                + ["    " + x for x in loop(unrolled, prefix_short, live)] + ["}"]
                + loop(["#pragma unroll 1",
                        f"for (int k = {self.prefix}; (long long)k * {self.threads * self.vec} < {self.row_c}; ++k) {{"],
                       rest, live))
