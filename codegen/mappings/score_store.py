"""Tensor-core mapping (mma.sync) of a stored score tile: the attention backward's dBias = dS, an
element-wise value of score tiles written as an N x N tile with no sum over its columns; read off
the kernel IR and refused by name otherwise.  It is score_sum's store form and shares its pieces
(staged tiles, score sums, the element-wise value printer, the score-tile template macros).

The meaning this printer implements (names are the kernel IR's own):

    stage R_t[r < BM, e < D] = [bound] ? R[.., BM*rt + r, .., e] : 0     (row tiles: 1 or more)
    stage C_t[r < BN, e < D] = [bound] ? C[.., BN*ct + r, .., e] : 0     (column tiles: 1 or more)
    store Out[.., BM*rt + row, BN*ct + col] = A   where [row bound] && [column bound]

where the grid covers the row tiles rt and the column tiles ct, the lanes are (row @warp, col),
and A is any element-wise expression (score_sum's) of score sums
sum(e < D @mma: R_t[row, e] * C_t[col, e]) (computed with mma.sync in the accumulator layout),
reads of the kernel's inputs, constants, index values and guards.  The column index must be the
output's innermost dim (pairs of adjacent columns are stored together).  A tile loop, a
transposed score, register-level tiles and any other statement are refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler.ir import Aff, Expr
from compiler.machine import DTYPES

from ..kir.grid import block_index_c
from ..kir.ir import Kernel, Stage
from ..source import KernelSource
from .cexpr import ext_c, size_names
from .common import bound_cond, launch_of, operand, refuse, staged
from .ctx_common import DEFAULT_OPTIONS, ident, loop_block_var, source
from .plan import Operand
from .registry import Mapping, Printed, Variant, register
from .score_sum import (
    Score, Tile, base_c, check_elementwise, element_value_c, kernel_params_c, score_sums, stage_tile, stride_c,
)

NAME = "score_store mma_sync"


@dataclass(frozen=True)
class ScoreStorePlan:
    kernel_name: str
    dtype: str
    row_tiles: tuple[Tile, ...]
    col_tiles: tuple[Tile, ...]
    scores: tuple[Score, ...]
    block_m: int
    block_n: int
    head: int              # columns of every staged tile (the head dim)
    warps: int
    out: Operand           # roles: 'seq' at the rows, 'head' at the (innermost) columns
    form: str = "store"    # score_sum's form is the tile sum; this one stores the tile
    mma: str = "mma_sync"


@dataclass(frozen=True)
class _Match:
    plan: ScoreStorePlan
    k: Kernel
    value: Expr
    row: str
    col: str
    rtile: str
    ctile: str


def _lane_position(sidx: tuple[Aff, ...], lane: str, grid_vars: set[str], what: str) -> tuple[int, str, int]:
    """(position, tile grid loop, tile size) of the output index `size * tile + lane`."""
    at = [p for p, a in enumerate(sidx) if a.coef(lane) != 0]
    if len(at) != 1:
        raise refuse(NAME, f"the output index does not hold the {what} lane {lane} at one position")
    rest = sidx[at[0]] - Aff.of(lane)
    if sidx[at[0]].coef(lane) != 1 or rest.const or len(rest.terms) != 1 or rest.terms[0][0] not in grid_vars:
        raise refuse(NAME, f"the output {what} index {sidx[at[0]]} is not tile * grid loop + {lane}")
    return at[0], rest.terms[0][0], rest.terms[0][1]


def match(k: Kernel) -> _Match:
    if not k.body or not all(isinstance(s, Stage) for s in k.body):
        raise refuse(NAME, "the kernel is not [stage row and column tiles; store] (a score tile store)")
    if any(s.buf.level != "shared" for s in k.body):
        raise refuse(NAME, "every tile must be staged in shared memory (register-level tiles: not implemented)")
    if len(k.lanes) != 2:
        raise refuse(NAME, "the output tile must be rows x columns lanes")
    row, col = k.lanes[0].var, k.lanes[1].var
    rl = k.lanes[0]
    warps = rl.mapping.count if rl.mapping and rl.mapping.level == "warp" and rl.mapping.count else 1
    grid_vars = {g.var for g in k.grid}
    sidx = k.store.index
    rpos, rtile, bm = _lane_position(sidx, row, grid_vars, "row")
    cpos, ctile, bn = _lane_position(sidx, col, grid_vars, "column")
    if rtile == ctile:
        raise refuse(NAME, f"rows and columns are tiled by the one grid loop {rtile}")
    if cpos != len(sidx) - 1:
        raise refuse(NAME, f"the column index {sidx[cpos]} is not the output's innermost dim")
    if k.lanes[0].extent != bm or k.lanes[1].extent != bn:
        raise refuse(NAME, f"the lanes {row}, {col} do not span the {bm} x {bn} output tile")
    batch = grid_vars - {rtile, ctile}
    roles = []
    for p, a in enumerate(sidx):
        if p in (rpos, cpos):
            roles.append("seq" if p == rpos else "head")
        elif len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const and a.terms[0][0] in batch:
            roles.append(a.terms[0][0])
        else:
            raise refuse(NAME, f"output index {a} at position {p} is neither the rows, the columns nor a block index")
    out = operand(k, k.output.name, "global", NAME)
    out = Operand(out.name, out.dims, out.dtype, out.level, tuple(roles))
    # a tile is a row tile when its read moves with the row tiles, else a column tile
    row_st = [s for s in k.body if any(rtile in a.names() for a in staged(s.value)[1].idx)]
    col_st = [s for s in k.body if s not in row_st]
    row_tiles = tuple(stage_tile(k, s, rtile, batch, NAME) for s in row_st)
    col_tiles = tuple(stage_tile(k, s, ctile, batch, NAME) for s in col_st)
    if not row_tiles or not col_tiles:
        raise refuse(NAME, "the kernel stages no row tile or no column tile")
    if any(t.rows != bm for t in row_tiles) or any(t.rows != bn for t in col_tiles):
        raise refuse(NAME, f"row tiles must have {bm} rows and column tiles {bn}")
    heads = {t.cols for t in row_tiles + col_tiles}
    if len(heads) != 1:
        raise refuse(NAME, f"every staged tile must hold one head dim ({sorted(heads)})")
    head = heads.pop()
    value = k.store.value
    scores = score_sums(value, row, col, {t.buf: i for i, t in enumerate(row_tiles)},
                        {t.buf: i for i, t in enumerate(col_tiles)}, head, k, NAME)
    check_elementwise(value, k, {row, col, rtile, ctile} | batch | set(dict(k.sizes)), None, NAME)
    out_rows, out_cols = out.dims[rpos], out.dims[cpos]
    for c in k.store.guard:
        if bound_cond(c, (rtile, bm), row) != out_rows and bound_cond(c, (ctile, bn), col) != out_cols:
            raise refuse(NAME, f"store condition {c} is not the row or the column tail bound")
    dtypes = {t.op.dtype for t in row_tiles + col_tiles}
    if len(dtypes) != 1 or not DTYPES[next(iter(dtypes))].mma_operand:
        raise refuse(NAME, f"the tiles must share one f16 / bf16 dtype, found {sorted(dtypes)}")
    plan = ScoreStorePlan(k.name, dtypes.pop(), row_tiles, col_tiles, scores, bm, bn, head, warps, out)
    return _Match(plan, k, value, row, col, rtile, ctile)


def context(m: _Match) -> dict:
    p, k = m.plan, m.k
    fixed = k.fixed()
    sizes = size_names(k.sizes)
    bidx = block_index_c([(g.var, ext_c(g.ext, sizes), g.axis) for g in k.grid])
    batch = {g.var: loop_block_var(g.var) for g in k.grid if g.var not in (m.rtile, m.ctile)}
    ptr = {t.name: f"p_{ident(t.name)}" for t in k.tensors}
    elem = DTYPES[p.dtype].bytes
    rows_w = p.block_m // p.warps
    if rows_w * p.warps != p.block_m or rows_w % 16 or p.block_n % 16 or p.head % 16:
        raise ValueError(f"rows per warp {p.block_m}/{p.warps}, column tile {p.block_n} and head dim {p.head} "
                         "must be multiples of 16")
    names = {**sizes, **batch, m.rtile: "rt", m.ctile: "ct", m.row: "er_", m.col: "ec_"}
    score_of = {s.sum: f"sc{i}[mi][nt][e]" for i, s in enumerate(p.scores)}
    params, arg_names = kernel_params_c(k, ptr)
    tile_bytes_r = p.block_m * p.head * elem
    tile_bytes_c = p.block_n * p.head * elem
    row_smem = len(p.row_tiles) * tile_bytes_r

    def tile_ctx(t: Tile, tile: str, rows: int) -> dict:
        ld = stride_c(t.op, t.op.roles.index("seq"), fixed)
        return dict(ptr=ptr[t.op.name], base=base_c(t.op, fixed, f"{tile} * {rows}"), ld=ld, register=False,
                    lim=f"{sizes[t.rows_size]} - {tile} * {rows}")

    out_rows = p.out.dims[p.out.roles.index("seq")]
    out_cols = p.out.dims[p.out.roles.index("head")]
    return dict(
        kname=ident(k.name), threads=p.warps * 32, dt=p.dtype, out_dt=p.out.dtype, ct=p.dtype + "_t", elem=elem,
        vec=16 // elem, D=p.head, BM=p.block_m, BN=p.block_n, ROWS_W=rows_w, MI=rows_w // 16, NT=p.block_n // 8,
        KD=p.head // 16, swizzle=True, params=params, _arg_names=arg_names,
        batch_decls=[f"const long long {v} = {bidx[g]};" for g, v in batch.items()],
        rtile_expr=f"(int){bidx[m.rtile]}", ctile_expr=f"(int){bidx[m.ctile]}",
        row_tiles=[tile_ctx(t, "rt", p.block_m) for t in p.row_tiles],
        col_tiles=[tile_ctx(t, "ct", p.block_n) for t in p.col_tiles],
        scores=[dict(row=s.row, col=s.col) for s in p.scores],
        value=element_value_c(k, m.value, names, score_of),
        out_ptr=ptr[p.out.name], out_base=base_c(p.out, fixed, f"rt * {p.block_m}") + f" + (long long)ct * {p.block_n}",
        out_ld=stride_c(p.out, p.out.roles.index("seq"), fixed),
        out_row_lim=f"{sizes[out_rows]} - rt * {p.block_m}", out_col_lim=f"{sizes[out_cols]} - ct * {p.block_n}",
        smem_bytes=row_smem + len(p.col_tiles) * tile_bytes_c, col_smem_off=row_smem,
        tile_bytes_r=tile_bytes_r, tile_bytes_c=tile_bytes_c,
        summary=(f"mma.sync score tile store {p.block_m}x{p.block_n} d{p.head}, warps {p.warps}, "
                 f"{len(p.scores)} score tile(s), row tiles {len(p.row_tiles)}, column tiles {len(p.col_tiles)}"),
    )


def render(k: Kernel, options: tuple[str, ...] = DEFAULT_OPTIONS) -> Printed:
    m = match(k)
    try:
        ks: KernelSource = source("score_store.cu.j2", context(m), options)
    except ValueError as exc:
        raise refuse(NAME, str(exc)) from None
    promises = {"expect_mma": "mma_sync", "expect_async_copy": True, "forbid_spills": True}
    return Printed("score_store_mma_sync", k, m.plan, (Variant("kernel", ks, launch_of(k, ks)),), promises)


register(Mapping("score_store_mma_sync", "score_store", "mma_sync", lambda k, o: render(k, o)))
