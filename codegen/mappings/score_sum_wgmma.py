"""Warpgroup tensor-core mapping (wgmma, sm_90a) of a tile sum over score tiles: the attention
backward's dV / dK (and dQ) on Hopper.  The plan is the mma.sync printer's (score_sum.match, with
the sums mapped to wgmma): the meaning is decided by the rules, this printer only picks the
instructions.

    stage R_t (row tiles, once)                       -> shared, 128-byte swizzled 64-column panels
    for it in the tile range:
        stage C_t (column tiles, a cp.async ring)    -> shared, same layout
        score tile  = R_t . C_tᵀ        wgmma, both operands K-major in shared memory
        A<i>        = the kernel IR's value of sum i, element-wise on the accumulator layout
        acc<i>     += A<i> . X<i>       wgmma, A from registers, X (a column tile read at
                                        [column, output column]) MN-major in shared memory

Each warpgroup owns 64 of the block's rows (m64 of wgmma).  The rows of the score tile are the
rows of the block (dV / dK: rows = keys, the score is Sᵀ = K·Qᵀ as FlashAttention-2 computes it),
so the accumulator of the score tile is, element for element, the register A fragment of the
accumulation (the identity the forward's P·V uses): Pᵀ and dSᵀ never go through shared memory.
One shared tile serves as the K-major B of a score (rows = n) and as the MN-major B of an
accumulation (rows = k): the panelled swizzled layout is the same for both.
The sums' values are formed side by side per element, the sub-expressions several of them hold
(P = exp(S - LSE), inside dK's dS = P (dP - D) too: score_sum.common_terms) computed once, exp
as the forward computes it (ex2.approx of log2(e) x).

Group loops (GQA's dK / dV: a sum over the query heads g of a K / V head around the query-tile
sum) are printed as score_sum.match reads them: the row tiles staged once, then per group step the
column pointers at the step's g, the tile range, the reads and the ring anew, every step adding
into the accumulators (one per sum: GQA's fused dV and dK share the steps, the ring and the score
tiles; the first accumulation of the kernel, not of the step, starts them).
The mask's bounds (a window's lower and upper, a disjunction's union) narrow the tile range and
the per-warpgroup skip (score_sum.shared_context); score terms (an ALiBi slope times j - i, a bias
read) are the kernel IR's value, printed per fragment element.

Refused by name: head dims other than 64 and 128 (the accumulators of two sums of d128 and two
score tiles fill the register file; d256 does not fit), blocks that are not whole warpgroups of
64 rows, column tiles that are not a multiple of 16 rows up to 128, and everything score_sum.match
refuses.
"""
from __future__ import annotations

from ..kir.ir import Kernel
from ..source import KernelSource
from .common import launch_of, refuse
from .ctx_common import DEFAULT_OPTIONS, source
from .registry import Mapping, Printed, Variant, register
from .score_sum import ScoreSumPlan, _Match, match, shared_context

NAME = "score_sum wgmma"
HEADS = (64, 128)
PANEL = 64  # elements of a 128-byte swizzle row (f16 / bf16)
# a row read is loaded per fragment row (e >> 1: rows g, g + 8), a column read per fragment column (nt, e & 1)
READS_AT = {"row": "rr{}[e >> 1]", "col": "rc{}[nt][e & 1]"}


def check_plan(p: ScoreSumPlan) -> None:
    """Refuse by name what the template does not implement."""
    if p.head not in HEADS:
        raise refuse(NAME, f"head dim {p.head}: only {' and '.join(map(str, HEADS))} are implemented")
    if p.warps % 4 or p.block_m != 16 * p.warps:
        raise refuse(NAME, f"{p.block_m} rows over {p.warps} warps: wgmma needs whole warpgroups of 64 rows "
                     "(16 rows per warp)")
    if p.block_n % 16 or not 16 <= p.block_n <= 128:
        raise refuse(NAME, f"column tiles of {p.block_n} rows: a multiple of 16 up to 128 is implemented")


