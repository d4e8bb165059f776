"""Tensor-core mapping (mma.sync) of a tile sum over score tiles: the attention backward's dV, dK
and dQ (FlashAttention-2's backward), read off the kernel IR and refused by name otherwise.

The meaning this printer implements (names are the kernel IR's own):

    stage R_t[r < BM, e < D] = [bound] ? R[.., BM*rt + r, .., e] : 0     (row tiles: 1 or more)
    for g < G carrying (acc_g = 0, acc2_g = 0, ..):                      (group loops: 0 or more)
        for it < EXT carrying (acc = 0, acc2 = 0, ..):                   (one or more sums)
            stage C_t[r < BN, e < D] = [bound] ? C[.., g, .., BN*it + r, .., e] : 0  (column tiles, shared)
            acc := acc + sum(c < BN @mma: [G] ? X_t[c, n] * A : 0)       (or A * X_t[c, n])
            acc2 := acc2 + sum(c2 < BN @mma: [G2] ? X2_t[c2, n] * A2 : 0)
        acc_g := acc_g + acc;  acc2_g := acc2_g + acc2; ..
    store Out[.., BM*rt + row, .., n] = acc_g   where [bound]
    (also Out2[.., BM*rt + row, .., n] = acc2_g where [bound]: FUSE-SUMS' further output)

where the lanes are (row @warp, n), X_t is a column tile (the accumulation's B operand, read at
[c, n]: ldmatrix .trans) and A, the accumulation's A operand, is any element-wise expression of

  - score sums  sum(e < D @mma: R_t[row, e] * C_t[c, e])  (either factor order): the score tile
    of a row tile against a column tile, computed with mma.sync in the row-lane's order — the
    tile is (rows x columns) in the accumulator layout, so it feeds the accumulation in registers
    (dV / dK take rows = keys: Sᵀ = K·Qᵀ, as FlashAttention-2 does);
  - reads of the kernel's inputs at indices of the row, the column, the tiles, the batch loops
    and the sizes (LSE[b, h, col], Dsum[b, h, row]), each guarded by its tensor's bounds;
  - constants, index values and guards ([G] and every Select: printed as C conditionals).

Several sums in one tile loop (FUSE-SUMS: dK beside dV) share the row tiles, the column ring and
every score tile: a score of the same row tile and column tile is computed once per tile and read
by every sum's A (each sum's column index is renamed to the first's); each sum has its own
accumulator, B tile and output, all stored at the one output index.  The tile range is the union
of the sums' ranges: only a zero guard every sum has narrows it.  Group loops may carry several
sums (GQA's fused dK / dV): group state k adds the tile loop's sum k.

A group loop sums the tile sum over an index that the column tiles and A may read like a batch
index and the row tiles may not (GQA's dK / dV: the query heads g of a K / V head): its sum
shares the one accumulator (acc_g + sum_it = sum over (g, it)), and each group step runs the tile
range and the column ring anew.

A transposed use (a score read at [c, row], or a row-lane read of the accumulation's B) has no
register form here and is refused by name, as is any other statement.  The tile range is the
kernel IR's extent, narrowed for the block to the tiles the zero guards of A can reach (the
iterations outside contribute 0: cexpr.first_tile_c and its upper twin end_tile_c; a disjunction
reaches the union of its parts' ranges); a warp whose rows the guards mask for a whole tile
(a disjunction: every part) skips its products.
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler.ir import Aff, Bin, Cond, Const, Expr, IndexValue, Or, Read, Reduce, Select, Un, map_children, subst_index, walk
from compiler.machine import DTYPES
from compiler.printer import show_expr

from ..kir.grid import block_index_c
from ..kir.ir import Kernel, Stage, TileLoop
from ..source import KernelSource
from .cexpr import _BINARY_C, box_extremes, conds_c, end_tile_c, ext_c, first_tile_c, float_const_c, gt_c
from .cexpr import index_value_c, read_c, size_names, unary_c
from .common import bound_cond, launch_of, operand, refuse, staged
from .ctx_common import DEFAULT_OPTIONS, ident, loop_block_var, source
from .online_fold import _roles
from .plan import Operand
from .registry import Mapping, Printed, Variant, register
from .score_sum_stages import early_terms, last_group, staged_reads

NAME = "score_sum mma_sync"


@dataclass(frozen=True)
class Tile:
    """A staged tile: its buffer, the operand it copies (roles: which dim holds its rows)."""

    buf: str
    op: Operand
    rows: int
    cols: int
    level: str
    rows_size: str  # the size its rows run over


@dataclass(frozen=True)
class Score:
    """A score tile: sum over the head dim of row tile `row` times column tile `col`."""

    sum: Reduce
    row: int  # index into ScoreSumPlan.row_tiles
    col: int  # index into ScoreSumPlan.col_tiles


@dataclass(frozen=True)
class ScoreSumPlan:
    kernel_name: str
    dtype: str
    row_tiles: tuple[Tile, ...]
    col_tiles: tuple[Tile, ...]
    acc_tiles: tuple[int, ...]  # per sum: the column tile read as its accumulation's B operand
    scores: tuple[Score, ...]
    block_m: int
    block_n: int
    head: int              # columns of every tile (the head dim)
    warps: int
    stages: int
    outs: tuple[Operand, ...]  # per sum: the tensor it is stored in (the kernel's outputs, in order)
    groups: tuple[str, ...] = ()  # the group loops around the tile loop, outermost first
    mma: str = "mma_sync"  # every product's instruction (the field every plan carries)


@dataclass(frozen=True)
class _Match:
    plan: ScoreSumPlan
    k: Kernel
    loop: TileLoop
    values: tuple[Expr, ...]  # per sum: A, its accumulation's A operand (element-wise over row and column)
    row: str               # the row lane
    col: str               # the summed column index (every sum's, renamed to the first's)
    rtile: str             # the grid loop of the row tiles
    out_roles: tuple[str, ...]
    groups: tuple[TileLoop, ...]  # the group loops, outermost first


def _group_inner(loop: TileLoop) -> TileLoop | None:
    """The tile loop that `loop` only sums (each acc := acc + the inner loop's matching sum, all
    from 0), or None."""
    if not loop.state or len(loop.body) != 1 or not isinstance(loop.body[0], TileLoop):
        return None
    inner = loop.body[0]
    if len(inner.state) != len(loop.state):
        return None
    for st, ist in zip(loop.state, inner.state):
        if st.init != Const(0.0) or st.update != Bin("+", Read(st.name, ()), Read(ist.name, ())):
            return None
    return inner


def comparisons(c: Cond | Or) -> tuple[Cond, ...]:
    """The comparisons of one conjunct of a guard: itself, or a disjunction's parts."""
    return c.parts if isinstance(c, Or) else (c,)


