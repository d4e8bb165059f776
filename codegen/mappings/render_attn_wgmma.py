"""AttentionPlan with mma='wgmma' -> CUDA source for a Hopper (sm_90a) FlashAttention kernel, FA3
structure (templates/online_fold_wgmma.cu.j2 + constructs/wgmma_attn.cu.j2).

codegen.mappings.online_fold prints with it when the kernel IR's fold products are mapped to wgmma:

    ks = render_attn_wgmma(plan, mask)   # mask: online_fold.mask_context; grid from the kernel IR
    maps = encode_attn_tensor_maps(plan, sizes, q_ptr, k_ptr, v_ptr)   # 384 bytes -> device memory
    kernel args: (q, k, v, o, *dynamic sizes as int32, tmaps device pointer)

Mapping of the plan onto the machine:
  * ``block_m`` = 64 x the consumer warpgroups (1..3; 128 = 2); ``warps`` = block_m / 16 (the
    schedule's ``parallel ii -> warp``: warp w of a warpgroup holds rows 16w..16w+15 of its m64
    tile, the wgmma accumulator layout). One extra producer warpgroup: block = warps*32 + 128 threads.
  * Q tile [block_m, D], K / V tiles [block_n, D] in shared memory as 128-byte swizzled panels of
    64 columns ([D/64][rows][64]), loaded by TMA (3-D tensor maps over [batch, seq, D], box
    {64, rows, 1}, zero fill past the sequence end) on mbarriers; K / V in a ``stages`` ring.
  * S = Q K^T: wgmma m64n{block_n}k16, A = Q and B = K from shared memory, both K-major.
    Online softmax on the accumulator (row max / sum within a lane quad), P -> f16/bf16 registers
    = A operand of O += P V: wgmma m64n{D}k16 with A in registers, B = V MN-major (trans-b).
  * overlap=True (default): the S wgmma of tile j and the P.V wgmma of tile j-1 are issued
    together; the softmax of tile j runs while P.V j-1 is on the tensor cores.
  * the kernel IR's mask and key tile range (codegen.mappings.online_fold.mask_context): query
    tiles run heaviest first when the tile range grows with the query tile, the per-element mask
    only on tiles it cuts.
  * tails: guard_kv masks keys >= Nk (TMA zero-fills the rows), guard_q guards the stores.
    Nk == 0 gives zeros. A row that sees no key gives 0.

Recommended schedule: d128 block 128x128, warps 8, stages 3 (230,480 B of shared memory);
d64 block 128x128, warps 8, stages 3. With stages 2 the overlap starves (the slot of tile j-1 is
held while tile j computes): use overlap=False there, or 3 stages.
H200, one run (a developer script of that session, since replaced by devtools/device_check.py; 160/160 correct vs an fp32 reference, f16/bf16,
d64/d128, causal/not, tails, Nq != Nk, Nk = 0), f16 TFLOP/s, do_bench median, 3 rotating input sets,
same process as torch SDPA FLASH (FA2) and CUDNN:
    d128 b4h16 s4k   full   : 128x128 s3 overlap 564 (1.69x FA2, 0.98x cuDNN 573); s2 no-overlap 531; s2 overlap 446
    d128 b4h16 s4k   causal : s3 overlap 464 (1.56x, 0.93x cuDNN 498); s2 no-overlap 472 (0.95x)
    d128 b1h16 s16k  full   : s3 overlap 573 (1.69x, 0.98x cuDNN 586)
    d128 b1h16 s16k  causal : s3 overlap 551 (1.76x, 1.02x cuDNN 541)
    d64  b4h32 s4k   full / causal: 128x128 s3 overlap 413 / 348 (1.40x / 1.25x FA2, 0.93x / 0.87x cuDNN);
                     192x128 (3 consumer warpgroups, 160 registers) 304 / 268: do not use
"""
from __future__ import annotations

import math
from codegen.mappings.ctx_common import (DEFAULT_OPTIONS, Sizes, alone_on_axis, attn_addressing, batch_groups, ident,
                                loop_block_var, params, source, tile_index, with_roles)
from codegen.source import KernelSource
from codegen.cuda.tma import Encoder, encode_driver, tiled_map
from compiler.machine import DEVICE, DTYPES
from codegen.mappings.plan import AttentionPlan, check_plan

_ALIGN_SLACK = 1024  # the kernel rounds the dynamic shared base up to 1024 bytes
REG_PRODUCER = 24

