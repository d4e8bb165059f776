"""mma.sync printers: a ContractionPlan / AttentionPlan (read off the kernel IR by
codegen.mappings) -> template context -> CUDA source.  The skeletons (contraction.cu.j2,
online_fold.cu.j2) compose the construct macros in templates/constructs/; the fold's mask, key
tile range and scale arrive printed from the kernel IR (codegen.mappings.online_fold.mask_context).
"""
from __future__ import annotations

import math

from compiler.machine import DEVICE, DTYPES

from codegen.mappings import launch
from codegen.mappings.ctx_common import (DEFAULT_OPTIONS, Sizes, attn_addressing, contraction_grid_ctx, ident,
                                params, source, tile_index, with_roles)
from codegen.mappings.epilogue import lambdas
from codegen.mappings.plan import AttentionPlan, ContractionPlan, check_plan, layout, threads, tile_rows
from codegen.source import KernelSource


def _contraction_ctx(p: ContractionPlan) -> dict:
    sz = Sizes(p)
    if p.mma != "mma_sync":
        raise ValueError(f"the mma.sync contraction printer got mma={p.mma!r}")
    for op in (p.a, p.b):
        if op.level not in ("global", "shared"):
            raise ValueError(f"operand {op.name}: level {op.level!r} unsupported for a contraction")
    if p.stages < 1:
        raise ValueError("stages must be >= 1")
    if p.a_transposed and p.a.level != "shared":
        raise ValueError(f"layout {layout(p)}: A stored [{p.k}, {p.m}] is read through ldmatrix.trans "
                         f"from a staged tile; level {p.a.level!r} is not implemented (CACHE it)")
    nthreads = threads(p)
    ctx: dict = dict(kname=ident(p.kernel_name), threads=nthreads, stages=p.stages,
                     BM=p.block_m, BN=p.block_n, BK=p.block_k, WARPS_N=p.warps_n,
                     mma=p.mma is not None, kn=not p.b_transposed, km=p.a_transposed, swizzle=p.swizzle,
                     guard_m=p.guard_m, guard_n=p.guard_n, guard_k=p.guard_k,
                     a_dt=p.a.dtype, b_dt=p.b.dtype, c_dt=p.c.dtype,
                     a_ct=p.a.dtype + "_t", b_ct=p.b.dtype + "_t", c_ct=p.c.dtype + "_t",
                     M=sz.expr(p.m), N=sz.expr(p.n), K=sz.expr(p.k),
                     stage_a=p.a.level == "shared", stage_b=p.b.level == "shared")
    ctx["params"], arg_names = params(p, sz)
    ctx["epi"] = p.epilogue
    ctx["epi_lambdas"] = lambdas(p.epilogue) if p.epilogue else ""
    ea, eb = DTYPES[p.a.dtype].bytes, DTYPES[p.b.dtype].bytes
    ctx.update(a_elem=ea, b_elem=eb, a_vec=16 // ea, b_vec=16 // eb,
               a_tile=p.block_m * p.block_k, b_tile=p.block_k * p.block_n,
               a_cols=p.block_m if p.a_transposed else p.block_k,
               b_cols=p.block_n if not p.b_transposed else p.block_k)
    for name, blk in (("block_m", p.block_m), ("block_n", p.block_n), ("block_k", p.block_k)):
        if blk <= 0 or blk & (blk - 1):
            raise ValueError(f"{name}={blk} must be a power of two")
    if ctx["a_cols"] * ea < 16 or (ctx["b_cols"] * eb) < 16:
        raise ValueError("tile rows must hold at least one 16-byte chunk")
    if p.a.dtype != p.b.dtype or not DTYPES[p.a.dtype].mma_operand:
        raise ValueError(f"mma_sync needs a, b both f16 or both bf16, got {p.a.dtype}, {p.b.dtype}")
    wm_, wn_ = p.block_m // p.warps_m, p.block_n // p.warps_n
    if wm_ * p.warps_m != p.block_m or wm_ % 16 or wn_ * p.warps_n != p.block_n or wn_ % 16:
        raise ValueError(f"warp tile {p.block_m}/{p.warps_m} x {p.block_n}/{p.warps_n} "
                         "must be multiples of 16")
    if p.block_k % 16:
        raise ValueError("block_k must be a multiple of 16 for mma_sync")
    ctx.update(WM=wm_, WN=wn_, MI=wm_ // 16, NI=wn_ // 8)
    if (wn_ // 8) % 2:
        raise ValueError("warp n-tile must be a multiple of 16 (ldmatrix x4 loads two n8 tiles)")
    ctx["pipelined"] = ctx["stage_a"] and ctx["stage_b"] and p.stages >= 2 and p.block_k >= 32
    # run-time alignment flags for guarded contiguous dims (cp.async needs 16-byte rows)
    a_contig = p.m if p.a_transposed else p.k
    a_contig_guard = (p.guard_m if p.a_transposed else p.guard_k) and a_contig in p.dynamic
    b_contig = p.k if p.b_transposed else p.n
    b_contig_guard = (p.guard_k if p.b_transposed else p.guard_n) and b_contig in p.dynamic
    ctx["a_aligned"] = "a_rows_aligned" if (ctx["stage_a"] and a_contig_guard) else None
    ctx["b_aligned"] = "b_rows_aligned" if (ctx["stage_b"] and b_contig_guard) else None
    ctx["c_vec_ok"] = f"(({ctx['N']} & 1) == 0)" if (p.guard_n and p.n in p.dynamic) else None
    # Interior blocks run the unguarded code: `full_cond` says a block's staged tiles lie inside
    # m / n with 16-byte rows, so its k-tiles below K / BK load without guards (peel: the
    # pipelined main loop is split into an unguarded loop and a guarded one for the rest);
    # `store_full` selects the unguarded epilogue.  The plan's guard flags keep their meaning.
    m_in, n_in = f"m0 + {p.block_m} <= {ctx['M']}", f"n0 + {p.block_n} <= {ctx['N']}"
    full = []
    if ctx["stage_a"]:
        full += ([m_in] if p.guard_m else []) + ([ctx["a_aligned"]] if ctx["a_aligned"] else [])
    if ctx["stage_b"]:
        full += ([n_in] if p.guard_n else []) + ([ctx["b_aligned"]] if ctx["b_aligned"] else [])
    ctx["peel"] = (ctx["stage_a"] or ctx["stage_b"]) and bool(full or p.guard_k)
    ctx["full_cond"] = " && ".join(f"({c})" for c in full) if full else "true"
    store = ([m_in] if p.guard_m else []) + ([n_in] if p.guard_n else []) + \
        ([ctx["c_vec_ok"]] if ctx["c_vec_ok"] else [])
    ctx["store_full"] = " && ".join(f"({c})" for c in store) if store else None
    lay = launch.smem_layout(p)
    ctx["smem_bytes"] = lay["total"]
    # two CTAs per SM when the estimated registers and the shared memory allow it
    est = ctx["MI"] * ctx["NI"] * 4 + 2 * (ctx["MI"] * 4 + ctx["NI"] * 2) + 48
    if p.a_transposed:  # per-mi ldmatrix offsets and the 64-bit k-row strides of the [k][m] copies:
        est += 2 * ctx["MI"] + 16  # TT 128x64x32 on 2 x 4 warps takes 184 registers unbounded, NT 138
    ctx["min_blocks"] = 2 if (2 * nthreads * est <= DEVICE.regs_per_sm and 2 * lay["total"] <= DEVICE.smem_per_block) else 1
    ctx["b_smem_off"] = lay.get("b", 0)
    ctx.update(contraction_grid_ctx(p, sz))
    ctx["summary"] = (f"mma.sync {layout(p)} {p.block_m}x{p.block_n}x{p.block_k}, "
                      f"warps {p.warps_m}x{p.warps_n}, stages {p.stages}, a:{p.a.level} b:{p.b.level}, "
                      f"swizzle {p.swizzle}")
    return ctx | {"_arg_names": arg_names}


def _attention_ctx(p: AttentionPlan, mask: dict) -> dict:
    p = with_roles(p)
    sz = Sizes(p)
    if p.mma != "mma_sync":
        raise ValueError(f"the mma.sync fold printer got mma={p.mma!r}")
    if len({p.q.dtype, p.k.dtype, p.v.dtype}) != 1 or p.o.dtype not in (p.q.dtype, "f32" if p.state else p.q.dtype):
        raise ValueError("attention operands must share one dtype (SPLIT-KV's partial acc: f32)")
    if p.k.level != p.v.level or p.k.level not in ("global", "shared"):
        raise ValueError(f"k / v levels must both be 'shared' or both 'global', got {p.k.level}, {p.v.level}")
    if p.stages < 1:
        raise ValueError("stages must be >= 1")
    dt = p.q.dtype
    elem = DTYPES[dt].bytes
    d = p.head_dim
    nthreads = threads(p)
    ctx: dict = dict(kname=ident(p.kernel_name), threads=nthreads, stages=p.stages, dt=dt, ct=dt + "_t", o_dt=p.o.dtype,
                     elem=elem, vec=16 // elem, D=d, BM=p.block_m, BN=p.block_n,
                     guard_q=p.guard_q, guard_kv=p.guard_kv,
                     swizzle=p.swizzle, mma=p.mma is not None, p_in_registers=p.p_in_registers,
                     q_level=p.q.level, kv_shared=p.k.level == "shared",
                     Nq=sz.expr(p.seq_q), Nk=sz.expr(p.seq_k), kv_tile=p.block_n * d,
                     SL2=repr(float(p.scale) * math.log2(math.e)) + "f")
    ctx.update(mask)
    if mask.get("general_score"):  # the score is computed first: the fold runs in log2(e) units
        ctx["SL2"] = repr(math.log2(math.e)) + "f"
    ctx["params"], arg_names = params(p, sz)
    if d * elem < 16 or d % 16:
        raise ValueError(f"head_dim {d} must be a multiple of 16")
    if not DTYPES[dt].mma_operand:
        raise ValueError(f"mma_sync attention needs f16 or bf16, got {dt}")
    if p.q.level not in ("register", "shared"):
        raise ValueError(f"q level {p.q.level!r}: tensor-core path stages q in shared memory")
    if not ctx["kv_shared"]:
        raise ValueError("tensor-core attention path needs k / v level 'shared'")
    rows = tile_rows(p)
    rows_w = rows // p.warps
    if rows_w * p.warps != rows or rows_w % 16 or p.block_n % 16:
        raise ValueError(f"tile rows/warps = {rows}/{p.warps} and block_n {p.block_n} "
                         "must be multiples of 16")
    ctx.update(ROWS=rows, ROWS_W=rows_w, MI=rows_w // 16, KD=d // 16, NT=p.block_n // 8,
               KT2=p.block_n // 16, DT=d // 8)
    ctx.update(_packed_rows(p, rows_w))
    ctx["q_staged"] = True
    lay = launch.smem_layout(p)
    ctx.update(smem_bytes=lay["total"], k_smem_off=lay.get("k", 0), v_smem_off=lay.get("v", 0),
               p_smem_off=lay.get("p", 0))
    ctx.update(attn_addressing(p, sz))  # batch offsets and row strides of the operands' layouts
    for key in ("k", "v"):
        ld = ctx[f"ld_{key}"]
        ctx[f"step_{key}"] = str(p.block_n * int(ld)) if ld.isdigit() else f"{p.block_n} * {ld}"
    ctx["qtile_expr"] = f"(int){tile_index(p, p.seq_q, p.block_m, sz)}"
    ctx["summary"] = (f"mma.sync d{d} {p.block_m}x{p.block_n}, warps {p.warps}, "
                      f"stages {p.stages}, q:{p.q.level} kv:{p.k.level}, mask {mask['has_mask']}, "
                      f"P in registers {p.p_in_registers}, swizzle {p.swizzle}")
    return ctx | {"_arg_names": arg_names}


def _packed_rows(p: AttentionPlan, rows_w: int) -> dict:
    """Template entries addressing the tile's rows.  Unpacked, local row r is query row q0 + r.
    Packed (p.pack heads of one K / V head, p.block_m query rows each), local row r is query head
    r / BM of the group and query row q0 + r % BM: row_off(r, ld, ldp) the element offset of row r in
    an operand's block view (row stride ld, head stride ldp), row_ok(r, lim) its tail bound, qrow(r) its query row; w_lo / w_hi the
    query rows of a warp's rows (for the mask's warp-level tests)."""
    bm = p.block_m
    if p.pack == 1:
        return dict(pack=1)
    if rows_w % bm == 0:
        lo = "q0"
    elif bm % rows_w == 0:
        lo = f"(q0 + (warp * {rows_w}) % {bm})"
    else:
        raise ValueError(f"packed rows: a warp's {rows_w} rows neither cover whole heads of {bm} query rows "
                         "nor lie within one")
    hi = f"q0 + {bm - 1}" if rows_w % bm == 0 else f"{lo} + {rows_w - 1}"

    def row_off(r: str, ld: str, ldp: str) -> str:  # row r of an operand with row stride ld, head stride ldp
        return f"((long long)(({r}) / {bm}) * ({ldp}) + (long long)(({r}) % {bm}) * ({ld}))"

    return dict(pack=p.pack, row_off=row_off, row_ok=lambda r, lim: f"(({r}) % {bm} < ({lim}))",
                qrow=lambda r: f"(q0 + ({r}) % {bm})", w_lo=lo, w_hi=hi)


def render_contraction(plan: ContractionPlan, options: tuple[str, ...] = DEFAULT_OPTIONS) -> KernelSource:
    check_plan(plan)
    return source("contraction.cu.j2", _contraction_ctx(plan), options)


def render_fold(plan: AttentionPlan, mask: dict, options: tuple[str, ...] = DEFAULT_OPTIONS) -> KernelSource:
    check_plan(plan)
    return source("online_fold.cu.j2", _attention_ctx(plan, mask), options)
