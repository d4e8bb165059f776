"""Printer-level fixtures: instruction-choice records (plans) and fold masks built by hand, for
tests of the tensor-core printers' contracts and validation (render, launch, SASS).  Kernels
that run come from specs through the whole pipeline, never from these."""
from __future__ import annotations

from compiler.ir import Aff, Cond, Ext

from codegen.mappings.online_fold import FoldMask, mask_context
from codegen.mappings.plan import AttentionPlan, ContractionPlan, GridAxis, Operand


def gemm(name: str, dtype: str = "f16", out_dtype: str | None = None, *, batch: bool = False,
         block=(128, 128, 32), warps=(2, 4), stages: int = 3, mma: str | None = "mma_sync",
         levels=("shared", "shared"), b_transposed: bool = False, a_transposed: bool = False, guards=(False, False, False),
         swizzle: bool = True) -> ContractionPlan:
    bdims = ("B",) if batch else ()
    a = Operand("A", bdims + (("K", "M") if a_transposed else ("M", "K")), dtype, levels[0])
    b = Operand("Bm", bdims + (("N", "K") if b_transposed else ("K", "N")), dtype, levels[1])
    c = Operand("C", bdims + ("M", "N"), out_dtype or dtype, "global")
    grid = (GridAxis("jo", "N", block[1], "x"), GridAxis("io", "M", block[0], "y"))
    if batch:
        grid += (GridAxis("b", "B", 1, "z"),)
    return ContractionPlan(
        kernel_name=name, a=a, b=b, c=c, b_transposed=b_transposed, a_transposed=a_transposed, m="M", n="N", k="K",
        batch=bdims, fixed=(), dynamic=bdims + ("M", "N", "K"),
        block_m=block[0], block_n=block[1], block_k=block[2], warps_m=warps[0], warps_n=warps[1],
        stages=stages, mma=mma, acc_dtype="f32", guard_m=guards[0], guard_n=guards[1],
        guard_k=guards[2], grid=grid, swizzle=swizzle)


def attention(name: str, dtype: str = "f16", d: int = 128, *, block=(128, 64), warps: int = 8,
              stages: int = 2, mma: str | None = "mma_sync", q_level: str = "register",
              kv_level: str = "shared", p_in_registers: bool = True, guards=(False, False),
              swizzle: bool = True, scale: float | None = None) -> AttentionPlan:
    dims = ("B", "H", "N", "D")
    kdims = ("B", "H", "Nk", "D")
    return AttentionPlan(
        kernel_name=name,
        q=Operand("q", dims, dtype, q_level), k=Operand("k", kdims, dtype, kv_level),
        v=Operand("v", kdims, dtype, kv_level), o=Operand("o", dims, dtype, "global"),
        batch=("B", "H"), seq_q="N", seq_k="Nk", head_dim=d,
        scale=scale if scale is not None else d ** -0.5,
        fixed=(("D", d),), dynamic=("B", "H", "N", "Nk"),
        block_m=block[0], block_n=block[1], warps=warps, stages=stages, mma=mma,
        p_in_registers=p_in_registers, guard_q=guards[0], guard_kv=guards[1],
        grid=(GridAxis("io", "N", block[0], "x"), GridAxis("h", "H", 1, "y"), GridAxis("b", "B", 1, "z")),
        swizzle=swizzle)


def mask(plan: AttentionPlan, causal: bool, strict: bool = False) -> dict:
    """The template entries of a key-tail mask (and a causal one, skipping tiles above it)."""
    bm, bn = plan.block_m, plan.block_n
    col = Aff.build({"c": 1, "jo": bn})
    conds = [Cond(col, "<", Aff.of("Nk"))]
    ext = Ext.of("Nk", bn)
    if causal:
        conds.append(Cond(col, "<" if strict else "<=", Aff.build({"ii": 1, "io": bm})))
        ext = Ext(ext.parts + ((Aff.build({"io": bm}, bm), bn),))
    return mask_context(FoldMask(tuple(conds), "ii", "c", "io", "jo", ext), plan)
