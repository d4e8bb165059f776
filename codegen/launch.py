"""Launch geometry of a tensor-core plan: grid from plan.grid and the sizes, and the mma.sync
kernels' dynamic shared-memory layout (used by render.py so the kernel and its launch agree)."""
from __future__ import annotations

from compiler.machine import DEVICE, DTYPES

from codegen.plan import ContractionPlan, Plan, size_names

_AXIS_INDEX = {"x": 0, "y": 1, "z": 2}


def _align(n: int, a: int = 128) -> int:
    return (n + a - 1) // a * a


def smem_layout(plan: Plan) -> dict[str, int]:
    """Byte offsets of each shared region and 'total'. Regions absent from the plan are omitted."""
    out: dict[str, int] = {}
    off = 0
    if isinstance(plan, ContractionPlan):
        if plan.a.level == "shared":
            out["a"] = off
            off += _align(plan.stages * plan.block_m * plan.block_k * DTYPES[plan.a.dtype].bytes)
        if plan.b.level == "shared":
            out["b"] = off
            off += _align(plan.stages * plan.block_k * plan.block_n * DTYPES[plan.b.dtype].bytes)
    else:
        eb = DTYPES[plan.q.dtype].bytes
        d = plan.head_dim
        if plan.mma is not None or plan.q.level == "shared":
            out["q"] = off
            off += _align(plan.block_m * d * eb)
        if plan.k.level == "shared":
            out["k"] = off
            off += _align(plan.stages * plan.block_n * d * eb)
            out["v"] = off
            off += _align(plan.stages * plan.block_n * d * eb)
        if plan.mma is not None and not plan.p_in_registers:
            out["p"] = off
            off += _align(plan.block_m * plan.block_n * eb)
    out["total"] = off
    return out


def smem_bytes(plan: Plan) -> int:
    return smem_layout(plan)["total"]


def check_sizes(plan: Plan, sizes: dict[str, int]) -> None:
    """Every size named, non-negative, fixed ones equal to the compiled value."""
    fixed = dict(plan.fixed)
    for name in size_names(plan):
        if name not in sizes:
            raise ValueError(f"size {name!r} missing (have {sorted(sizes)})")
        v = sizes[name]
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"size {name!r} must be a non-negative int, got {v!r}")
        if name in fixed and v != fixed[name]:
            raise ValueError(f"size {name!r} is fixed to {fixed[name]} in the compiled kernel, got {v}")
        if name in plan.dynamic and v >= 2**31:
            raise ValueError(f"size {name!r} = {v} does not fit int32")


def grid_dims(plan: Plan, sizes: dict[str, int]) -> tuple[int, int, int]:
    """Blocks along x, y, z: one per tile of each grid-mapped dimension."""
    check_sizes(plan, sizes)
    grid = [1, 1, 1]
    for g in plan.grid:
        grid[_AXIS_INDEX[g.axis]] = max(1, -(-sizes[g.dim] // g.tile))
    for i, (n, lim) in enumerate(zip(grid, DEVICE.grid_limits)):
        if n > lim:
            raise ValueError(f"grid axis {'xyz'[i]} has {n} blocks > limit {lim}")
    return (grid[0], grid[1], grid[2])