def _zero_guards(e: Expr) -> tuple[Cond | Or, ...]:
    """Conditions each of which, false, makes e exactly 0 (the guards of every contribution)."""
    if isinstance(e, Select) and e.other == Const(0.0):
        return e.conds + _zero_guards(e.then)
    if isinstance(e, Bin) and e.op == "*":
        return _zero_guards(e.a) + _zero_guards(e.b)
    return ()


def stage_tile(k: Kernel, st: Stage, tile_var: str, batch: set[str], name: str = NAME) -> Tile:
    """The staged rows x head-dim tile of `st` (rows BM * tile_var + r), refused under `name` otherwise."""
    conds, read = staged(st.value)
    if len(st.buf.dims) != 2:
        raise refuse(name, f"buffer {st.buf.name} is not a rows x head-dim tile")
    (r, rows), (e, cols) = st.buf.dims
    roles = _roles(read.idx, Aff.build({tile_var: rows, r: 1}), e, batch,
                   f"buffer {st.buf.name} reading {read.tensor}", name)
    op = operand(k, read.tensor, st.buf.level, name)
    op = Operand(op.name, op.dims, op.dtype, op.level, roles)
    seq = op.dims[roles.index("seq")]
    for c in conds:
        if bound_cond(c, (tile_var, rows), r) != seq:
            raise refuse(name, f"buffer {st.buf.name}'s condition {c} is not the row bound < {seq}")
    if k.fixed().get(op.dims[-1]) != cols:
        raise refuse(name, f"buffer {st.buf.name} holds {cols} of {read.tensor}'s head dim {op.dims[-1]}, not all of it")
    return Tile(st.buf.name, op, rows, cols, st.buf.level, seq)