def _geometry(p: AttentionPlan) -> dict:
    """Warpgroups, shared-memory layout, registers; ValueError naming the field."""
    if not isinstance(p, AttentionPlan):
        raise TypeError(f"render_attn_wgmma needs an AttentionPlan, got {type(p).__name__}")
    if p.mma != "wgmma":
        raise ValueError(f"render_attn_wgmma needs plan.mma == 'wgmma', got {p.mma!r}")
    dts = {p.q.dtype, p.k.dtype, p.v.dtype, p.o.dtype}
    if len(dts) != 1 or p.q.dtype not in ("f16", "bf16"):
        raise ValueError(f"wgmma attention needs q, k, v, o all f16 or all bf16, got {sorted(dts)}")
    if p.k.level != "shared" or p.v.level != "shared":
        raise ValueError(f"wgmma reads K / V from shared memory: levels must be 'shared' "
                         f"(got {p.k.level}, {p.v.level})")
    if p.q.level not in ("shared", "register"):
        raise ValueError(f"q level {p.q.level!r}: the wgmma path stages Q in shared memory")
    if not p.p_in_registers:
        raise ValueError("wgmma attention takes P as the register A operand: p_in_registers must be True")
    d = p.head_dim
    if d not in (64, 128, 192, 256) or d % 64:
        raise ValueError(f"head_dim {d}: the wgmma path needs a multiple of 64 (128-byte rows), <= 256")
    bm, bn = p.block_m, p.block_n
    if bm % 64 or not 64 <= bm <= 192:
        raise ValueError(f"block_m={bm} must be 64, 128 or 192 (64 rows per consumer warpgroup)")
    nwg = bm // 64
    if p.warps != bm // 16:
        raise ValueError(f"warps={p.warps}: the wgmma path needs block_m/16 = {bm // 16} consumer warps "
                         "(4 per warpgroup; the producer warpgroup is added)")
    if bn % 16 or not 16 <= bn <= 256:
        raise ValueError(f"block_n={bn} must be a multiple of 16 and <= 256 (wgmma m64nNk16)")
    if p.stages < 2:
        raise ValueError("stages must be >= 2 for the K/V ring")
    for op in (p.q, p.k, p.v):
        if 2 + len(batch_groups(op)) > 5:
            raise ValueError(f"operand {op.name}: {len(batch_groups(op))} runs of non-adjacent batch dims need a "
                             "TMA map of rank > 5")
    eb = DTYPES[p.q.dtype].bytes
    q_bytes, kv_stage = bm * d * eb, bn * d * eb
    k_off = q_bytes
    v_off = k_off + p.stages * kv_stage
    bar_off = v_off + p.stages * kv_stage
    total = bar_off + 8 * (1 + 3 * p.stages) + _ALIGN_SLACK
    threads = (nwg + 1) * 128
    reg_consumer = min(240, (DEVICE.regs_per_sm - 128 * REG_PRODUCER) // (nwg * 128) // 8 * 8)
    return dict(NWG=nwg, threads=threads, PANELS=d // 64, Q_BYTES=q_bytes, KV_STAGE=kv_stage,
                K_OFF=k_off, V_OFF=v_off, BAR_OFF=bar_off, smem_bytes=total,
                REG_PRODUCER=REG_PRODUCER, REG_CONSUMER=reg_consumer,
                SN=bn // 2, ON=d // 2, KT=bn // 16)


def _context(p: AttentionPlan, mask: dict, overlap: bool) -> dict:
    p = with_roles(p)
    g = _geometry(p)
    sz = Sizes(p)
    dt = p.q.dtype
    ctx: dict = dict(g, kname=ident(p.kernel_name), stages=p.stages, dt=dt, ct=dt + "_t", D=p.head_dim,
                     BM=p.block_m, BN=p.block_n,
                     guard_q=p.guard_q, guard_kv=p.guard_kv, overlap=overlap,
                     Nq=sz.expr(p.seq_q), Nk=sz.expr(p.seq_k),
                     SL2=repr(float(p.scale) * math.log2(math.e)) + "f")
    ctx.update(mask)
    if mask.get("general_score"):  # the score is computed first: the fold runs in log2(e) units
        ctx["SL2"] = repr(math.log2(math.e)) + "f"
    param_list, names = params(p, sz)
    ctx["params"], ctx["_arg_names"] = param_list, names + ("tmaps",)
    ctx.update(attn_addressing(p, sz))  # batch offsets and row strides (O is stored directly)
    # TMA coordinates beyond (column, row): one per run of adjacent batch dims (tma_view)
    for key, op in (("q", p.q), ("k", p.k), ("v", p.v)):
        coords = []
        for run in batch_groups(op):
            c = loop_block_var(op.roles[run[0]])
            for i in run[1:]:
                c = f"({c}) * {sz.expr(op.dims[i])} + {loop_block_var(op.roles[i])}"
            coords.append(f"(int)({c})")
        ctx[f"{key}_rank"] = 2 + len(coords)
        ctx[f"{key}_coords"] = "".join(", " + c for c in coords)
    qloop = next(g for g in p.grid if g.dim == p.seq_q and g.tile == p.block_m)
    raw = tile_index(p, p.seq_q, p.block_m, sz)
    if not mask["heavy_first"]:
        ctx["qt_expr"] = f"(int){raw}"
    elif alone_on_axis(p, qloop.loop):
        ctx["qt_expr"] = f"(int)(gridDim.{qloop.axis} - 1u - blockIdx.{qloop.axis})"
    else:
        ctx["qt_expr"] = f"(int)({sz.extent(p.seq_q, p.block_m)} - 1 - {raw})"
    ctx["summary"] = (f"TMA warp-specialized wgmma, d{p.head_dim} {p.block_m}x{p.block_n}, "
                      f"{g['NWG']} consumer warpgroups, stages {p.stages}, mask {mask['has_mask']}, "
                      f"overlap {overlap}, 128B swizzle")
    return ctx


def render_attn_wgmma(plan: AttentionPlan, mask: dict, options: tuple[str, ...] = DEFAULT_OPTIONS,
                      tma: bool = True, overlap: bool = True) -> KernelSource:
    """Render the Hopper attention kernel of a plan (same KernelSource contract as render()).

    Only the TMA variant exists (tma=True): its last argument is a device pointer to the three
    128-byte tensor maps of encode_attn_tensor_maps() (Q, K, V)."""
    if not tma:
        raise ValueError("the wgmma attention kernel loads tiles with TMA only (tma=True)")
    check_plan(plan)
    if not any(DEVICE.arch in o for o in options):
        raise ValueError("wgmma needs the arch-specific target: --gpu-architecture=sm_90a")
    return source("online_fold_wgmma.cu.j2", _context(plan, mask, overlap), options)




# ---------------------------------------------------------------- TMA tensor maps (host side)
def tma_supported_attn(plan: AttentionPlan, sizes: dict[str, int], ptrs: tuple[int, ...] = ()) -> bool:
    """TMA needs 16-byte aligned bases (rows are D * 2 bytes, always 16-byte multiples)."""
    return all(p % 16 == 0 for p in ptrs) and all(sizes[b] > 0 for b in plan.batch) \
        and sizes[plan.seq_q] > 0


def encode_attn_tensor_maps(plan: AttentionPlan, sizes: dict[str, int], q_ptr: int, k_ptr: int,
                            v_ptr: int, encode: Encoder = encode_driver) -> bytes:
    """The 384 bytes (maps of Q, K, V; 128 each) the kernel's last argument points to (copy them
    to device memory, 64-byte aligned). Maps {D, seq, batch runs..} with the operand layout's own
    strides (tma_view), boxes {64, block rows, 1..}, 128-byte swizzle, zero fill out of bounds;
    encode: the driver's encoding (libcuda cuTensorMapEncodeTiled) or the CPU emulation's."""
    if not tma_supported_attn(plan, sizes, (q_ptr, k_ptr, v_ptr)):
        raise ValueError("attention TMA maps need 16-byte aligned bases and non-empty batch / queries")
    nk = sizes[plan.seq_k]
    if nk == 0:  # the kernel loads no K/V tile; keep the maps valid (an empty tensor may have no base)
        sizes = {**sizes, plan.seq_k: 1}
        k_ptr = v_ptr = q_ptr
    maps = b""
    plan = with_roles(plan)
    for op, ptr, rows in ((plan.q, q_ptr, plan.block_m), (plan.k, k_ptr, plan.block_n), (plan.v, v_ptr, plan.block_n)):
        dims, strides = tma_view(op, sizes)
        if nk == 0 and op is not plan.q:
            dims, strides = [dims[0]] + [1] * (len(dims) - 1), strides
        maps += encode(tiled_map(op.dtype, ptr, dims, [64, rows] + [1] * (len(dims) - 2), strides))
    return maps


def tma_view(op, sizes: dict[str, int]) -> tuple[list[int], list[int]]:
    """The strided view a TMA map reads an operand through: dims {head, rows, batch runs...}
    (innermost first) and the element strides of dims 1.. — the row-major strides of the
    operand's own layout (its roles), adjacent batch dims flattened into one run."""
    ext = [sizes[d] for d in op.dims]

    def stride(pos: int) -> int:
        out = 1
        for n in ext[pos + 1:]:
            out *= n
        return out

    seq = op.roles.index("seq")
    dims, strides = [ext[-1], ext[seq]], [stride(seq)]
    for run in batch_groups(op):
        n = 1
        for i in run:
            n *= ext[i]
        dims.append(n)
        strides.append(stride(run[-1]))
    return dims, strides
