"""ContractionPlan with mma='wgmma' -> CUDA source for Hopper warpgroup tensor cores (sm_90a).

codegen.mappings.contraction prints with it when the kernel IR's tile product is mapped to wgmma:

    ks = render_wgmma(plan)          # KernelSource; the launch grid comes from the kernel IR

Mapping of the plan onto the machine:
  * warps: ``warps_m`` must be a multiple of 4. The warps form ``warps_m // 4`` x ``warps_n``
    warpgroups (4 consecutive warps each); warpgroup (wm, wn) owns rows
    [wm*WM, (wm+1)*WM) x cols [wn*WN, (wn+1)*WN) of the block tile, WM = block_m / (warps_m/4)
    a multiple of 64 (MI = WM/64 wgmma row tiles), WN = block_n / warps_n <= 256. Inside a
    warpgroup, warp w holds rows 16w..16w+15 of every m64 tile (the wgmma accumulator layout),
    which is what the schedule's ``parallel ii -> warp`` with count warps_m says.
  * operands: A ([.., M, K], or [.., K, M] when a_transposed) and B ([.., K, N], or [.., N, K]
    when b_transposed) staged as stored in a ``stages``-slot ring of 128-byte swizzled shared
    tiles, filled with 16-byte cp.async by all threads; wgmma reads them through matrix
    descriptors: an operand stored with k innermost is K-major, the other MN-major ("transposed",
    the instruction's imm-trans-a / imm-trans-b = 1, which f16 / bf16 allow). block_k is a
    multiple of 64 (one 128-byte swizzle row of f16/bf16).
  * pipeline: ``stages - 2`` tiles load ahead while one wgmma group stays in flight (stages >= 3);
    with stages == 2 the wgmma group is drained each k-tile.
  * tails: guard_m / guard_n / guard_k zero-fill the cp.async copies (src-size) and guard the
    stores; rows whose leading dim is not a multiple of 8 elements take a scalar gather path.

Two kernels per plan:
  * tma=False (default): the cp.async ring above; any sizes. ~0.55-0.6x cuBLAS.
  * tma=True: warp-specialized: one extra producer warpgroup (setmaxnreg 40) issues
    cp.async.bulk.tensor (TMA, 128-byte swizzle, zero fill out of bounds) completing on full
    mbarriers; the consumer warpgroups (setmaxnreg 232) wait on them, keep one wgmma group in
    flight and release each slot on an empty mbarrier. Needs tensor maps encoded on the host
    (encode_tensor_maps: libcuda cuTensorMapEncodeTiled through ctypes, or the CPU emulation's
    encoding; 256 bytes copied to the device; extra last kernel argument) and tma_supported(plan, sizes, ptrs) (K and, for B
    stored [K, N], N multiples of 8; 16-byte aligned bases). ~0.99-1.0x cuBLAS at 8192^3.
H200, 2026-11-29 (a developer script of that session, since replaced by devtools/device_check.py; do_bench median, 4 rotating input sets),
128x256x64, 4 stages, 2 consumer warpgroups, TFLOP/s (ratio to torch.matmul in the same run):
    8192^3 f16: tma 652 (0.99), cp.async 378 (0.58), cuBLAS 656;  bf16: tma 673 (1.00), cuBLAS 672
    4096^3 f16: tma 647 (0.93), cp.async 383 (0.55), cuBLAS 695;  bf16: tma 701 (0.96), cuBLAS 730
"""
from __future__ import annotations

from codegen.mappings.ctx_common import DEFAULT_OPTIONS, Sizes, contraction_grid_ctx, ident, params, source
from codegen.mappings.epilogue import lambdas
from codegen.source import KernelSource
from codegen.cuda.tma import Encoder, encode_driver, tiled_map
from compiler.machine import DEVICE, DTYPES
from codegen.mappings.plan import ContractionPlan, check_plan, threads

_ALIGN_SLACK = 1024  # the kernel rounds the dynamic shared base up to 1024 bytes


