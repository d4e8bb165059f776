"""Hand-built plans (what the lowering will later produce), shared by tests/gpu and gpu_check."""
from __future__ import annotations

from codegen.plan import AttentionPlan, ContractionPlan, GridAxis, Operand


def gemm(name: str, dtype: str = "f16", out_dtype: str | None = None, *, batch: bool = False,
         block=(128, 128, 32), warps=(2, 4), stages: int = 3, mma: str | None = "mma_sync",
         levels=("shared", "shared"), b_transposed: bool = False, guards=(False, False, False),
         swizzle: bool = True) -> ContractionPlan:
    bdims = ("B",) if batch else ()
    a = Operand("A", bdims + ("M", "K"), dtype, levels[0])
    b = Operand("Bm", bdims + (("N", "K") if b_transposed else ("K", "N")), dtype, levels[1])
    c = Operand("C", bdims + ("M", "N"), out_dtype or dtype, "global")
    grid = (GridAxis("jo", "N", block[1], "x"), GridAxis("io", "M", block[0], "y"))
    if batch:
        grid += (GridAxis("b", "B", 1, "z"),)
    return ContractionPlan(
        kernel_name=name, a=a, b=b, c=c, b_transposed=b_transposed, m="M", n="N", k="K",
        batch=bdims, fixed=(), dynamic=bdims + ("M", "N", "K"),
        block_m=block[0], block_n=block[1], block_k=block[2], warps_m=warps[0], warps_n=warps[1],
        stages=stages, mma=mma, acc_dtype="f32", guard_m=guards[0], guard_n=guards[1],
        guard_k=guards[2], grid=grid, swizzle=swizzle)


def attention(name: str, dtype: str = "f16", d: int = 128, *, causal: bool = False,
              block=(128, 64), warps: int = 8, stages: int = 2, mma: str | None = "mma_sync",
              q_level: str = "register", kv_level: str = "shared", p_in_registers: bool = True,
              skip_masked_tiles: bool = True, guards=(False, False), swizzle: bool = True,
              scale: float | None = None) -> AttentionPlan:
    dims = ("B", "H", "N", "D")
    kdims = ("B", "H", "Nk", "D")
    return AttentionPlan(
        kernel_name=name,
        q=Operand("q", dims, dtype, q_level), k=Operand("k", kdims, dtype, kv_level),
        v=Operand("v", kdims, dtype, kv_level), o=Operand("o", dims, dtype, "global"),
        batch=("B", "H"), seq_q="N", seq_k="Nk", head_dim=d,
        scale=scale if scale is not None else d ** -0.5, causal=causal,
        fixed=(("D", d),), dynamic=("B", "H", "N", "Nk"),
        block_m=block[0], block_n=block[1], warps=warps, stages=stages, mma=mma,
        p_in_registers=p_in_registers, skip_masked_tiles=skip_masked_tiles,
        guard_q=guards[0], guard_kv=guards[1],
        grid=(GridAxis("io", "N", block[0], "x"), GridAxis("h", "H", 1, "y"), GridAxis("b", "B", 1, "z")),
        swizzle=swizzle)


