"""The rowwise printer's plan (codegen/mappings/rowwise.py): the instruction choices it makes per
row kernel and the row it maps — the threads that own a row's columns, the vector width, the
sweeps — with the refusal every part of the printer raises for a kernel that does not fit.
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler.ir import Aff, Reduce
from compiler.ir import Mapping as IrMapping

from ..kir.ir import Kernel, LaneDim, TileLoop, sub_expressions
from ..kir.lower import UnsupportedMapping


def refuse(what: str) -> UnsupportedMapping:
    return UnsupportedMapping(f"rowwise mapping: {what}")


# threads per row of a kernel that stores one value per row (no column loop to map): an
# instruction choice of this printer, like the vector width
PER_ROW_THREADS = 256
# sweeps over a row (not a register row) unrolled in full up to this many
MAX_UNROLLED_SWEEPS = 16


def row_of_reductions(k: Kernel) -> LaneDim:
    """The row of a kernel with no lane (loss[r] = … sum(k < C: …) …): the one extent of its
    reductions, which the block's threads stride over (a stand-in lane the store never uses)."""
    exts = {x.ext for x in sub_expressions(k) if isinstance(x, Reduce)}
    if len(exts) != 1 or any(isinstance(s, TileLoop) for s in k.body):
        raise refuse(f"the kernel is not one row per block: no lane, and {len(exts)} reduction extents "
                     f"({', '.join(sorted(map(str, exts)))}) or a tile loop")
    ext = exts.pop()
    fixed = fixed_value(ext.single()[0], k) if len(ext.parts) == 1 and ext.parts[0][1] == 1 else None
    return LaneDim("col_", fixed, IrMapping("thread", "", PER_ROW_THREADS), None if fixed else ext)


@dataclass(frozen=True)
class RowPlan:
    """The instruction choices: threads per row, vector width, vectors per thread."""

    threads: int  # threads that own columns (the PARALLEL count)
    block: int  # threads per block (a whole number of warps)
    row: int | None  # C, the row length (elements); None: dynamic, a kernel argument
    vec: int  # elements per vector access (a dynamic row: where aligned, else 1)
    sweeps: int | None  # vectors per thread (None: as many as the row takes)
    tail: bool  # the last sweep is partly past the row end (guarded)
    rows_cached: tuple[str, ...]
    reductions: tuple[str, ...]
    stream_hints: bool  # .cs loads of the staged rows and stores of the output
    mma: None = None  # no tensor-core instruction
    peeled: bool = False  # a fixed row cut at its first 16-byte boundary (rowwise_peel.py)
    # per tensor, the sweeps over the row that load or store it in memory (not from registers)
    row_passes: tuple[tuple[str, int], ...] = ()


def fixed_value(a: Aff, k: Kernel) -> int | None:
    for n, v in k.fixed().items():
        a = a.subst(n, Aff.lit(v))
    return a.const if a.is_const() else None