def _geometry(p: ContractionPlan, tma: bool = False) -> dict:
    """Warpgroup tiling, shared-memory layout and pipeline depth; ValueError naming the field."""
    if p.mma != "wgmma":
        raise ValueError(f"render_wgmma needs plan.mma == 'wgmma', got {p.mma!r}")
    if p.a.dtype != p.b.dtype or p.a.dtype not in ("f16", "bf16"):
        raise ValueError(f"wgmma needs a, b both f16 or both bf16, got {p.a.dtype}, {p.b.dtype}")
    if p.c.dtype not in ("f16", "bf16", "f32"):
        raise ValueError(f"output dtype {p.c.dtype!r} unsupported")
    for op in (p.a, p.b):
        if op.level != "shared":
            raise ValueError(f"operand {op.name}: wgmma reads shared tiles, level must be 'shared' "
                             f"(got {op.level!r})")
    if p.warps_m < 4 or p.warps_m % 4:
        raise ValueError(f"warps_m={p.warps_m}: wgmma needs warpgroups of 4 warps along m")
    if p.warps_n < 1:
        raise ValueError("warps_n must be >= 1")
    wgm, wgn = p.warps_m // 4, p.warps_n
    bm, bn, bk = p.block_m, p.block_n, p.block_k
    if bm % (64 * wgm):
        raise ValueError(f"block_m={bm} must be a multiple of 64 x {wgm} warpgroups along m")
    if bk % 64:
        raise ValueError(f"block_k={bk} must be a multiple of 64 (one 128-byte swizzle row)")
    if bn % wgn:
        raise ValueError(f"block_n={bn} does not split over {wgn} warpgroups along n")
    wm, wn = bm // wgm, bn // wgn
    if wn > 256 or wn % 8:
        raise ValueError(f"warpgroup n-tile {wn} must be a multiple of 8 and <= 256 (wgmma m64nNk16)")
    kn, km = not p.b_transposed, p.a_transposed
    if kn and (wn % 64 or bn % 64):
        raise ValueError(f"B stored [K, N] (MN-major) needs block_n and the warpgroup n-tile ({wn}) "
                         "to be multiples of 64 (128-byte swizzle atoms)")
    if p.stages < 2:
        raise ValueError("stages must be >= 2 for the wgmma pipeline")
    nthreads = threads(p)
    eab, ec = DTYPES[p.a.dtype].bytes, DTYPES[p.c.dtype].bytes
    a_stage, b_stage = bm * bk * eab, bk * bn * eab
    ring = p.stages * (a_stage + b_stage)
    crow = bn * ec + 16  # epilogue staging pitch: 16 bytes of padding per row
    nwg = wgm * wgn
    bar_off = max(ring, bm * crow)
    total = bar_off + (2 * p.stages * 8 if tma else 0) + _ALIGN_SLACK
    g = dict(WGM=wgm, WGN=wgn, NWG=nwg, WM=wm, WN=wn, MI=wm // 64, NREG=wn // 2, kn=kn, km=km,
             threads=nthreads + (128 if tma else 0), tma=tma,
             A_STAGE=a_stage, B_STAGE=b_stage, B_OFF=p.stages * a_stage, CROW=crow, BAR_OFF=bar_off,
             CPR=bn * ec // 16, CVEC=16 // ec, c_elem=ec, smem_bytes=total,
             INFL=1 if p.stages >= 3 else 0, LOOK=p.stages - (2 if p.stages >= 3 else 1))
    if tma:
        if (not km and bm > 256) or (not kn and bn > 256) or ((kn or km) and bk > 256):
            raise ValueError("TMA boxes are at most 256 rows: block_m ([M, K] A), block_n ([N, K] B) "
                             "or block_k ([K, M] A, [K, N] B) too large")
        if len(p.batch) > 1 or any(op.dims[:-2] != (() if p.k_split else p.batch) for op in (p.a, p.b)):
            raise ValueError("TMA path: at most one batch dim, carried by a, b and c alike "
                             "(a split-K output's splits by c alone)")
        # producer warpgroup keeps REG_PRODUCER registers, consumers take the rest (multiples of 8)
        g["REG_PRODUCER"] = 40
        g["REG_CONSUMER"] = min(240, (DEVICE.regs_per_sm - 128 * 40) // (nwg * 128) // 8 * 8)
    return g


def _context(p: ContractionPlan, tma: bool = False) -> dict:
    g = _geometry(p, tma)
    sz = Sizes(p)
    nthreads = g["threads"]
    ctx: dict = dict(g, kname=ident(p.kernel_name), stages=p.stages, BM=p.block_m, BN=p.block_n,
                     BK=p.block_k, ab_dt=p.a.dtype, ab_ct=p.a.dtype + "_t", c_dt=p.c.dtype,
                     c_ct=p.c.dtype + "_t", trans_b=g["kn"], trans_a=g["km"], guard_m=p.guard_m, guard_n=p.guard_n,
                     guard_k=p.guard_k, M=sz.expr(p.m), N=sz.expr(p.n), K=sz.expr(p.k))
    ctx["params"], ctx["_arg_names"] = params(p, sz)
    ctx["epi"] = p.epilogue
    ctx["epi_lambdas"] = lambdas(p.epilogue) if p.epilogue else ""
    if tma:
        ctx["_arg_names"] = ctx["_arg_names"] + ("tmaps",)
    a_chunks, b_chunks = p.block_m * p.block_k // 8, p.block_k * p.block_n // 8
    ctx.update(A_CHUNKS=a_chunks, B_CHUNKS=b_chunks, A_ITERS=-(-a_chunks // nthreads),
               B_ITERS=-(-b_chunks // nthreads))
    c_chunks = p.block_m * g["CPR"]
    ethreads = g["NWG"] * 128  # the epilogue runs on the consumer warpgroups
    if c_chunks % ethreads:
        raise ValueError(f"epilogue: {c_chunks} 16-byte chunks do not split over {ethreads} threads")
    ctx["C_ITERS"] = c_chunks // ethreads
    ctx["C_ITERS_C"] = ctx["C_ITERS"]
    ctx["batched"] = bool(p.batch) and tma and not p.k_split
    # SPLIT-K: this block adds the k tiles SPLITS·kt + split_, kt < KT (one zero-filled tile past K
    # when the split has none: it writes zeros)
    ctx["SPLITS"] = p.k_split.splits if p.k_split else 0
    ctx["split_index"] = f"bi_{ident(p.k_split.dim)}" if p.k_split else ""
    if p.k_split:
        span = p.block_k * p.k_split.splits
        ctx["KT_expr"] = (f"max(1, (max(0, {ctx['K']} - {p.block_k} * (int){ctx['split_index']}) + {span - 1}) "
                          f"/ {span})")
    else:
        ctx["KT_expr"] = f"max(1, ({ctx['K']} + {p.block_k - 1}) / {p.block_k})"
    ctx["batch_index"] = f"bi_{ident(p.batch[0])}" if p.batch else "0"
    # run-time 16-byte row alignment flags (dynamic contiguous dims only; fixed ones are checked here)
    fixed = dict(p.fixed)
    a_contig = p.m if ctx["km"] else p.k
    b_contig = p.n if ctx["kn"] else p.k

    def _align_flag(dim: str, flag: str) -> str | None:
        if dim in p.dynamic:
            return flag
        if fixed[dim] % 8:
            raise ValueError(f"fixed size {dim}={fixed[dim]} must be a multiple of 8 (16-byte rows)")
        return None

    ctx["a_aligned"] = _align_flag(a_contig, "a_rows_aligned")
    ctx["b_aligned"] = _align_flag(b_contig, "b_rows_aligned")
    if p.n in p.dynamic:
        ctx["c_vec_ok"] = f"(({ctx['N']} % {g['CVEC']}) == 0)"
    else:
        ctx["c_vec_ok"] = None if fixed[p.n] % g["CVEC"] == 0 else "false"
    ctx.update(contraction_grid_ctx(p, sz))
    ctx["summary"] = (f"{'TMA warp-specialized' if tma else 'cp.async'}, wgmma m64n{g['WN']}k16 "
                      f"{p.block_m}x{p.block_n}x{p.block_k}, "
                      f"warpgroups {g['WGM']}x{g['WGN']}, stages {p.stages}, "
                      f"A {'MN' if ctx['km'] else 'K'}-major, B {'MN' if ctx['kn'] else 'K'}-major, 128B swizzle")
    return ctx


def render_wgmma(plan: ContractionPlan, options: tuple[str, ...] = DEFAULT_OPTIONS,
                 tma: bool = False) -> KernelSource:
    """Render the wgmma contraction kernel of a plan (same KernelSource contract as render()).

    tma=True: warp-specialized variant (one extra producer warpgroup issuing cp.async.bulk.tensor
    on mbarriers, consumers with setmaxnreg). Its last argument is a device pointer to the two
    128-byte tensor maps of encode_tensor_maps(); it needs tma_supported(plan, sizes)."""
    if not isinstance(plan, ContractionPlan):
        raise TypeError(f"render_wgmma needs a ContractionPlan, got {type(plan).__name__}")
    check_plan(plan)
    if not any(DEVICE.arch in o for o in options):
        raise ValueError("wgmma needs the arch-specific target: --gpu-architecture=sm_90a")
    return source("contraction_wgmma.cu.j2", _context(plan, tma), options)




# ---------------------------------------------------------------- TMA tensor maps (host side)
def tma_supported(plan: ContractionPlan, sizes: dict[str, int], ptrs: tuple[int, ...] = ()) -> bool:
    """TMA needs 16-byte aligned base addresses and row strides (the innermost dims of A and B,
    multiples of 8 elements); otherwise use the cp.async kernel (tma=False)."""
    m, k, n = sizes[plan.m], sizes[plan.k], sizes[plan.n]
    a_row = m if plan.a_transposed else k
    b_row = k if plan.b_transposed else n
    return (a_row % 8 == 0 and b_row % 8 == 0 and all(p % 16 == 0 for p in ptrs)
            and k > 0 and m > 0 and n > 0)


def encode_tensor_maps(plan: ContractionPlan, sizes: dict[str, int], a_ptr: int, b_ptr: int,
                       encode: Encoder = encode_driver) -> bytes:
    """The 256 bytes (map of A, map of B; 128 each) the tma kernel's last argument points to
    (copy them to device memory, 64-byte aligned): 128-byte swizzle, zero fill out of bounds.
    encode: the driver's encoding (libcuda cuTensorMapEncodeTiled) or the CPU emulation's."""
    if not tma_supported(plan, sizes, (a_ptr, b_ptr)):
        raise ValueError("sizes / pointers not 16-byte aligned: use the cp.async kernel")
    m, n, k = sizes[plan.m], sizes[plan.n], sizes[plan.k]
    batched = bool(plan.batch) and not plan.k_split  # a split-K output's splits: c's alone
    bat = [sizes[plan.batch[0]]] if batched else []
    one = [1] if batched else []
    if plan.a_transposed:  # [K, M]: boxes of 64 m x block_k rows, one per 64-wide panel
        a = tiled_map(plan.a.dtype, a_ptr, [m, k] + bat, [64, plan.block_k] + one)
    else:
        a = tiled_map(plan.a.dtype, a_ptr, [k, m] + bat, [64, plan.block_m] + one)
    if plan.b_transposed:
        b = tiled_map(plan.b.dtype, b_ptr, [k, n] + bat, [64, plan.block_n] + one)
    else:
        b = tiled_map(plan.b.dtype, b_ptr, [n, k] + bat, [64, plan.block_k] + one)
    return encode(a) + encode(b)