def phases(n_scores: int, term_groups: list[int], acc_groups: list[int], read_groups: list[int]) -> list[dict]:
    """The element-wise work in the order the score tiles land (one wgmma group each, issued in
    order): phase g waits for group g, leaving the later score groups and the accumulations issued
    by earlier phases in flight (wgmma.wait_group counts the most recent groups), and computes the
    terms and values whose last score tile is g; the row / column reads a phase needs are loaded
    one phase ahead (`ahead`: the first phase's before the score wgmmas are issued)."""
    out, issued, fenced = [], 0, 0
    for g in range(n_scores):
        terms = [i for i, t in enumerate(term_groups) if t == g]
        accs = [i for i, a in enumerate(acc_groups) if a == g]
        if not terms and not accs:
            continue
        out.append(dict(wait=n_scores - 1 - g + issued, scores=list(range(fenced, g + 1)), terms=terms, accs=accs,
                        reads=[i for i, r in enumerate(read_groups) if r == g], ahead=[]))
        fenced = g + 1
        issued += 1 if accs else 0
    for before, ph in zip(out, out[1:]):
        before["ahead"] = ph["reads"]
    return out


def context(m: _Match) -> dict:
    p = m.plan
    elem = 2
    tile_bytes_r = p.block_m * p.head * elem
    tile_bytes_c = p.block_n * p.head * elem
    row_smem = len(p.row_tiles) * tile_bytes_r
    col_smem = p.stages * len(p.col_tiles) * tile_bytes_c
    shared = shared_context(m, "sc{}[4 * nt + e]", 64, "wgi", common=True, fast_exp=True, staged_terms="cs{}[kk][j][h]",
                            staged_reads_at=READS_AT)
    # a read the same at every tile is loaded once, before the loop
    reads = shared["reads"]
    order = phases(len(p.scores), shared["term_groups"], shared["acc_groups"],
                   [-1 if r["invariant"] else r["first"] for r in reads])
    return dict(
        shared, phases=order, ahead=order[0]["reads"],
        # three stages or more: the ring is loaded one step less ahead, so that the accumulations of a
        # step stay in flight across the next step's barrier, loads and score wgmmas
        inflight=p.stages >= 3, lead=p.stages - 2 if p.stages >= 3 else p.stages - 1, invariant=[i for i, r in enumerate(reads) if r["invariant"]],
        threads=p.warps * 32, NWG=p.warps // 4, PANEL=PANEL, PANELS=p.head // PANEL,
        SN=p.block_n // 2, AN=p.head // 2, KD=p.head // 16, KT=p.block_n // 16,
        # 1024 bytes of slack: the tiles start at the next 1024-byte boundary (the swizzle atom)
        smem_bytes=row_smem + col_smem + 1024, col_smem_off=row_smem,
        tile_bytes_r=tile_bytes_r, tile_bytes_c=tile_bytes_c,
        summary=(f"wgmma tile sum {p.block_m}x{p.block_n} d{p.head}, warpgroups {p.warps // 4}, stages {p.stages}, "
                 f"{len(p.acc_tiles)} sum(s), {len(p.scores)} score tile(s), row tiles {len(p.row_tiles)}, "
                 f"column tiles {len(p.col_tiles)}"
                 + (f", summed over {', '.join(p.groups)}" if p.groups else "")),
    )


def render(k: Kernel, options: tuple[str, ...] = DEFAULT_OPTIONS) -> Printed:
    m = match(k, "wgmma", NAME)
    check_plan(m.plan)
    try:
        ks: KernelSource = source("score_sum_wgmma.cu.j2", context(m), options)
    except ValueError as exc:
        raise refuse(NAME, str(exc)) from None
    promises = {"expect_mma": "wgmma", "expect_async_copy": True, "forbid_spills": True}
    return Printed("score_sum_wgmma", k, m.plan, (Variant("kernel", ks, launch_of(k, ks)),), promises)


register(Mapping("score_sum_wgmma", "score_sum", "wgmma", lambda k, o: render(k, o), prints_also=True))
