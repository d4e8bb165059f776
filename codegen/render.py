"""Plan -> CUDA source. Builds the template context from the plan fields and renders the kernel
skeleton (contraction.cu.j2 / online_fold.cu.j2), which composes the construct macros in
templates/constructs/. Every plan field that changes the kernel shows up in the context."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from codegen import launch
from codegen.plan import (DTYPE_BYTES, AttentionPlan, ContractionPlan, Operand, Plan, check_plan,
                          inputs, output, threads)

TEMPLATE_DIR = Path(__file__).parent / "templates"
DEFAULT_OPTIONS = ("--gpu-architecture=sm_90a", "-std=c++17")
RASTER_GROUP = 8  # m-tiles per group in the grouped tile rasterization (L2 reuse of B panels)

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
                          undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                          trim_blocks=False, lstrip_blocks=False)


@dataclass(frozen=True)
class KernelSource:
    source: str
    entry: str
    arg_names: tuple[str, ...]
    threads: int
    smem_bytes: int
    options: tuple[str, ...]


def _ident(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return s if re.match(r"[A-Za-z_]", s) else "_" + s


class _Sizes:
    """C expressions for sizes: fixed -> literal, dynamic -> the int32 kernel argument."""

    def __init__(self, plan: Plan):
        self.fixed = dict(plan.fixed)
        self.dynamic = tuple(plan.dynamic)

    def expr(self, name: str) -> str:
        if name in self.fixed:
            return str(int(self.fixed[name]))
        if name in self.dynamic:
            return "sz_" + _ident(name)
        raise ValueError(f"size {name!r} is neither fixed nor dynamic")

    def stride(self, op: Operand, dim: str) -> str:
        i = op.dims.index(dim)
        rest = [self.expr(d) for d in op.dims[i + 1:]]
        return "(long long)" + " * ".join(["1"] + rest)


def _params(plan: Plan, sz: _Sizes) -> tuple[str, tuple[str, ...]]:
    short = ("a", "b") if isinstance(plan, ContractionPlan) else ("q", "k", "v")
    parts, names = [], []
    for s, op in zip(short, inputs(plan)):
        parts.append(f"const {op.dtype}_t* __restrict__ p_{s}")
        names.append(op.name)
    out = output(plan)
    parts.append(f"{out.dtype}_t* __restrict__ p_{'c' if isinstance(plan, ContractionPlan) else 'o'}")
    names.append(out.name)
    for d in plan.dynamic:
        parts.append(f"int {sz.expr(d)}")
        names.append(d)
    return ", ".join(parts), tuple(names)


def _batch(plan: Plan, sz: _Sizes, ops: dict[str, Operand]) -> tuple[list[str], dict[str, str]]:
    """Block-index declarations for the batch dims and each operand's batch offset expression."""
    by_dim = {g.dim: g for g in plan.grid}
    decls = []
    for d in plan.batch:
        g = by_dim.get(d)
        if g is None:
            raise ValueError(f"batch dim {d!r} has no grid axis")
        if g.tile != 1:
            raise ValueError(f"batch dim {d!r}: grid tile must be 1, got {g.tile}")
        decls.append(f"const long long bi_{_ident(d)} = blockIdx.{g.axis};")
    offs = {}
    for key, op in ops.items():
        terms = [f"bi_{_ident(d)} * {sz.stride(op, d)}" for d in plan.batch if d in op.dims]
        offs[key] = " + ".join(terms) if terms else "0"
    return decls, offs


def _tile_axis(plan: Plan, dim: str, tile: int) -> str:
    for g in plan.grid:
        if g.dim == dim:
            if g.tile != tile:
                raise ValueError(f"grid axis for {dim!r} tiles by {g.tile}, plan block is {tile}")
            return g.axis
    raise ValueError(f"dim {dim!r} has no grid axis")