def _split_product(body: Expr, c: str, n: str, col_tiles: dict[str, int], name: str = NAME) -> tuple[int, Expr]:
    """(the column tile read at [c, n], the other factor A) of the accumulation's product."""
    conds: tuple[Cond, ...] = ()
    if isinstance(body, Select) and body.other == Const(0.0):
        conds, body = body.conds, body.then
    if not (isinstance(body, Bin) and body.op == "*"):
        raise refuse(name, f"the accumulated value {show_expr(body)} is not a product with a staged tile")
    want = (Aff.of(c), Aff.of(n))
    for x, other in ((body.a, body.b), (body.b, body.a)):
        if isinstance(x, Read) and x.tensor in col_tiles and x.idx == want:
            return col_tiles[x.tensor], (Select(conds, other, Const(0.0)) if conds else other)
    raise refuse(name, f"neither factor of {show_expr(body)} reads a column tile at [{c}, {n}] "
                 "(the accumulation's B operand in its natural order)")


def _tile_sums(loop: TileLoop, instr: str = "mma_sync", name: str = NAME) -> tuple[Reduce, ...]:
    """The tensor-core tile sum each state of the tile loop adds (acc := acc + sum(...), from 0)."""
    if not loop.state:
        raise refuse(name, "the tile loop carries no sum")
    out = []
    for st in loop.state:
        upd = st.update
        if st.init != Const(0.0):
            raise refuse(name, f"the sum {st.name} of the tile loop does not start at 0")
        if not (isinstance(upd, Bin) and upd.op == "+" and upd.a == Read(st.name, ()) and isinstance(upd.b, Reduce)
                and upd.b.op == "sum" and upd.b.mma is not None):
            raise refuse(name, f"the update of {st.name} is not {st.name} + a tensor-core tile sum")
        if upd.b.mma.instr != instr:
            raise refuse(name, f"the tile sum is mapped to {upd.b.mma.instr}")
        out.append(upd.b)
    return tuple(out)


def _common_guards(values: tuple[Expr, ...]) -> tuple[Cond | Or, ...]:
    """The zero guards every value has (each, false, makes every sum's contribution 0)."""
    first = _zero_guards(values[0])
    return tuple(g for g in first if all(g in _zero_guards(v) for v in values[1:]))