def variants() -> dict[str, object]:
    """Every plan variant gpu_check compiles (names are kernel names)."""
    v: dict[str, object] = {}
    # GEMM
    v["g_f16_128x128x32_s3"] = gemm("g_f16_128x128x32_s3")
    v["g_f16_128x128x32_s4"] = gemm("g_f16_128x128x32_s4", stages=4)
    v["g_f16_128x256x32_s3"] = gemm("g_f16_128x256x32_s3", block=(128, 256, 32), warps=(2, 4))
    v["g_f16_128x128x64_s3"] = gemm("g_f16_128x128x64_s3", block=(128, 128, 64), stages=3)
    v["g_f16_128x128x32_w4_s3"] = gemm("g_f16_128x128x32_w4_s3", warps=(2, 2))
    v["g_f16_128x128x32_w4_s4"] = gemm("g_f16_128x128x32_w4_s4", warps=(2, 2), stages=4)
    v["g_f16_128x128x64_w4_s3"] = gemm("g_f16_128x128x64_w4_s3", block=(128, 128, 64), warps=(2, 2))
    v["g_f16_128x128x64_w4_s2"] = gemm("g_f16_128x128x64_w4_s2", block=(128, 128, 64), warps=(2, 2), stages=2)
    v["g_f16_256x128x32_s3"] = gemm("g_f16_256x128x32_s3", block=(256, 128, 32), warps=(4, 2))
    v["g_f16_128x256x32_s4"] = gemm("g_f16_128x256x32_s4", block=(128, 256, 32), warps=(2, 4), stages=4)
    v["g_f16_128x256x64_s3"] = gemm("g_f16_128x256x64_s3", block=(128, 256, 64), warps=(2, 4))
    v["g_f16_guard"] = gemm("g_f16_guard", guards=(True, True, True))
    v["g_bf16_guard_bt"] = gemm("g_bf16_guard_bt", "bf16", guards=(True, True, True), b_transposed=True)
    v["g_bf16_64x64_s2_batch"] = gemm("g_bf16_64x64_s2_batch", "bf16", batch=True, block=(64, 64, 32),
                                      warps=(2, 2), stages=2, guards=(True, True, True))
    v["g_f16_noswz_s1"] = gemm("g_f16_noswz_s1", block=(64, 128, 32), warps=(2, 2), stages=1,
                               swizzle=False, guards=(True, True, True), out_dtype="f32")
    v["g_f16_global"] = gemm("g_f16_global", block=(64, 64, 32), warps=(2, 2), levels=("global", "global"),
                             guards=(True, True, True))
    v["g_f16_mixed"] = gemm("g_f16_mixed", block=(64, 64, 32), warps=(2, 2), levels=("shared", "global"),
                            guards=(True, True, True), b_transposed=True)
    v["g_f32_simt"] = gemm("g_f32_simt", "f32", mma=None, block=(64, 64, 16), warps=(2, 2), stages=2,
                           guards=(True, True, True))
    v["g_f32_simt_128"] = gemm("g_f32_simt_128", "f32", mma=None, block=(128, 128, 8), warps=(4, 2),
                               stages=3, guards=(True, True, True), batch=True)
    v["g_f32_simt_global"] = gemm("g_f32_simt_global", "f32", mma=None, block=(32, 32, 8), warps=(1, 2),
                                  levels=("global", "shared"), guards=(True, True, True), b_transposed=True)
    # attention
    for d in (64, 128):
        bn = 128 if d == 64 else 64
        for causal in (False, True):
            n = f"a_f16_d{d}_{'c' if causal else 'nc'}"
            v[n] = attention(n, d=d, causal=causal, block=(128, bn))
        n = f"a_bf16_d{d}_guard_c"
        v[n] = attention(n, "bf16", d=d, causal=True, block=(128, bn), guards=(True, True))
    v["a_f16_d128_nc_s3"] = attention("a_f16_d128_nc_s3", d=128, block=(128, 64), stages=3)
    v["a_f16_d128_nc_qs"] = attention("a_f16_d128_nc_qs", d=128, block=(128, 64), q_level="shared")
    v["a_f16_d128_c_w4"] = attention("a_f16_d128_c_w4", d=128, block=(64, 64), warps=4, causal=True)
    v["a_f16_d64_w4"] = attention("a_f16_d64_w4", d=64, block=(128, 64), warps=4, stages=3)
    v["a_f16_d128_qs_psmem"] = attention("a_f16_d128_qs_psmem", d=128, block=(64, 64), warps=4,
                                         q_level="shared", p_in_registers=False, causal=True,
                                         guards=(True, True), skip_masked_tiles=False, swizzle=False)
    v["a_f16_d128_s1"] = attention("a_f16_d128_s1", d=128, block=(128, 64), stages=1, causal=True,
                                   guards=(True, True))
    v["a_f32_simt_d64"] = attention("a_f32_simt_d64", "f32", d=64, block=(32, 16), warps=4, mma=None,
                                    causal=True, guards=(True, True))
    v["a_f32_simt_d128"] = attention("a_f32_simt_d128", "f32", d=128, block=(32, 16), warps=8, mma=None,
                                     q_level="shared", guards=(True, True))
    v["a_f32_simt_global"] = attention("a_f32_simt_global", "f32", d=64, block=(16, 16), warps=2, mma=None,
                                       q_level="global", kv_level="global", causal=True, guards=(True, True))
    return v
