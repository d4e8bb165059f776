"""Tensor-core ONLINE-AGG mappings (mma.sync, wgmma): read an AttentionPlan and the fold's mask,
tile range and scale off the kernel IR.

The meaning these printers implement (names are the kernel IR's own; MASK any conjunction of
affine conditions, printed by codegen.mappings.cexpr — never a flag):

    stage Q_t[r < BM, e < D] = [bound] ? Q[.., BM*io + r, .., e] : 0        (any layout, see below)
    for jo < EXT carrying (m = -inf, l = 0, acc = 0):            EXT printed as written (MASK skip)
                        (wgmma: from the first tile MASK reaches for the block, cexpr.first_tile_c;
                         the steps below are fully masked and leave (m, l, acc) unchanged)
        stage K_t[r < BN, e < D] = [bound] ? K[batch.., BN*KT + r, e] : 0      (V_t alike)
                        (KT the key tile of step jo, read off both index maps: jo itself, or
                         SPLIT-KV's S*jo + ks with ks a grid loop; increasing in jo)
        compute S[c < BN] = [MASK] ? SCORE(sum(e < D: Q_t[ii, e] * K_t[c, e])) : -inf
        compute m' = max(m, max(x < BN: S[x]))
        compute P[c < BN] = [MASK] ? exp(S[c] - m') : 0
        m := m';  l := l * rescale(m, m') + sum(y < BN: P[y])
        acc := acc * rescale(m, m') + sum(z < BN: [C] ? P[z] * V_t[z, d] : 0)   (C implied by MASK / V's fill)
    store O[.., BM*io + ii, .., d] = acc / l   where [bound]
      (FOLD-STAT: also LSE[O's index without d] = m + log(l) where [bound] && d <= 0;
       SPLIT-KV's partial state: O = acc, also M[..] = m and L[..] = l where [bound] && d <= 0,
       M, L, O f32 with a literal split dimension read at the grid loop ks; the printed m is
       converted from the template's log2 units (scale folded in) to the score's, exactly as LSE)

Layouts: every index map of Q, K, V and O is read off the kernel IR (`_roles`): one position
holds the tile rows, the last the head-dim index (stride 1), every other one a grid loop's block
index — [B, H, N, D], flash-attn's [B, N, H, D], grouped-query K / V read at the KV head only.
The printers address each operand with its row-major strides (TMA maps of that rank, cp.async
row addresses); any other index map is refused by name.  Packed rows (mma.sync; GQA decode): the
lanes are (g, ii, d) with g and ii on warps, Q staged as Q_t[g < G, r < BM, e] and read Q_t[g, ii, e],
Q and O (and the state) read g at one dim (role 'pack'): tile row BM·g + ii, K / V once per block.

SCORE is any element-wise expression of the contraction (once), constants, index values, sizes and
reads of the kernel's inputs at the query row, key column, tiles, batch indices and sizes (ALiBi's
`Slope[h] * idx(j - i)`, a bias, soft-capping's `c * tanh(QK / c)`).  The printers take its normal
form (codegen.mappings.score: equivalent spellings print one kernel): SCALE * QK with a positive
constant SCALE folds SCALE into exp2's log2(e) factor (the row max is taken before scaling); any
other score is printed by codegen.mappings.cexpr.value_c per element, every read guarded by its
tensor's bounds, and the fold runs in log2(e) units.  Every part is compared with the
kernel IR; any other update (a dropped rescale, a running max that is not updated, another score)
is refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from compiler.ir import Aff, Bin, Cond, Const, DataCond, DataSpan, Expr, Ext, IndexValue, Or, Read, Reduce, Select, Un, walk
from compiler.printer import show_expr

from ..kir.ir import Compute, Kernel, Stage, TileLoop
from .ctx_common import loop_block_var
from .data_span import HI, LO, span_c, span_prologue
from .plan import AttentionPlan, Operand
from .render import render_fold
from .score import contraction_in, normal_form, split_scale, substitute
from .render_attn_wgmma import encode_attn_tensor_maps, render_attn_wgmma
from ..cuda.tma import Encoder, encode_driver
from .registry import Mapping, Printed, Variant, register
from .common import bound_cond, grid_axes, launch_of, operand, refuse, size_name, staged

NEG_INF = Const(float("-inf"))


@dataclass(frozen=True)
class FoldMask:
    """What the fold printers print from the kernel IR: the score mask (conditions over the row
    lane `row`, the key column `col`, the query tile `qtile` and the key tile `ktile`), the key
    tile range, and the kernel IR's names for them."""

    conds: tuple[Cond, ...]
    row: str
    col: str
    qtile: str
    ktile: str
    ext: Ext
    score: Expr | None = None  # the general score, in normal form (None: the score is SCALE * Q.K)
    acc: str = ""  # the name the score reads its contraction by (Read(acc, ()))
    batch: tuple[tuple[str, str], ...] = ()  # (grid variable, the batch size it enumerates)
    key_tile: Aff | None = None  # the key tile step `ktile` folds (SPLIT-KV: S*ktile + ks); None: ktile