def match(k: Kernel, instr: str = "mma_sync", name: str = NAME) -> _Match:
    """The plan of a tile sum over score tiles whose tensor-core sums are mapped to `instr`, refused
    under the printer's `name` otherwise (the meaning is the same for every instruction)."""
    if not k.body or not isinstance(k.body[-1], TileLoop):
        raise refuse(name, "the kernel is not [stage row tiles; one tile loop] (a tile sum)")
    loop = k.body[-1]
    pre = k.body[:-1]
    groups: list[TileLoop] = []
    while (inner := _group_inner(loop)) is not None:
        groups.append(loop)
        loop = inner
    group_vars = {g.var for g in groups}
    if not pre or not all(isinstance(s, Stage) for s in pre):
        raise refuse(name, "the kernel is not [stage row tiles; one tile loop] (a tile sum)")
    sums = _tile_sums(loop, instr, name)
    totals = tuple(st.name for st in (groups[0] if groups else loop).state)
    if not all(isinstance(s, Stage) and s.buf.level == "shared" for s in loop.body):
        raise refuse(name, "the tile loop's body must only stage column tiles in shared memory")
    if len(k.lanes) != 2:
        raise refuse(name, "the output tile must be rows x head-dim lanes")
    row, n = k.lanes[0].var, k.lanes[1].var
    rl = k.lanes[0]
    warps = rl.mapping.count if rl.mapping and rl.mapping.level == "warp" and rl.mapping.count else 1
    if len(k.stores) != len(totals) or any(st.value != Read(t, ()) for st, t in zip(k.stores, totals)):
        raise refuse(name, f"the stored values are not the sums {', '.join(totals)}, one per output in order")
    if any(st.index != k.store.index or st.guard != k.store.guard for st in k.also):
        raise refuse(name, "a further output is stored at another index or under other guards than the output")
    grid_vars = {g.var for g in k.grid}
    sidx = k.store.index
    rows_at = [p for p, a in enumerate(sidx) if a.coef(row) != 0]
    if len(rows_at) != 1:
        raise refuse(name, f"the output index does not hold the row lane {row} at one position")
    rest = sidx[rows_at[0]] - Aff.of(row)
    if sidx[rows_at[0]].coef(row) != 1 or rest.const or len(rest.terms) != 1 or rest.terms[0][0] not in grid_vars:
        raise refuse(name, f"the output row index {sidx[rows_at[0]]} is not BM * row tile + {row}")
    rtile, bm = rest.terms[0]
    batch = grid_vars - {rtile}
    out_roles = _roles(sidx, Aff.build({rtile: bm, row: 1}), n, batch, f"output {k.output.name}", name)
    outs = []
    for st in k.stores:
        o = operand(k, st.tensor, "global", name)
        outs.append(Operand(o.name, o.dims, o.dtype, o.level, out_roles))
    row_tiles = tuple(stage_tile(k, s, rtile, batch, name) for s in pre)
    col_tiles = tuple(stage_tile(k, s, loop.var, batch | group_vars, name) for s in loop.body)
    bn = sums[0].ext.const_value()
    if any(t.rows != bm for t in row_tiles) or any(t.rows != bn for t in col_tiles) \
            or any(x.ext != sums[0].ext for x in sums):
        raise refuse(name, f"row tiles must have {bm} rows and column tiles {bn}")
    heads = {t.cols for t in row_tiles + col_tiles}
    if len(heads) != 1 or k.lanes[1].extent != next(iter(heads)) or k.lanes[0].extent != bm:
        raise refuse(name, f"every tile and the output tile must be {bm} x one head dim ({sorted(heads)})")
    head = heads.pop()
    col_index = {t.buf: i for i, t in enumerate(col_tiles)}
    row_index = {t.buf: i for i, t in enumerate(row_tiles)}
    c = sums[0].var
    acc_tiles, values, scores = [], [], []
    for x in sums:
        acc_tile, value = _split_product(x.body, x.var, n, col_index, name)
        value = subst_index(value, x.var, Aff.of(c)) if x.var != c else value
        acc_tiles.append(acc_tile)
        values.append(value)
        for sc in score_sums(value, row, c, row_index, col_index, head, k, name, instr):
            if all((o.row, o.col) != (sc.row, sc.col) for o in scores):
                scores.append(sc)  # one score tile per (row tile, column tile): computed once
        check_elementwise(value, k, {row, c, rtile, loop.var} | batch | group_vars | set(dict(k.sizes)), n, name)
    for cc in k.store.guard:
        if bound_cond(cc, (rtile, bm), row) != outs[0].dims[out_roles.index("seq")]:
            raise refuse(name, f"store condition {cc} is not the row tail bound")
    dtypes = {t.op.dtype for t in row_tiles + col_tiles}
    if len(dtypes) != 1 or not DTYPES[next(iter(dtypes))].mma_operand:
        raise refuse(name, f"the tiles must share one f16 / bf16 dtype, found {sorted(dtypes)}")
    if not loop.ext.names() <= set(dict(k.sizes)) | {rtile} | batch | group_vars:
        raise refuse(name, f"the tile range {loop.var} < {loop.ext} depends on more than sizes, the block and the group loops")
    for pos, g in enumerate(groups):
        if not g.ext.names() <= set(dict(k.sizes)) | {rtile} | batch | {x.var for x in groups[:pos]}:
            raise refuse(name, f"the group loop {g.var} < {g.ext} depends on more than sizes, the block and outer group loops")
    stages = max(s.buf.stages for s in loop.body)
    plan = ScoreSumPlan(k.name, dtypes.pop(), row_tiles, col_tiles, tuple(acc_tiles), tuple(scores), bm, bn, head,
                        warps, stages, tuple(outs), tuple(g.var for g in groups), instr)
    return _Match(plan, k, loop, tuple(values), row, c, rtile, out_roles, tuple(groups))