def _contraction_ctx(p: ContractionPlan) -> dict:
    sz = _Sizes(p)
    if p.mma not in (None, "mma_sync"):
        raise NotImplementedError(f"mma={p.mma!r} not implemented (None | 'mma_sync')")
    for op in (p.a, p.b):
        if op.level not in ("global", "shared"):
            raise ValueError(f"operand {op.name}: level {op.level!r} unsupported for a contraction")
    if p.stages < 1:
        raise ValueError("stages must be >= 1")
    nthreads = threads(p)
    ctx: dict = dict(kname=_ident(p.kernel_name), threads=nthreads, stages=p.stages,
                     BM=p.block_m, BN=p.block_n, BK=p.block_k, WARPS_N=p.warps_n,
                     mma=p.mma is not None, kn=not p.b_transposed, swizzle=p.swizzle,
                     guard_m=p.guard_m, guard_n=p.guard_n, guard_k=p.guard_k,
                     a_dt=p.a.dtype, b_dt=p.b.dtype, c_dt=p.c.dtype,
                     a_ct=p.a.dtype + "_t", b_ct=p.b.dtype + "_t", c_ct=p.c.dtype + "_t",
                     M=sz.expr(p.m), N=sz.expr(p.n), K=sz.expr(p.k),
                     stage_a=p.a.level == "shared", stage_b=p.b.level == "shared")
    ctx["params"], arg_names = _params(p, sz)
    ea, eb = DTYPE_BYTES[p.a.dtype], DTYPE_BYTES[p.b.dtype]
    ctx.update(a_elem=ea, b_elem=eb, a_vec=16 // ea, b_vec=16 // eb,
               a_tile=p.block_m * p.block_k, b_tile=p.block_k * p.block_n,
               b_cols=p.block_n if not p.b_transposed else p.block_k)
    for name, blk in (("block_m", p.block_m), ("block_n", p.block_n), ("block_k", p.block_k)):
        if blk <= 0 or blk & (blk - 1):
            raise ValueError(f"{name}={blk} must be a power of two")
    if p.block_k * ea < 16 or (ctx["b_cols"] * eb) < 16:
        raise ValueError("tile rows must hold at least one 16-byte chunk")
    if p.mma:
        if p.a.dtype != p.b.dtype or p.a.dtype not in ("f16", "bf16"):
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
    else:
        per = p.block_m * p.block_n // nthreads
        tn = 8 if per >= 64 and p.block_n % 8 == 0 and (p.block_n // 8) <= nthreads else 4
        tm = per // tn if tn else 0
        if per * nthreads != p.block_m * p.block_n or tm < 1 or p.block_m % tm or p.block_n % tn:
            raise ValueError(f"SIMT tile {p.block_m}x{p.block_n} does not split over {nthreads} threads")
        tr, tc = p.block_m // tm, p.block_n // tn
        if tr * tc != nthreads:
            raise ValueError(f"SIMT thread grid {tr}x{tc} != {nthreads} threads")
        ctx.update(TM=tm, TN=tn, TR=tr, TC=tc, pipelined=False)
    # run-time alignment flags for guarded contiguous dims (cp.async needs 16-byte rows)
    a_contig_guard = p.guard_k and p.k in p.dynamic
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
    est = ctx["MI"] * ctx["NI"] * 4 + 2 * (ctx["MI"] * 4 + ctx["NI"] * 2) + 48 if p.mma else 1 << 16
    ctx["min_blocks"] = 2 if (2 * nthreads * est <= 65536 and 2 * lay["total"] <= 227 * 1024) else 1
    ctx["b_smem_off"] = lay.get("b", 0)
    ctx.update(contraction_grid_ctx(p, sz))
    ctx["summary"] = (f"{'mma.sync' if p.mma else 'SIMT'} {p.block_m}x{p.block_n}x{p.block_k}, "
                      f"warps {p.warps_m}x{p.warps_n}, stages {p.stages}, a:{p.a.level} b:{p.b.level}, "
                      f"swizzle {p.swizzle}")
    return ctx | {"_arg_names": arg_names}


def _attention_ctx(p: AttentionPlan) -> dict:
    sz = _Sizes(p)
    if p.mma not in (None, "mma_sync"):
        raise NotImplementedError(f"mma={p.mma!r} not implemented (None | 'mma_sync')")
    if len({p.q.dtype, p.k.dtype, p.v.dtype, p.o.dtype}) != 1:
        raise ValueError("attention operands must share one dtype")
    if p.k.level != p.v.level or p.k.level not in ("global", "shared"):
        raise ValueError(f"k / v levels must both be 'shared' or both 'global', got {p.k.level}, {p.v.level}")
    if p.stages < 1:
        raise ValueError("stages must be >= 1")
    dt = p.q.dtype
    elem = DTYPE_BYTES[dt]
    d = p.head_dim
    nthreads = threads(p)
    ctx: dict = dict(kname=_ident(p.kernel_name), threads=nthreads, stages=p.stages, dt=dt, ct=dt + "_t",
                     elem=elem, vec=16 // elem, D=d, BM=p.block_m, BN=p.block_n, causal=p.causal,
                     skip_masked_tiles=p.skip_masked_tiles, guard_q=p.guard_q, guard_kv=p.guard_kv,
                     swizzle=p.swizzle, mma=p.mma is not None, p_in_registers=p.p_in_registers,
                     q_level=p.q.level, kv_shared=p.k.level == "shared",
                     Nq=sz.expr(p.seq_q), Nk=sz.expr(p.seq_k), kv_tile=p.block_n * d,
                     SL2=repr(float(p.scale) * math.log2(math.e)) + "f")
    ctx["params"], arg_names = _params(p, sz)
    if d * elem < 16 or d % 16:
        raise ValueError(f"head_dim {d} must be a multiple of 16")
    if p.mma:
        if dt not in ("f16", "bf16"):
            raise ValueError(f"mma_sync attention needs f16 or bf16, got {dt}")
        if p.q.level not in ("register", "shared"):
            raise ValueError(f"q level {p.q.level!r}: tensor-core path stages q in shared memory")
        if not ctx["kv_shared"]:
            raise ValueError("tensor-core attention path needs k / v level 'shared'")
        rows_w = p.block_m // p.warps
        if rows_w * p.warps != p.block_m or rows_w % 16 or p.block_n % 16:
            raise ValueError(f"block_m/warps = {p.block_m}/{p.warps} and block_n {p.block_n} "
                             "must be multiples of 16")
        ctx.update(ROWS_W=rows_w, MI=rows_w // 16, KD=d // 16, NT=p.block_n // 8,
                   KT2=p.block_n // 16, DT=d // 8)
        ctx["q_staged"] = True
    else:
        tpr = nthreads // p.block_m
        if tpr * p.block_m != nthreads or tpr < 1 or tpr > 32 or tpr & (tpr - 1) or d % tpr:
            raise ValueError(f"SIMT attention: {nthreads} threads must be a power-of-two multiple "
                             f"(<= 32) of block_m {p.block_m} dividing head_dim {d}")
        if p.block_n > 128:
            raise ValueError("SIMT attention keeps block_n scores in registers: block_n <= 128")
        ctx.update(TPR=tpr, DPT=d // tpr)
        ctx["q_staged"] = p.q.level == "shared"
    lay = launch.smem_layout(p)
    ctx.update(smem_bytes=lay["total"], k_smem_off=lay.get("k", 0), v_smem_off=lay.get("v", 0),
               p_smem_off=lay.get("p", 0))
    decls, offs = _batch(p, sz, {"q": p.q, "k": p.k, "v": p.v, "o": p.o})
    ctx.update(batch_decls=decls, off_q=offs["q"], off_k=offs["k"], off_v=offs["v"], off_o=offs["o"])
    ctx["qtile_expr"] = f"(int)blockIdx.{_tile_axis(p, p.seq_q, p.block_m)}"
    ctx["summary"] = (f"{'mma.sync' if p.mma else 'SIMT'} d{d} {p.block_m}x{p.block_n}, warps {p.warps}, "
                      f"stages {p.stages}, q:{p.q.level} kv:{p.k.level}, causal {p.causal}, "
                      f"P in registers {p.p_in_registers}, swizzle {p.swizzle}")
    return ctx | {"_arg_names": arg_names}


def render(plan: Plan, options: tuple[str, ...] = DEFAULT_OPTIONS, *, tma: bool = False) -> KernelSource:
    """CUDA source of a plan.  MAP-MMA with wgmma renders the Hopper kernel (render_wgmma):
    tma=False its cp.async variant (any sizes), tma=True the warp-specialized TMA variant."""
    check_plan(plan)
    if isinstance(plan, ContractionPlan) and plan.mma == "wgmma":
        from codegen.render_wgmma import render_wgmma

        return render_wgmma(plan, options, tma=tma)
    if isinstance(plan, AttentionPlan) and plan.mma == "wgmma":  # TMA-only, warp-specialized
        from codegen.render_attn_wgmma import render_attn_wgmma

        return render_attn_wgmma(plan, options)
    if tma:
        raise ValueError("tma=True applies to wgmma contraction plans only")
    if isinstance(plan, ContractionPlan):
        ctx, tmpl = _contraction_ctx(plan), "contraction.cu.j2"
    elif isinstance(plan, AttentionPlan):
        ctx, tmpl = _attention_ctx(plan), "online_fold.cu.j2"
    else:
        raise TypeError(f"not a plan: {type(plan).__name__}")
    return render_template(tmpl, ctx, options)


SMEM_LIMIT = 227 * 1024  # per block, Hopper


def render_template(template: str, ctx: dict, options: tuple[str, ...]) -> KernelSource:
    """Render a kernel skeleton with its context into a KernelSource (every family ends here)."""
    if ctx["smem_bytes"] > SMEM_LIMIT:
        raise ValueError(f"plan needs {ctx['smem_bytes']} bytes of shared memory > 227 KB "
                         "(fewer stages or smaller tiles)")
    src = _env.get_template(template).render(**ctx)
    src = re.sub(r"\n[ \t]*\n(?:[ \t]*\n)+", "\n\n", src)  # collapse blank runs left by the macros
    return KernelSource(source=src, entry=ctx["kname"], arg_names=ctx["_arg_names"],
                        threads=ctx["threads"], smem_bytes=ctx["smem_bytes"], options=tuple(options))


def contraction_grid_ctx(p: ContractionPlan, sz: _Sizes) -> dict:
    """Batch offsets and the block → (m-tile, n-tile) order (grouped rasterisation when both
    tile axes are on the grid) shared by the mma.sync and wgmma contraction skeletons."""
    decls, offs = _batch(p, sz, {"a": p.a, "b": p.b, "c": p.c})
    ctx = dict(batch_decls=decls, off_a=offs["a"], off_b=offs["b"], off_c=offs["c"])
    ax_m, ax_n = _tile_axis(p, p.m, p.block_m), _tile_axis(p, p.n, p.block_n)
    if {ax_m, ax_n} == {"x", "y"}:
        ctx["raster"] = dict(ax_m=ax_m, ax_n=ax_n, group=RASTER_GROUP)
    else:
        ctx["raster"] = None
        ctx["tm_expr"], ctx["tn_expr"] = f"(int)blockIdx.{ax_m}", f"(int)blockIdx.{ax_n}"
    return ctx