def _rd(name: str, *idx: str) -> Read:
    return Read(name, tuple(Aff.of(i) for i in idx))


def _masked(e: Expr, other: Const) -> tuple[tuple[Cond, ...], Expr]:
    if isinstance(e, Select) and e.other == other:
        return e.conds, e.then
    return (), e


def _rename(conds: tuple[Cond, ...], old: str, new: str) -> tuple[Cond, ...]:
    return tuple(c.subst(old, Aff.of(new)) for c in conds)


def match(k: Kernel, mapping: str) -> tuple[AttentionPlan, FoldMask]:
    loops = [s for s in k.body if isinstance(s, TileLoop)]
    pre = [s for s in k.body if not isinstance(s, TileLoop)]
    if len(loops) != 1 or k.body[-1] is not loops[0] or len(pre) != 1 or not isinstance(pre[0], Stage):
        raise refuse(mapping, "the kernel is not [stage Q tile; one tile loop] (an online fold)")
    loop, q_stage = loops[0], pre[0]
    if len(loop.state) != 3:
        raise refuse(mapping, f"the tile loop carries {len(loop.state)} states, ONLINE-AGG carries (m, l, acc)")
    m, l, acc = (st.name for st in loop.state)
    if tuple(st.init for st in loop.state) != (NEG_INF, Const(0.0), Const(0.0)):
        raise refuse(mapping, "fold state does not start at (-inf, 0, 0)")
    pack_lane = _pack_lane(k, mapping)
    row, dl = k.lanes[-2].var, k.lanes[-1].var
    pack = pack_lane.var if pack_lane is not None else None
    stages = [s for s in loop.body if isinstance(s, Stage)]
    computes = [s for s in loop.body if isinstance(s, Compute)]
    if len(stages) != 2 or len(computes) != 3 or len(loop.body) != 5:
        raise refuse(mapping, "the fold step must stage K and V tiles and compute S, the new max and P")
    s_c, mn_c, p_c = computes
    mn = mn_c.buf.name
    if len(s_c.buf.dims) != 1 or len(p_c.buf.dims) != 1 or mn_c.buf.dims:
        raise refuse(mapping, "S and P must be score rows and the new max a scalar")
    (c, bn), (cp, bn_p) = s_c.buf.dims[0], p_c.buf.dims[0]
    # S = [MASK] ? SCORE(sum(e < D: Q_t[row, e] * K_t[c, e]), indices, reads) : -inf
    mask, score_ir = _masked(s_c.value, NEG_INF)
    sums = contraction_in(score_ir)
    if len(sums) != 1 or sums[0].op != "sum":
        raise refuse(mapping, f"the score {s_c.buf.name} = {show_expr(score_ir)} holds {len(sums)} reductions: "
                     "it must be an element-wise function of one sum of products")
    score = sums[0]
    qk_value = Read(s_c.buf.name, ())  # the contraction's tile value, as the score expression reads it
    scale, general = split_scale(normal_form(substitute(score_ir, score, qk_value), k.fixed()), qk_value)
    e = score.var
    qk = score.body
    by_name = {st.buf.name: st for st in stages}
    q_rows = (pack, row) if pack else (row,)
    if not (isinstance(qk, Bin) and qk.op == "*" and isinstance(qk.a, Read) and isinstance(qk.b, Read)
            and qk.a.tensor == q_stage.buf.name and qk.a.idx == tuple(Aff.of(v) for v in q_rows + (e,))
            and qk.b.tensor in by_name and qk.b.idx == (Aff.of(c), Aff.of(e))):
        raise refuse(mapping, f"the score is not Q[{', '.join(q_rows)}, {e}] * K[{c}, {e}] over the staged tiles")
    k_stage = by_name[qk.b.tensor]
    # m' = max(m, max(x < BN: S[x]))
    mx = mn_c.value
    if not (isinstance(mx, Bin) and mx.op == "max" and mx.a == Read(m, ()) and isinstance(mx.b, Reduce)
            and mx.b.op == "max" and mx.b.ext.const_value() == bn and mx.b.body == _rd(s_c.buf.name, mx.b.var)):
        raise refuse(mapping, f"{mn} is not max({m}, row max of {s_c.buf.name})")
    # P = [MASK] ? exp(S[c] - m') : 0
    if bn_p != bn or p_c.value != _guard(_rename(mask, c, cp), Un("exp", Bin("-", _rd(s_c.buf.name, cp), Read(mn, ()))), Const(0.0)):
        raise refuse(mapping, f"{p_c.buf.name} is not [mask] ? exp({s_c.buf.name} - {mn}) : 0 with the score's mask")
    # updates
    upd = {st.name: st.update for st in loop.state}
    alpha = Bin("rescale", Read(m, ()), Read(mn, ()))
    if upd[m] != Read(mn, ()):
        raise refuse(mapping, f"the running max update {m} := ... is not {mn}")
    lu = upd[l]
    if not (isinstance(lu, Bin) and lu.op == "+" and lu.a == Bin("*", Read(l, ()), alpha) and isinstance(lu.b, Reduce)
            and lu.b.op == "sum" and lu.b.ext.const_value() == bn and lu.b.body == _rd(p_c.buf.name, lu.b.var)):
        raise refuse(mapping, f"the sum update {l} := ... is not {l} * rescale({m}, {mn}) + row sum of {p_c.buf.name}")
    au = upd[acc]
    if not (isinstance(au, Bin) and au.op == "+" and au.a == Bin("*", Read(acc, ()), alpha) and isinstance(au.b, Reduce)
            and au.b.op == "sum" and au.b.ext.const_value() == bn):
        raise refuse(mapping, f"the accumulator update {acc} := ... is not {acc} * rescale({m}, {mn}) + P·V")
    pv = au.b
    z = pv.var
    pv_conds, pv_body = _masked(pv.body, Const(0.0))
    if not (isinstance(pv_body, Bin) and pv_body.op == "*" and pv_body.a == _rd(p_c.buf.name, z)
            and isinstance(pv_body.b, Read) and pv_body.b.tensor in by_name and pv_body.b.tensor != k_stage.buf.name
            and pv_body.b.idx == (Aff.of(z), Aff.of(dl))):
        raise refuse(mapping, f"the accumulator's product is not {p_c.buf.name}[{z}] * V[{z}, {dl}]")
    v_stage = by_name[pv_body.b.tensor]
    v_guard = staged(v_stage.value)[0]
    v_fill = {cc.subst(v_stage.buf.dims[0][0], Aff.of(z)) for cc in v_guard}
    implied = set(_rename(mask, c, z)) | v_fill
    for cc in pv_conds:
        if cc not in implied:
            raise refuse(mapping, f"the P·V condition {cc} is not implied by the mask or V's zero fill")
    if pv.mma != score.mma or (score.mma is None):
        raise refuse(mapping, "map both products (Q·K and P·V) to the same tensor-core instruction")
    # result and store: acc / l, or SPLIT-KV's unnormalised acc (with m and l beside it)
    partial = k.store.value == Read(acc, ())
    if k.store.value != Bin("/", Read(acc, ()), Read(l, ())) and not partial:
        raise refuse(mapping, f"the stored value {show_expr(k.store.value)} is neither {acc} / {l} nor "
                     f"{acc} (SPLIT-KV's partial state)")
    grid_vars = {g.var for g in k.grid}
    out = k.output
    if SPLITS_DIM in dict(k.sizes):
        raise refuse(mapping, f"a size is named {SPLITS_DIM}, the name of a split dimension")
    sidx = k.store.index
    # the output's row index is BM * (query tile) + row: find the row position and the tile loop
    rows = [pos for pos, a in enumerate(sidx) if a.coef(row) != 0]
    if len(rows) != 1:
        raise refuse(mapping, f"the output index [{', '.join(map(str, sidx))}] does not hold the row lane {row} "
                     "at one position")
    rest = sidx[rows[0]] - Aff.of(row)
    if sidx[rows[0]].coef(row) != 1 or rest.const or len(rest.terms) != 1 or rest.terms[0][0] not in grid_vars:
        raise refuse(mapping, f"the output row index {sidx[rows[0]]} is not BM * query tile + {row}")
    qt, bm = rest.terms[0]
    o_roles = _roles(sidx, Aff.build({qt: bm, row: 1}), dl, grid_vars - {qt}, f"output {out.name}", mapping, pack)
    batch_vars = grid_vars - {qt}
    q_op = _operand(k, q_stage, Aff.of(qt, bm), batch_vars, mapping, pack is not None)
    if pack is not None:
        _check_pack_uses(pack, mask, general, mapping)
    # the key tile of step jo, read off K's and V's staging index maps (rows BN * tile + r)
    key_tile = _key_tile(k_stage, bn, loop.var, batch_vars, mapping)
    if _key_tile(v_stage, bn, loop.var, batch_vars, mapping) != key_tile:
        raise refuse(mapping, f"K's and V's tiles of step {loop.var} are not the same key rows")
    k_op = _operand(k, k_stage, key_tile.scale(bn), batch_vars, mapping)
    v_op = _operand(k, v_stage, key_tile.scale(bn), batch_vars, mapping)
    o_op = replace(_literal_operand(k, out.name, mapping), roles=o_roles)
    lse_op = None if partial else _stat_operand(k, m, l, dl, o_roles, mapping)
    state_ops = _state_operands(k, m, l, dl, o_roles, mapping) if partial else None
    splits = {d: int(a.const) for d, a in zip(o_op.dims, k.tensor(out.name).dims) if d == SPLITS_DIM}
    seq_q, seq_k = _seq(o_op), _seq(k_op)
    if _seq(q_op) != seq_q or _seq(v_op) != seq_k:
        raise refuse(mapping, f"Q's rows run over {_seq(q_op)} and O's over {seq_q}; K's over {seq_k} and V's "
                     f"over {_seq(v_op)}: the query rows and the key rows must each be one size")
    head_dims = {op.dims[-1] for op in (q_op, k_op, v_op, o_op)}
    head = k.fixed().get(o_op.dims[-1])
    if head is None or len(head_dims) != 1:
        raise refuse(mapping, f"the head dimension {sorted(head_dims)} must be one fixed size")
    fixed_sizes = k.fixed()
    if not score.ext.names() <= set(fixed_sizes) or score.ext.evaluate(fixed_sizes) != head:
        raise refuse(mapping, f"the score sums {e} < {score.ext}, not the whole head dimension {head}")
    if (k.lanes[-2].extent, k.lanes[-1].extent) != (bm, head):
        raise refuse(mapping, f"the output tile is {k.lanes[-2].extent} x {k.lanes[-1].extent}, not {bm} x {head}")
    n_pack = pack_lane.extent if pack_lane is not None else 1
    for st, tile, first, seq in ((q_stage, bm, Aff.of(qt, bm), seq_q), (k_stage, bn, key_tile.scale(bn), seq_k),
                                 (v_stage, bn, key_tile.scale(bn), seq_k)):
        _check_tile(st, tile, first, seq, head, mapping, n_pack if st is q_stage else 1)
    for cc in k.store.guard:
        if bound_cond(cc, (qt, bm), row) != seq_q:
            raise refuse(mapping, f"store condition {cc} is not the query tail bound {row} + {bm}*{qt} < {seq_q}")
    fixed = k.fixed()

    def crosses(size: str, tile: int) -> bool:  # a tile that can cross its bound is zero-filled
        return size not in fixed or fixed[size] % tile != 0

    guard_q = bool(k.store.guard) or bool(staged(q_stage.value)[0]) or crosses(seq_q, bm)
    guard_kv = bool(staged(k_stage.value)[0]) or bool(v_guard) or crosses(seq_k, bn)
    warps = 1
    for ln in k.lanes[:-1]:  # the row lanes (with packing: the packed heads and the query rows)
        warps *= (ln.mapping.count or 1) if ln.mapping and ln.mapping.level == "warp" else 1
    tiles = {qt: (seq_q, bm)}
    for pos, r in enumerate(o_roles):
        if r not in ("seq", "head", "pack"):
            tiles[r] = (o_op.dims[pos], 1)
    batch_loops = tuple(g for g in tiles if g != qt)
    if not loop.ext.names() <= set(dict(k.sizes)) | {qt} | set(batch_loops):
        raise refuse(mapping, f"the key tile range {loop.var} < {loop.ext} depends on more than sizes, the query tile "
                     "and the batch indices")
    data = tuple(dict.fromkeys(r.tensor for cc in mask if isinstance(cc, DataCond) for r in cc.reads()))
    extras = _score_inputs(k, general, qk_value, {row, c, qt, loop.var} | set(batch_loops), (q_op, k_op, v_op),
                           mapping, data)
    # every dynamic size is a kernel argument (the launch passes k.dynamic()): the mask, the key
    # tile range and the score term may use sizes no operand has
    plan = AttentionPlan(
        kernel_name=k.name, q=q_op, k=k_op, v=v_op, o=o_op,
        batch=tuple(d for d, r in zip(o_op.dims, o_roles) if r not in ("seq", "head", "pack")), seq_q=seq_q, seq_k=seq_k,
        head_dim=head, scale=scale,
        fixed=tuple((s, v) for s, v in k.sizes if v is not None) + tuple(splits.items()),
        dynamic=k.dynamic(),
        block_m=bm, block_n=bn, warps=warps, stages=max(k_stage.buf.stages, v_stage.buf.stages),
        mma=score.mma.instr, p_in_registers=p_c.buf.level == "register",
        guard_q=guard_q, guard_kv=guard_kv, grid=grid_axes(k, tiles, splits), swizzle=True, extras=extras,
        lse=lse_op, state=state_ops, pack=n_pack,
    )
    bdims = tuple((g, tiles[g][0]) for g in batch_loops)
    strided = None if key_tile == Aff.of(loop.var) else key_tile
    return plan, FoldMask(mask, row, c, qt, loop.var, loop.ext, general, qk_value.tensor, bdims, strided)