def score_sums(value: Expr, row: str, c: str, row_index: dict[str, int], col_index: dict[str, int],
               head: int, k: Kernel, name: str = NAME, instr: str = "mma_sync") -> tuple[Score, ...]:
    """The score sums of `value`: each a row tile at [row, e] times a column tile at [c, e]."""
    out: list[Score] = []
    for x in walk(value):
        if not isinstance(x, Reduce):
            continue
        if x.op != "sum" or x.mma is None or x.mma.instr != instr:
            raise refuse(name, f"the reduction {show_expr(x)} in the accumulated value is not a tensor-core score sum")
        if not x.ext.names() <= set(k.fixed()) or x.ext.evaluate(k.fixed()) != head:
            raise refuse(name, f"the score sums {x.var} < {x.ext}, not the whole head dimension {head}")
        b = x.body
        e = Aff.of(x.var)
        found = None
        if isinstance(b, Bin) and b.op == "*" and isinstance(b.a, Read) and isinstance(b.b, Read):
            for r, q in ((b.a, b.b), (b.b, b.a)):
                if (r.tensor in row_index and r.idx == (Aff.of(row), e)
                        and q.tensor in col_index and q.idx == (Aff.of(c), e)):
                    found = Score(x, row_index[r.tensor], col_index[q.tensor])
        if found is None:
            raise refuse(name, f"the score {show_expr(x)} is not a row tile at [{row}, {x.var}] times a column tile "
                         f"at [{c}, {x.var}] (a transposed score has no register form here)")
        if all(s.sum != x for s in out):
            out.append(found)
    if not out:
        raise refuse(name, "the accumulated value holds no tensor-core score sum")
    return tuple(out)


def check_elementwise(value: Expr, k: Kernel, allowed: set[str], n: str | None, name: str = NAME) -> None:
    """Refuse (under `name`) what the element-wise printer has no form for; n: the output column A must not read."""
    inputs = {t.name for t in k.inputs}
    scores = {id(y) for x in walk(value) if isinstance(x, Reduce) for y in walk(x.body)}
    for x in walk(value):
        if id(x) in scores:
            continue
        if not isinstance(x, (Const, Read, IndexValue, Bin, Un, Select, Reduce)):
            raise refuse(name, f"{type(x).__name__} in the accumulated value has no element-wise form")
        if isinstance(x, Bin) and x.op not in _BINARY_C and x.op not in ("max", "gt"):
            raise refuse(name, f"operator {x.op} in the accumulated value has no element-wise form")
        if isinstance(x, Read) and x.tensor not in inputs:
            raise refuse(name, f"the accumulated value reads {x.tensor} outside a score: only kernel inputs")
        affs = x.idx if isinstance(x, Read) else (x.aff,) if isinstance(x, IndexValue) else ()
        if isinstance(x, Select):  # a disjunction prints as one parenthesised C || (cexpr.cond_c)
            affs = tuple(a for cc in x.conds for part in comparisons(cc) for a in (part.lhs, part.rhs))
        for a in affs:
            if n is not None and n in a.names():
                raise refuse(name, f"the accumulated value depends on the output column {n}: it is no A operand")
            if not a.names() <= allowed:
                raise refuse(name, f"the accumulated value uses {sorted(a.names() - allowed)}: only the row, the "
                             "column, the tiles, batch indices and sizes")


LOG2E = 1.4426950408889634


def element_value_c(k: Kernel, value: Expr, names: dict[str, str], score_of: dict[Expr, str],
                    fast_exp: bool = False) -> str:
    """C expression of the element-wise value at one fragment element: score sums as the fragment
    registers `score_of` names, reads of inputs with their bounds guards, `names` the C names of
    the kernel IR's index variables (shared by the tile-sum and the store forms).  fast_exp: exp(x)
    as ex2.approx.ftz(log2(e) x), the forward's exponential (relative error about 2^-22), not expf."""
    ptr = {t.name: f"p_{ident(t.name)}" for t in k.tensors}

    def read(r: Read) -> str:
        t = k.tensor(r.tensor)
        return read_c(t.dims, r.idx, ptr[r.tensor], f"{t.dtype}_to_f32", names)

    def val(e: Expr) -> str:
        if e in score_of:  # a score sum's register, or a term the caller computed once (common_terms)
            return score_of[e]
        if isinstance(e, Select):
            return f"({conds_c(e.conds, names)} ? {val(e.then)} : {val(e.other)})"
        if isinstance(e, Const):
            return float_const_c(float(e.value))
        if isinstance(e, Read):
            return read(e)
        if isinstance(e, IndexValue):
            return index_value_c(e.aff, names)
        if isinstance(e, Bin):
            a, b = val(e.a), val(e.b)
            if e.op == "max":
                return f"fmaxf({a}, {b})"
            if e.op == "gt":
                return gt_c(a, b)
            return f"({a} {_BINARY_C[e.op]} {b})"
        if isinstance(e, Un):
            if fast_exp and e.op == "exp":
                return f"fast_exp2({float_const_c(LOG2E)} * {val(e.a)})"
            return unary_c(e.op, val(e.a))
        raise ValueError(f"{type(e).__name__} has no element-wise form")

    return val(value)


