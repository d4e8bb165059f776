"""The mma.sync kernels' dynamic shared-memory layout (render.py sizes the kernel and its launch
from it; the grid comes from the kernel IR, codegen.source.Launch)."""
from __future__ import annotations

from compiler.machine import DTYPES

from codegen.mappings.plan import ContractionPlan, Plan, tile_rows

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
            off += _align(tile_rows(plan) * d * eb)
        if plan.k.level == "shared":
            out["k"] = off
            off += _align(plan.stages * plan.block_n * d * eb)
            out["v"] = off
            off += _align(plan.stages * plan.block_n * d * eb)
        if plan.mma is not None and not plan.p_in_registers:
            out["p"] = off
            off += _align(tile_rows(plan) * plan.block_n * eb)
    out["total"] = off
    return out