SPLITS_DIM = "splits_"  # the size name standing for a literal dimension (SPLIT-KV's splits)


def _literal_operand(k: Kernel, name: str, mapping: str) -> Operand:
    """The tensor's operand, a literal dimension (SPLIT-KV's S) named SPLITS_DIM."""
    t = k.tensor(name)
    dims = tuple(SPLITS_DIM if a.is_const() else size_name(a, mapping, f"tensor {name}") for a in t.dims)
    return Operand(name, dims, t.dtype, "global")


def _key_tile(st: Stage, bn: int, var: str, batch_vars: set[str], mapping: str) -> Aff:
    """The key tile a staged K / V copy reads at step `var`: its rows are BN * tile + r, the tile
    an affine function of `var` (increasing) and the block's batch indices (SPLIT-KV: S*jo + ks)."""
    read = staged(st.value)[1]
    r = st.buf.dims[0][0]
    rows = [a for a in read.idx if a.coef(r) != 0]
    if len(rows) != 1 or rows[0].coef(r) != 1:
        raise refuse(mapping, f"buffer {st.buf.name} reading {read.tensor}: the tile rows {r} are not read at one "
                     "position with stride 1")
    first = rows[0] - Aff.of(r)
    if first.const % bn or any(cf % bn for _, cf in first.terms):
        raise refuse(mapping, f"buffer {st.buf.name}: row {rows[0]} is not {bn} * key tile + {r}")
    tile = Aff.build({n: cf // bn for n, cf in first.terms}, first.const // bn)
    if tile.coef(var) <= 0 or tile.const < 0 or any(cf < 0 for _, cf in tile.terms) \
            or not tile.names() <= batch_vars | {var}:
        raise refuse(mapping, f"buffer {st.buf.name}: the key tile {tile} of step {var} is not an increasing "
                     f"function of {var} and the block's batch indices")
    return tile


def _pack_lane(k: Kernel, mapping: str):
    """The kernel's packed-head lane (grouped-query decode: the G query heads of one K / V head
    in the rows of one tile), or None: the lanes are rows x head dim, or packed heads x rows x
    head dim with both row lanes on warps and the packed extent fixed."""
    if len(k.lanes) == 2:
        return None
    if len(k.lanes) != 3:
        raise refuse(mapping, "the output tile must be rows x head-dim lanes (or packed heads x rows x head dim)")
    pk, rw = k.lanes[0], k.lanes[1]
    for ln in (pk, rw):
        if ln.extent is None or ln.mapping is None or ln.mapping.level != "warp":
            raise refuse(mapping, f"packed rows: lane {ln.var} is not a fixed-extent lane on warps "
                         f"({ln.mapping or 'unmapped'}); the packed heads and query rows share the warps' rows")
    return pk


def _check_pack_uses(pack: str, mask: tuple[Cond, ...], score: Expr | None, mapping: str) -> None:
    """The packed head varies inside a tile: a mask or score that reads it (a per-head bias, ALiBi
    slopes) is not printed by these printers."""
    for cc in mask:
        if pack in cc.names():
            raise refuse(mapping, f"the mask condition {cc} reads the packed head {pack}: not implemented")
    if score is not None:
        for x in walk(score):
            affs = x.idx if isinstance(x, Read) else (x.aff,) if isinstance(x, IndexValue) else ()
            if any(pack in a.names() for a in affs):
                raise refuse(mapping, f"the score {show_expr(score)} reads the packed head {pack}: not implemented")


def _stat_operand(k: Kernel, m: str, l: str, dl: str, o_roles: tuple[str, ...], mapping: str) -> Operand | None:
    """FOLD-STAT's second output, when the kernel writes one: LSE[O's index without the head dim]
    = m + log(l), f32, stored where O is and the head-dim lane is 0 (once per row)."""
    if not k.also:
        return None
    if len(k.also) != 1:
        raise refuse(mapping, f"the kernel writes {len(k.also)} further outputs; this mapping prints one (LSE)")
    st = k.also[0]
    head = o_roles.index("head")
    if st.value != Bin("+", Read(m, ()), Un("log", Read(l, ()))):
        raise refuse(mapping, f"the further output {st.tensor} = {show_expr(st.value)} is not {m} + log({l})")
    _check_row_store(k, st, dl, head, mapping)
    return replace(operand(k, st.tensor, "global", mapping), roles=o_roles[:head] + o_roles[head + 1:])


def _state_operands(k: Kernel, m: str, l: str, dl: str, o_roles: tuple[str, ...],
                    mapping: str) -> tuple[Operand, Operand]:
    """SPLIT-KV's partial state beside the unnormalised acc: the further outputs m and l, f32,
    stored at the output's index without the head dim where the head-dim lane is 0."""
    values = tuple(st.value for st in k.also)
    if values != (Read(m, ()), Read(l, ())):
        raise refuse(mapping, f"the kernel stores {k.store.value} unnormalised; its further outputs "
                     f"({', '.join(show_expr(v) for v in values)}) are not the state's ({m}, {l})")
    head = o_roles.index("head")
    ops = []
    for st in k.also:
        _check_row_store(k, st, dl, head, mapping)
        ops.append(replace(_literal_operand(k, st.tensor, mapping), roles=o_roles[:head] + o_roles[head + 1:]))
    return ops[0], ops[1]


def _check_row_store(k: Kernel, st, dl: str, head: int, mapping: str) -> None:
    if st.index != k.store.index[:head] + k.store.index[head + 1:]:
        raise refuse(mapping, f"{st.tensor} is not stored at the output's index without the head dim")
    if st.guard != k.store.guard + (Cond(Aff.of(dl), "<=", Aff.lit(0)),):
        raise refuse(mapping, f"{st.tensor}'s store condition is not the output's and {dl} == 0 (once per row)")
    if k.tensor(st.tensor).dtype != "f32":
        raise refuse(mapping, f"{st.tensor} is {k.tensor(st.tensor).dtype}: this mapping writes f32 statistics")


def _score_inputs(k: Kernel, score: Expr | None, acc: Read, indices: set[str], qkv: tuple,
                  mapping: str, data: tuple[str, ...] = ()) -> tuple:
    """The inputs the score and the mask read besides Q, K, V (kernel-argument order); refuses a
    score that is not element-wise over the contraction, the row, column, tiles and batch indices,
    and an argument order other than Q, K, V, then the score's and the mask's tensors (`data`:
    the integer inputs the mask compares)."""
    read: list[str] = list(data)
    if score is not None:
        inputs = {t.name for t in k.inputs}
        allowed = indices | set(dict(k.sizes))
        for x in walk(score):
            if not isinstance(x, (Const, Read, IndexValue, Bin, Un)) or (isinstance(x, Bin) and x.op == "rescale"):
                raise refuse(mapping, f"the score {show_expr(score)} contains "
                             f"{x.op if isinstance(x, Bin) else type(x).__name__}: only element-wise values are printed")
            if x == acc:
                continue
            affs = x.idx if isinstance(x, Read) else (x.aff,) if isinstance(x, IndexValue) else ()
            if isinstance(x, Read) and x.tensor not in inputs:
                raise refuse(mapping, f"the score reads {x.tensor}, which is not a kernel input")
            if isinstance(x, Read) and x.tensor not in read:
                read.append(x.tensor)
            for a in affs:
                if not a.names() <= allowed:
                    raise refuse(mapping, f"the score {show_expr(score)} uses {sorted(a.names() - allowed)}: "
                                 "only the query row, key column, tiles, batch indices and sizes")
    names = tuple(op.name for op in qkv)
    extra = tuple(t.name for t in k.inputs if t.name in read and t.name not in names)
    if tuple(t.name for t in k.inputs) != names + extra:
        raise refuse(mapping, f"the inputs are ({', '.join(t.name for t in k.inputs)}): this mapping takes "
                     f"({', '.join(names + extra)}) — Q, K, V first, then the tensors the score and the mask read")
    return tuple(operand(k, n, "global", mapping) for n in extra)


def _guard(conds: tuple[Cond, ...], then: Expr, other: Const) -> Expr:
    return Select(conds, then, other) if conds else then


def _roles(idx: tuple[Aff, ...], row: Aff, head: str, batch_vars: set[str], what: str, mapping: str,
           pack: str | None = None) -> tuple[str, ...]:
    """Per dimension of an index map: 'seq' where it reads the tile rows `row`, 'head' where it
    reads the head-dim index (it must be the innermost dim: TMA boxes and 16-byte rows need
    stride 1), 'pack' where it reads the packed query head `pack` (one dim, once), else the grid
    loop whose block index it reads; anything else is refused by name."""
    roles = []
    for pos, a in enumerate(idx):
        if a == row:
            roles.append("seq")
        elif pack is not None and a == Aff.of(pack):
            roles.append("pack")
        elif a == Aff.of(head):
            roles.append("head")
        elif len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const and a.terms[0][0] in batch_vars:
            roles.append(a.terms[0][0])
        else:
            raise refuse(mapping, f"{what}: index {a} at position {pos} of [{', '.join(map(str, idx))}] is neither "
                         f"the tile rows {row}, the head-dim index {head}, nor a block index of the grid")
    if roles.count("seq") != 1 or roles.count("head") != 1 or (pack is not None and roles.count("pack") != 1):
        raise refuse(mapping, f"{what}: index [{', '.join(map(str, idx))}] must read the rows {row}"
                     + (f", the packed head {pack}" if pack is not None else "") + f" and the head dim {head} once each")
    if roles[-1] != "head":
        raise refuse(mapping, f"{what}: the head-dim index {head} is at position {roles.index('head')} of "
                     f"[{', '.join(map(str, idx))}], not innermost (stride 1, which TMA boxes and 16-byte rows need)")
    return tuple(roles)


def _operand(k: Kernel, st: Stage, first: Aff, batch_vars: set[str], mapping: str, packed: bool = False) -> Operand:
    """The staged tensor's operand; `first` the tile's first row (rows first + r); packed: the
    buffer is packed heads x rows x head dim (Q of a grouped-query decode)."""
    read = staged(st.value)[1]
    if len(st.buf.dims) != 2 + packed:
        raise refuse(mapping, f"buffer {st.buf.name} is not a {'packed heads x ' if packed else ''}rows x head-dim tile")
    (r, _), (e, _) = st.buf.dims[-2:]
    roles = _roles(read.idx, first + Aff.of(r), e, batch_vars,
                   f"buffer {st.buf.name} reading {read.tensor}", mapping, st.buf.dims[0][0] if packed else None)
    return replace(operand(k, read.tensor, st.buf.level, mapping), roles=roles)


def _seq(op: Operand) -> str:
    return op.dims[op.roles.index("seq")]


def _check_tile(st: Stage, tile: int, first: Aff, seq: str, head: int, mapping: str, pack: int = 1) -> None:
    conds, read = staged(st.value)
    (r, rows), (e, cols) = st.buf.dims[-2:]
    heads = st.buf.dims[0][1] if len(st.buf.dims) == 3 else 1
    if rows != tile or cols != head or heads != pack:
        raise refuse(mapping, f"buffer {st.buf.name} is {' x '.join(str(n) for _, n in st.buf.dims)}, expected "
                     + (f"{pack} x " if pack > 1 else "") + f"{tile} x {head}")
    for cc in conds:
        if bound_cond(cc, first, r) != seq:
            raise refuse(mapping, f"buffer {st.buf.name}'s condition {cc} is not the row bound < {seq}")


def mask_context(mask: FoldMask, plan: AttentionPlan) -> dict:
    """Template entries printing the kernel IR's mask and key tile range.

    The templates call mask_keep(row, col, ktile) with C expressions for the absolute query
    row, the absolute key column and the key tile index (q0 and qt in scope), and
    mask_partial / mask_empty(row_lo, row_hi, ktile) for a block of rows times one key tile;
    score_value(acc, row, col, ktile, rowf, colf) is the general score, acc the C name of the
    contraction's value (rowf / colf: the row and
    column as exact floats, so that an index value costs float adds, not a conversion each).
    """
    from .cexpr import aff_c, box_extremes, conds_c, data_pointer_names, end_tile_c, ext_c, first_tile_c, read_c, value_c
    from .cexpr import size_names as c_sizes

    sizes = c_sizes(tuple(plan.fixed) + tuple((n, None) for n in plan.dynamic))
    bn, bm = plan.block_n, plan.block_m
    batch = {g: loop_block_var(g) for g, _ in mask.batch}

    key_tile = mask.key_tile if mask.key_tile is not None else Aff.of(mask.ktile)

    def key_tile_c(ktile: str) -> str:  # the key tile step `ktile` folds (its first row: BN times it)
        return aff_c(key_tile, {**sizes, **batch, mask.ktile: f"({ktile})"})

    data_ptrs = data_pointer_names({op.name: f"p_x{n}" for n, op in enumerate(plan.extras)})
    spans = [c for c in mask.conds if isinstance(c, DataSpan)]
    conds = tuple(c for c in mask.conds if not isinstance(c, DataSpan))
    if len(spans) > 1 or (spans and mask.key_tile is not None):
        raise ValueError("MASK-DATA: one data span over the fold's own key tiles is printed (not several, not "
                         "SPLIT-KV's strided tiles)")

    def names(row: str, col: str, ktile: str) -> dict[str, str]:
        return {**sizes, **batch, mask.row: f"({row} - q0)", mask.col: f"({col} - {key_tile_c(ktile)} * {bn})",
                mask.qtile: "qt", mask.ktile: f"({ktile})", **data_ptrs}

    def keep(row: str, col: str, ktile: str) -> str:
        ints = names(row, col, ktile)
        return f"({' && '.join([conds_c(conds, ints)] + [span_c(sp, ints) for sp in spans])})"

    def extremes(row_lo: str, row_hi: str, ktile: str) -> list[tuple[str, str]]:
        base = names(row_lo, "0", ktile)
        box = {mask.row: (f"({row_lo} - q0)", f"({row_hi} - q0)"), mask.col: ("0", str(bn - 1))}
        tile_uniform = [(span_c(sp, base), f"!{span_c(sp, base)}") for sp in spans]
        return [box_extremes(c, box, base) for c in conds] + tile_uniform

    def partial(row_lo: str, row_hi: str, ktile: str) -> str:
        return "!(" + " && ".join(ev for ev, _ in extremes(row_lo, row_hi, ktile)) + ")"

    def empty(row_lo: str, row_hi: str, ktile: str) -> str:
        return "(" + " || ".join(no for _, no in extremes(row_lo, row_hi, ktile)) + ")"

    pointers = {op.name: (p, op) for p, op in zip(("p_q", "p_k", "p_v"), (plan.q, plan.k, plan.v))}
    pointers.update({op.name: (f"p_x{n}", op) for n, op in enumerate(plan.extras)})
    row_abs, col_abs = "__row", "__col"
    # reads at block-uniform indices (batch indices and sizes only: ALiBi's Slope[h]) are loaded
    # once per block into registers t_u<n>; the others per element
    block_names = {**sizes, **batch}
    uniform: dict[Read, str] = {}
    for x in walk(mask.score) if mask.score is not None else ():
        if isinstance(x, Read) and x.tensor != mask.acc and all(a.names() <= set(block_names) for a in x.idx) and x not in uniform:
            uniform[x] = f"t_u{len(uniform)}"

    def load(r: Read, ints: dict[str, str]) -> str:
        ptr, op = pointers[r.tensor]
        return read_c(tuple(Aff.of(d) for d in op.dims), r.idx, ptr, f"{op.dtype}_to_f32", ints)

    uniform_decls = [f"const float {v} = {load(r, block_names)};" for r, v in uniform.items()]

    def score(acc: str, row: str, col: str, ktile: str, rowf: str, colf: str) -> str:
        ints = names(row, col, ktile)

        def read(r: Read) -> str:
            if r.tensor == mask.acc:
                return acc
            return uniform.get(r) or load(r, ints)

        def index_value(a: Aff) -> str:
            # in the absolute row / column (row = BM*qt + lane row, column = BN*ktile + lane column)
            a = a.subst(mask.row, Aff.build({row_abs: 1, mask.qtile: -bm}))
            a = a.subst(mask.col, Aff.of(col_abs) - key_tile.scale(bn))
            parts = [f"{a.coef(v)}.0f * {fv}" for v, fv in ((row_abs, rowf), (col_abs, colf)) if a.coef(v)]
            rest = Aff.build({v: x for v, x in a.terms if v not in (row_abs, col_abs)}, a.const)
            if rest.terms or rest.const or not parts:
                parts.append(f"(float){aff_c(rest, ints)}")
            return "(" + " + ".join(parts) + ")"

        return value_c(mask.score, read, index_value)

    # a disjunction's upper end (the union of its parts' ranges), which MASK does not express: the
    # key tiles past it are fully masked for the whole block and leave (m, l, acc) unchanged
    block_box = {mask.row: ("0", str(bm - 1)), mask.col: ("0", str(bn - 1))}
    block_ints = {**sizes, **batch, mask.qtile: "qt"}
    n_tiles = ext_c(mask.ext, {**sizes, **batch, mask.qtile: "qt"})
    or_end = end_tile_c(tuple(c for c in mask.conds if isinstance(c, Or)), mask.ktile, block_box, block_ints)
    if or_end is not None:
        n_tiles = f"min((long long)({n_tiles}), {or_end})"
    n_start = first_tile_c(conds, mask.ktile, block_box, block_ints)
    span_decls = span_prologue(spans[0], {**block_ints, **data_ptrs}) if spans else []
    if spans:  # the tiles outside the span are fully masked: each leaves (m, l, acc) unchanged
        n_tiles = f"min((long long)({n_tiles}), (long long){HI})"
        n_start = f"max({n_start}, (long long){LO})"
    # the steps whose key tile lies below Nk / BN (full tiles: a * step + b < full, a > 0)
    full = f"({sizes[plan.seq_k]} / {bn})"
    a, b = key_tile.coef(mask.ktile), aff_c(key_tile - Aff.of(mask.ktile, key_tile.coef(mask.ktile)), {**sizes, **batch})
    n_full = full if key_tile == Aff.of(mask.ktile) else f"max(0LL, ((long long){full} - {b} + {a - 1}) / {a})"
    return dict(has_mask=bool(mask.conds), mask_keep=keep, mask_partial=partial, mask_empty=empty,
                n_tiles_expr=n_tiles, key_tile_c=key_tile_c, n_full_expr=n_full,
                n_start_expr=n_start, span_decls=span_decls, ring_start_expr=f"max(0, {LO})" if spans else "0",
                heavy_first=len(mask.ext.parts) > 1 or or_end is not None, general_score=mask.score is not None, score_value=score,
                score_decls=uniform_decls)


def _promises(plan: AttentionPlan) -> dict:
    return {"expect_mma": plan.mma, "expect_async_copy": plan.k.level == "shared" and plan.stages > 1,
            "forbid_spills": True}


def _print(k: Kernel, options: tuple[str, ...], instr: str) -> Printed:
    """Match the fold, check its instruction, print it; a printer's ValueError is a refusal."""
    name = f"online_fold {instr}"
    plan, mask = match(k, name)
    if plan.mma != instr:
        raise refuse(name, f"the products are mapped to {plan.mma}")
    wgmma = instr == "wgmma"
    if wgmma and (plan.state is not None or mask.key_tile is not None):
        raise refuse(name, "SPLIT-KV's partial fold (strided key tiles, the state m, l stored) is printed on "
                     "mma.sync only")
    if wgmma and plan.pack > 1:
        raise refuse(name, f"packed rows ({plan.pack} query heads per tile) are printed on mma.sync only")
    if mask.key_tile is not None and any(isinstance(c, Or) for c in mask.conds):
        raise refuse(name, f"a disjunctive mask over the strided key tiles {mask.key_tile} is not implemented")
    try:
        ctx = mask_context(mask, plan)
        if wgmma:  # a general score holds more registers: the overlapped schedule would spill
            ks = render_attn_wgmma(plan, ctx, options, overlap=not ctx["general_score"])
        else:
            ks = render_fold(plan, ctx, options)
    except ValueError as exc:
        raise refuse(name, str(exc)) from None
    promises = {**_promises(plan), "expect_async_copy": True} if wgmma else _promises(plan)  # TMA always copies
    variant = Variant("kernel", ks, launch_of(k, ks, ("tma_maps",) if wgmma else ()))
    return Printed(f"online_fold_{instr}", k, plan, (variant,), promises)


def _host_wgmma(printed: Printed, sizes: dict[str, int], ptrs: tuple[int, ...],
                encode: Encoder = encode_driver) -> tuple[int, bytes | None]:
    return 0, encode_attn_tensor_maps(printed.plan, sizes, *ptrs[:3], encode=encode)


def _register() -> None:
    register(Mapping("online_fold_mma_sync", "online_fold", "mma_sync", lambda k, o: _print(k, o, "mma_sync"),
                     prints_also=True))
    register(Mapping("online_fold_wgmma", "online_fold", "wgmma", lambda k, o: _print(k, o, "wgmma"), _host_wgmma,
                     prints_also=True))


_register()
