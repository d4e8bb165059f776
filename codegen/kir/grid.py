"""Block indices of a grid whose axes may carry several loops.

PARALLEL may map a second loop to a used CUDA axis; the axis then enumerates the product of its
loops' extents, row-major in grid order (`codegen.kir.ir.GridDim`): with loops (v1 < E1, …, vk < Ek)
on axis a, vi = (blockIdx.a / (E(i+1) * … * Ek)) mod Ei.  Every printer (SIMT and the
tensor-core skeletons) takes its block indices from here, and the runtime sizes the axis as
the product (`axis_blocks`), so the two agree by construction.
"""
from __future__ import annotations

from typing import Sequence


def block_index_c(dims: Sequence[tuple[str, str, str]]) -> dict[str, str]:
    """C expression of each grid loop's block index; dims: (loop, extent as C, axis) in grid order."""
    out: dict[str, str] = {}
    for i, (var, ext, axis) in enumerate(dims):
        later = [e for _, e, a in dims[i + 1:] if a == axis]
        earlier = any(a == axis for _, _, a in dims[:i])
        if not later and not earlier:
            out[var] = f"blockIdx.{axis}"
            continue
        x = f"(long long)blockIdx.{axis}"
        if later:
            x = f"({x} / ({' * '.join(f'({e})' for e in later)}))"
        if earlier:
            x = f"({x} % ({ext}))"
        out[var] = x
    return out


def axis_blocks(extents: Sequence[tuple[str, int]]) -> tuple[int, int, int]:
    """Blocks per CUDA axis (x, y, z): the product of the extents on it, at least 1."""
    grid = [1, 1, 1]
    seen = [False, False, False]
    for axis, n in extents:
        i = "xyz".index(axis)
        grid[i] = n * grid[i] if seen[i] else n
        seen[i] = True
    return tuple(max(1, n) for n in grid)  # type: ignore[return-value]