def stride_c(op: Operand, pos: int, fixed: dict[str, int]) -> str:
    lit, names = 1, []
    for d in op.dims[pos + 1:]:
        if d in fixed:
            lit *= fixed[d]
        else:
            names.append(f"sz_{d}")
    return str(lit) if not names else "(long long)" + " * ".join(names + ([str(lit)] if lit != 1 else []))


def base_c(op: Operand, fixed: dict[str, int], tile: str) -> str:
    """C pointer expression: the operand's batch offset plus `tile` rows."""
    terms = [f"{loop_block_var(r)} * {stride_c(op, i, fixed)}" for i, r in enumerate(op.roles) if r not in ("seq", "head")]
    terms.append(f"(long long)({tile}) * {stride_c(op, op.roles.index('seq'), fixed)}")
    return " + ".join(terms)



def kernel_params_c(k: Kernel, ptr: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    """The kernel's C parameter list in the kernel IR's tensor order (outputs writable), then
    the dynamic sizes; and the argument names the runtime passes in that order."""
    params, names = [], []
    for t in k.tensors:
        ct = DTYPES[t.dtype].ctype
        params.append(f"{ct}* __restrict__ {ptr[t.name]}" if t.output else f"const {ct}* __restrict__ {ptr[t.name]}")
        names.append(t.name)
    for d in k.dynamic():
        params.append(f"int sz_{d}")
        names.append(d)
    return ", ".join(params), tuple(names)

def _one_score_per_tile(e: Expr, first: dict[Reduce, Reduce]) -> Expr:
    """e with each score sum replaced by the first sum of its (row tile, column tile): the sums of
    one score tile (dV's over e6, dK's over e5) then read alike."""
    if isinstance(e, Reduce):
        return first.get(e, e)
    return map_children(e, lambda x: _one_score_per_tile(x, first))


def common_terms(values: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """The largest sub-expressions holding a score sum that several values hold (dV's P = exp(S - LSE)
    inside dK's dS): a printer may compute each once per element (each value reads it as it is)."""
    if len(values) < 2:
        return ()
    holding = [{x for x in walk(v) if any(isinstance(y, Reduce) for y in walk(x))} for v in values]
    shared = {x for x in holding[0] if sum(x in h for h in holding) > 1}
    inner = {y for x in shared for y in walk(x) if y is not x and y != x}
    return tuple(sorted((x for x in shared if x not in inner and not isinstance(x, Reduce)), key=show_expr))


def shared_context(m: _Match, score_ref: str, skip_rows: int, skip_unit: str, common: bool = False,
                   fast_exp: bool = False, staged_terms: str | None = None,
                   staged_reads_at: dict[str, str] | None = None) -> dict:
    """The template context every instruction's printer of the plan shares: pointers, the tile
    range, the element-wise values (a score element is `score_ref` formatted with the score's
    number, C names nt and e in the accumulator layout), the stores; the block skips a tile for
    the `skip_rows` rows of its unit (`skip_unit`: the C index of the warp / warpgroup) when the
    guards keep nothing of it there.  With `common`, the common_terms of the values are printed
    once (`terms`, read by the values as cs<i>); with `fast_exp`, exp is printed as the forward's
    ex2.approx (element_value_c).  With `staged_terms` (a C format of a term's element, e.g.
    "cs{}[kk][j][h]"), the early_terms join them, the values read each term there, and the context
    gives each term's and each value's last score tile (term_groups, acc_groups): a printer that
    waits for the score tiles one by one computes each as soon as it can.  With `staged_reads_at`
    (C formats of a row's and a column's loaded element, {"row": "rr{}[e >> 1]", ...}), the reads
    indexed by the row or the column only are read there (`reads`: axis, first group, load)."""
    p, k = m.plan, m.k
    fixed = k.fixed()
    sizes = size_names(k.sizes)
    bidx = block_index_c([(g.var, ext_c(g.ext, sizes), g.axis) for g in k.grid])
    batch = {g.var: loop_block_var(g.var) for g in k.grid if g.var != m.rtile}
    ptr = {t.name: f"p_{ident(t.name)}" for t in k.tensors}
    elem = DTYPES[p.dtype].bytes
    group = {g.var: loop_block_var(g.var) for g in m.groups}
    names = {**sizes, **batch, **group, m.rtile: "rt", m.loop.var: "it", m.row: "er_", m.col: "ec_"}
    keys = [(s.row, s.col) for s in p.scores]
    row_index = {t.buf: i for i, t in enumerate(p.row_tiles)}
    col_index = {t.buf: i for i, t in enumerate(p.col_tiles)}
    # every sum's score sums read the one tile of their (row tile, column tile)
    scores = [sc for v in m.values for sc in score_sums(v, m.row, m.col, row_index, col_index, p.head, k, instr=p.mma)]
    score_of = {sc.sum: score_ref.format(keys.index((sc.row, sc.col))) for sc in scores}
    values = m.values
    if common:
        first: dict[tuple[int, int], Reduce] = {}
        for sc in scores:
            first.setdefault((sc.row, sc.col), sc.sum)
        values = tuple(_one_score_per_tile(v, {sc.sum: first[(sc.row, sc.col)] for sc in scores}) for v in values)

    # the zero guards over the tile index; a disjunction (prefix-LM's j <= i || j < Prefix) narrows
    # the range to the union of its parts' ranges, and a unit is empty where every part is
    guards = tuple(c for c in _common_guards(m.values) if m.loop.var in c.names())
    blk = {**sizes, **batch, **group, m.rtile: "rt"}
    box = {m.row: ("0", str(p.block_m - 1)), m.col: ("0", str(p.block_n - 1))}
    begin = first_tile_c(guards, m.loop.var, box, blk)
    end = f"(long long)({ext_c(m.loop.ext, blk)})"
    upper = end_tile_c(guards, m.loop.var, box, blk)
    if upper is not None:
        end = f"min({end}, {upper})"
    # the tile range grows with the row tile (causal dQ): heaviest row tiles first, fewer idle SMs at the end
    grows = any((c.rhs - c.lhs).coef(m.loop.var) < 0 and (c.rhs - c.lhs).coef(m.rtile) > 0
                for g in guards for c in comparisons(g))
    rdim = next(g for g in k.grid if g.var == m.rtile)
    rtile_expr = f"(int)({ext_c(rdim.ext, sizes)} - 1 - {bidx[m.rtile]})" if grows else f"(int){bidx[m.rtile]}"
    unit_box = {m.row: (f"({skip_unit} * {skip_rows})", f"({skip_unit} * {skip_rows} + {skip_rows - 1})"),
                m.col: ("0", str(p.block_n - 1))}
    wnames = {**blk, m.loop.var: "it"}
    empty = " || ".join(box_extremes(c, unit_box, wnames)[1] for c in guards) if guards else None
    params, arg_names = kernel_params_c(k, ptr)
    out_seq = p.outs[0].dims[p.outs[0].roles.index("seq")]
    terms = common_terms(values) if common else ()
    score_group = {sc.sum: keys.index((sc.row, sc.col)) for sc in scores}
    if staged_terms is not None:
        terms = tuple(sorted(set(terms) | set(early_terms(values, score_group)), key=show_expr))
    named = {t: (staged_terms or "cs{}").format(i) for i, t in enumerate(terms)}
    term_groups = [max(last_group(t, score_group), 0) for t in terms]
    acc_groups = [max(last_group(v, score_group), 0) for v in values]
    reads = staged_reads(terms + values, tuple(term_groups + acc_groups), m.row, m.col, m.loop.var) if staged_reads_at else ()
    loaded = {r.read: staged_reads_at[r.axis].format(i) for i, r in enumerate(reads)}
    exp_kw = {"fast_exp": True} if fast_exp else {}
    return dict(
        kname=ident(k.name), dt=p.dtype, ct=p.dtype + "_t", elem=elem, vec=16 // elem,
        D=p.head, BM=p.block_m, BN=p.block_n, stages=p.stages,
        params=params, _arg_names=arg_names,
        batch_decls=[f"const long long {v} = {bidx[g]};" for g, v in batch.items()],
        groups=[dict(var=group[g.var], ext=f"(long long)({ext_c(g.ext, {**blk, **group})})") for g in m.groups],
        # the tile range read from the group indices (else computed once, before the group loops)
        range_per_group=bool((m.loop.ext.names() | {n for c in guards for n in c.names()}) & set(group)),
        rtile_expr=rtile_expr,
        row_tiles=[dict(ptr=ptr[t.op.name], base=base_c(t.op, fixed, "rt * %d" % p.block_m), register=t.level == "register",
                        lim=sizes[t.rows_size] + " - rt * %d" % p.block_m) for t in p.row_tiles],
        col_tiles=[dict(ptr=ptr[t.op.name], base=base_c(t.op, fixed, "0"), step=stride_c(t.op, t.op.roles.index("seq"), fixed),
                        lim=sizes[t.rows_size]) for t in p.col_tiles],
        row_lds=[stride_c(t.op, t.op.roles.index("seq"), fixed) for t in p.row_tiles],
        scores=[dict(row=s.row, col=s.col) for s in p.scores],
        terms=[element_value_c(k, t, names, {**score_of, **loaded}, **exp_kw) for t in terms],
        term_groups=term_groups, acc_groups=acc_groups,
        reads=[dict(axis=r.axis, first=r.first, invariant=r.invariant, load=element_value_c(k, r.read, names, {})) for r in reads],
        accs=[dict(tile=t, value=element_value_c(k, v, names, {**score_of, **named, **loaded}, **exp_kw), out_dt=o.dtype, out_name=o.name,
                   out_ptr=ptr[o.name], out_base=base_c(o, fixed, "rt * %d" % p.block_m),
                   out_ld=stride_c(o, o.roles.index("seq"), fixed))
              for t, v, o in zip(p.acc_tiles, values, p.outs)],
        begin_expr=begin, end_expr=end, unit_empty=empty, out_lim=f"{sizes[out_seq]} - rt * {p.block_m}",
    )


def context(m: _Match) -> dict:
    p = m.plan
    elem = DTYPES[p.dtype].bytes
    threads = p.warps * 32
    rows_w = p.block_m // p.warps
    if rows_w * p.warps != p.block_m or rows_w % 16 or p.block_n % 16 or p.head % 16:
        raise ValueError(f"rows per warp {p.block_m}/{p.warps}, column tile {p.block_n} and head dim {p.head} "
                         "must be multiples of 16")
    tile_bytes_r = p.block_m * p.head * elem
    tile_bytes_c = p.block_n * p.head * elem
    row_smem = len(p.row_tiles) * tile_bytes_r
    col_smem = p.stages * len(p.col_tiles) * tile_bytes_c
    return dict(
        shared_context(m, "sc{}[mi][nt][e]", rows_w, "warp"),
        threads=threads, ROWS_W=rows_w, MI=rows_w // 16, NT=p.block_n // 8,
        KD=p.head // 16, KT2=p.block_n // 16, DT=p.head // 8, swizzle=True,
        smem_bytes=row_smem + col_smem, col_smem_off=row_smem, tile_bytes_r=tile_bytes_r, tile_bytes_c=tile_bytes_c,
        summary=(f"mma.sync tile sum {p.block_m}x{p.block_n} d{p.head}, warps {p.warps}, stages {p.stages}, "
                 f"{len(p.acc_tiles)} sum(s), {len(p.scores)} score tile(s), row tiles {len(p.row_tiles)}, column tiles {len(p.col_tiles)}"
                 + (f", summed over {', '.join(p.groups)}" if p.groups else "")),
    )


def render(k: Kernel, options: tuple[str, ...] = DEFAULT_OPTIONS) -> Printed:
    m = match(k)
    try:
        ks: KernelSource = source("score_sum.cu.j2", context(m), options)
    except ValueError as exc:
        raise refuse(NAME, str(exc)) from None
    promises = {"expect_mma": "mma_sync", "expect_async_copy": True, "forbid_spills": True}
    return Printed("score_sum_mma_sync", k, m.plan, (Variant("kernel", ks, launch_of(k, ks)),), promises)


register(Mapping("score_sum_mma_sync", "score_sum", "mma_sync", lambda k, o: render(k, o), prints_also=True))
