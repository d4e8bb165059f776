"""Launch geometry of a plan: grid from plan.grid and the sizes, block from the warps, and the
dynamic shared-memory layout (shared by render.py so the kernel and its launch agree)."""
from __future__ import annotations

from codegen.plan import (DTYPE_BYTES, AttentionPlan, ContractionPlan, Plan, size_names,
                          threads)

_AXIS_INDEX = {"x": 0, "y": 1, "z": 2}
_GRID_LIMIT = (2**31 - 1, 65535, 65535)


def _align(n: int, a: int = 128) -> int:
    return (n + a - 1) // a * a


def smem_layout(plan: Plan) -> dict[str, int]:
    """Byte offsets of each shared region and 'total'. Regions absent from the plan are omitted."""
    out: dict[str, int] = {}
    off = 0
    if isinstance(plan, ContractionPlan):
        if plan.a.level == "shared":
            out["a"] = off
            off += _align(plan.stages * plan.block_m * plan.block_k * DTYPE_BYTES[plan.a.dtype])
        if plan.b.level == "shared":
            out["b"] = off
            off += _align(plan.stages * plan.block_k * plan.block_n * DTYPE_BYTES[plan.b.dtype])
    else:
        eb = DTYPE_BYTES[plan.q.dtype]
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


def launch_config(plan: Plan, sizes: dict[str, int], *, tma: bool = False
                  ) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    """(grid, block, dynamic shared-memory bytes) for the given sizes."""
    if isinstance(plan, ContractionPlan) and plan.mma == "wgmma":
        from codegen.render_wgmma import launch_config_wgmma

        return launch_config_wgmma(plan, sizes, tma=tma)
    if isinstance(plan, AttentionPlan) and plan.mma == "wgmma":
        from codegen.render_attn_wgmma import launch_config_attn_wgmma

        return launch_config_attn_wgmma(plan, sizes)
    return grid_dims(plan, sizes), (threads(plan), 1, 1), smem_bytes(plan)


def grid_dims(plan: Plan, sizes: dict[str, int]) -> tuple[int, int, int]:
    """Blocks along x, y, z: one per tile of each grid-mapped dimension."""
    check_sizes(plan, sizes)
    grid = [1, 1, 1]
    for g in plan.grid:
        grid[_AXIS_INDEX[g.axis]] = max(1, -(-sizes[g.dim] // g.tile))
    for i, (n, lim) in enumerate(zip(grid, _GRID_LIMIT)):
        if n > lim:
            raise ValueError(f"grid axis {'xyz'[i]} has {n} blocks > limit {lim}")
    return (grid[0], grid[1], grid[2])
