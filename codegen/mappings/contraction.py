"""Tensor-core contraction mappings (mma.sync, wgmma): read a ContractionPlan off the kernel IR.

The meaning these printers implement, with every part taken from the kernel IR:

    for ko < ceil(K / BK) carrying (acc = 0 @f32):
        stage A_s[r < BM, c < BK] = [bounds] ? A[batch.., BM*io + r, BK*ko + c] : 0
              (or A_s[r < BK, c < BM] = [bounds] ? A[batch.., BK*ko + r, BM*io + c] : 0)
        stage B_s[r < BK, c < BN] = [bounds] ? B[batch.., BK*ko + r, BN*jo + c] : 0
              (or B_s[r < BN, c < BK] = [bounds] ? B[batch.., BN*jo + r, BK*ko + c] : 0)
        acc := acc + sum(ki < BK @mma: [conds] ? A_s[ii, ki] * B_s[ki, ji] : 0)
              (A_s read [ki, ii] when staged [k, m], B_s read [ji, ki] when staged [n, k])
    [compute x = f(acc, ...) ...]           (register scalars: FUSE's binding of a producer)
    store C[batch.., BM*io + ii, BN*jo + ji] = epilogue(acc, x, reads)   where [bounds]

`bounds` are tile tails (`BM*io + r < M`, ...), zero-filled by the copies and guarded at the
store; an inner condition is accepted only when it is one of the operands' zero-fill bounds at
the read position (so dropping it changes nothing).  Anything else — a mask inside the sum, an
epilogue the printer cannot print (codegen.mappings.epilogue), a skipped tile range — is
refused by name; the SIMT mapping prints any kernel IR.  The epilogue is printed from the kernel
IR's stored value (codegen.mappings.epilogue), with bound guards on its reads.
"""
from __future__ import annotations

from compiler.ir import Aff, Bin, Const, Expr, Ext, Read, Reduce, Select

from .ctx_common import ident
from .epilogue import plan_epilogue, scalar_bindings
from ..kir.ir import Kernel, Stage, TileLoop
from .plan import ContractionPlan, KSplit, Operand
from .render import render_contraction
from .render_wgmma import encode_tensor_maps, render_wgmma, tma_supported
from ..cuda.tma import Encoder, encode_driver
from .registry import Mapping, Printed, Variant, register
from .common import bound_cond, grid_axes, launch_of, operand, refuse, size_name, staged, tile_coord


def _product(e: Expr, mapping: str) -> tuple[tuple, Read, Read, Reduce]:
    if not isinstance(e, Reduce) or e.op != "sum":
        raise refuse(mapping, f"the accumulator update adds {type(e).__name__}, not a tile sum")
    body = e.body
    conds: tuple = ()
    if isinstance(body, Select) and body.other == Const(0.0):
        conds, body = body.conds, body.then
    if not (isinstance(body, Bin) and body.op == "*" and isinstance(body.a, Read) and isinstance(body.b, Read)):
        raise refuse(mapping, "the tile sum is not a product of two staged tiles")
    return conds, body.a, body.b, e


def match(k: Kernel, mapping: str) -> ContractionPlan:
    """The contraction plan of k, or UnsupportedMapping naming what the mapping cannot print."""
    if not k.body or not isinstance(k.body[0], TileLoop):
        raise refuse(mapping, "the kernel is not one tile loop over k (a contraction)")
    bindings = scalar_bindings(k, mapping)
    loop: TileLoop = k.body[0]
    if len(loop.state) != 1:
        raise refuse(mapping, f"the tile loop carries {len(loop.state)} states, a contraction one accumulator")
    acc = loop.state[0]
    if acc.init != Const(0.0):
        raise refuse(mapping, f"accumulator {acc.name} starts at {acc.init}, not 0")
    if acc.acc is not None and acc.acc.dtype != "f32":
        raise refuse(mapping, f"accumulator {acc.name} is {acc.acc.dtype}; tensor cores accumulate in f32")
    upd = acc.update
    if not (isinstance(upd, Bin) and upd.op == "+" and upd.a == Read(acc.name, ())):
        raise refuse(mapping, f"accumulator update {acc.name} := ... is not {acc.name} + (tile product)")
    inner_conds, ra, rb, red = _product(upd.b, mapping)
    if red.mma is None:
        raise refuse(mapping, "the tile product has no MAP-MMA fact")
    stages = {s.buf.name: s for s in loop.body if isinstance(s, Stage)}
    if len(stages) != len(loop.body) or len(stages) != 2:
        raise refuse(mapping, "the tile loop must stage exactly the two operand tiles and nothing else")
    out = k.output
    sidx = k.store.index
    if len(sidx) < 2 or len(k.lanes) != 2:
        raise refuse(mapping, "the output tile must be 2-D (rows x cols lanes)")
    lane_r, lane_c = k.lanes[0].var, k.lanes[1].var
    grid_vars = {g.var for g in k.grid}
    g_m, bm = tile_coord(sidx[-2], grid_vars, lane_r, mapping, "output rows")
    g_n, bn = tile_coord(sidx[-1], grid_vars, lane_c, mapping, "output cols")
    if (k.lanes[0].extent, k.lanes[1].extent) != (bm, bn):
        raise refuse(mapping, f"the output tile is {k.lanes[0].extent} x {k.lanes[1].extent}, not {bm} x {bn}")
    batch = {pos: a.terms[0][0] for pos, a in enumerate(sidx[:-2])
             if len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const and a.terms[0][0] in grid_vars}
    if len(batch) != len(sidx) - 2:
        raise refuse(mapping, f"output batch indices {list(map(str, sidx[:-2]))} are not block indices")
    kv = red.var
    split = _k_split(k, sidx, grid_vars, mapping)
    # operand roles and layouts from the index structure of the product: A read [row, k] (stored
    # [m, k]) or [k, row] (stored [k, m]); B read [k, col] (stored [k, n]) or [col, k] (stored [n, k])
    a_orient = {(Aff.of(lane_r), Aff.of(kv)): False, (Aff.of(kv), Aff.of(lane_r)): True}
    b_orient = {(Aff.of(kv), Aff.of(lane_c)): False, (Aff.of(lane_c), Aff.of(kv)): True}
    roles = [(x, y) for x, y in ((ra, rb), (rb, ra)) if x.idx in a_orient and y.idx in b_orient]
    if not roles:
        raise refuse(mapping, f"the tile product {ra.tensor}[{', '.join(map(str, ra.idx))}] * "
                     f"{rb.tensor}[{', '.join(map(str, rb.idx))}] is not A[{lane_r}, {kv}] or A[{kv}, {lane_r}] "
                     f"times B[{kv}, {lane_c}] or B[{lane_c}, {kv}]")
    ra_, rb_ = roles[0]
    a_transposed, b_transposed = a_orient[ra_.idx], b_orient[rb_.idx]
    if ra_.tensor not in stages or rb_.tensor not in stages:
        raise refuse(mapping, "both factors must be staged tiles (CACHE them)")
    sa, sb = stages[ra_.tensor], stages[rb_.tensor]
    ga, a_read = staged(sa.value)[0], staged(sa.value)[1]
    gb, b_read = staged(sb.value)[0], staged(sb.value)[1]
    a_op = operand(k, a_read.tensor, sa.buf.level, mapping)
    b_op = operand(k, b_read.tensor, sb.buf.level, mapping)
    c_op = _output_operand(k, out.name, split, mapping)
    m, n = c_op.dims[-2], c_op.dims[-1]
    kdim = a_op.dims[-2] if a_transposed else a_op.dims[-1]
    # A tile: row-major [BM, BK] over [.., M, K], or [BK, BM] over [.., K, M]
    (ar, e0), (ac, e1) = sa.buf.dims
    _check_batch(a_read, batch, mapping)
    bk = e0 if a_transposed else e1
    # the k tile's first position: BK·ko, or BK·(S·ko + ks) for split ks of S (SPLIT-K)
    kbase = Aff.build({loop.var: bk * split.splits, split.loop: bk}) if split else Aff.of(loop.var, bk)
    if not a_transposed:
        want_a, bm_a = (Aff.build({g_m: bm, ar: 1}), kbase + Aff.of(ac)), e0
        tiles_a = {ar: (g_m, bm), ac: kbase}
    else:
        want_a, bm_a = (kbase + Aff.of(ar), Aff.build({g_m: bm, ac: 1})), e1
        tiles_a = {ar: kbase, ac: (g_m, bm)}
    if (a_read.idx[-2], a_read.idx[-1]) != want_a:
        raise refuse(mapping, f"A tile {sa.buf.name} reads {a_read.tensor}[{', '.join(map(str, a_read.idx))}], "
                     f"not a row-major [{m}, {kdim}] or [{kdim}, {m}] tile")
    if bm_a != bm:
        raise refuse(mapping, f"A tile has {bm_a} rows, the output tile {bm}")
    _check_batch(b_read, batch, mapping)
    (br, e0), (bc, e1) = sb.buf.dims
    if not b_transposed:
        want = (kbase + Aff.of(br), Aff.build({g_n: bn, bc: 1}))
        shape_ok = (e0, e1) == (bk, bn)
    else:
        want = (Aff.build({g_n: bn, br: 1}), kbase + Aff.of(bc))
        shape_ok = (e0, e1) == (bn, bk)
    if (b_read.idx[-2], b_read.idx[-1]) != want or not shape_ok:
        raise refuse(mapping, f"B tile {sb.buf.name} reads {b_read.tensor}[{', '.join(map(str, b_read.idx))}], "
                     "not a row-major [k, n] or [n, k] tile")
    if red.ext.const_value() != bk:
        raise refuse(mapping, f"the tile sum runs over {red.ext}, the staged k tile has {bk}")
    if (a_op.dims[-2:] != ((kdim, m) if a_transposed else (m, kdim))
            or b_op.dims[-2:] != ((n, kdim) if b_transposed else (kdim, n))):
        raise refuse(mapping, f"operand shapes {a_op.dims} x {b_op.dims} -> {c_op.dims} are not a matrix product")
    fixed = k.fixed()
    ks_tiles = {Ext.of(kdim, bk)} | ({Ext.of(fixed[kdim], bk)} if kdim in fixed else set())
    if split:  # split ks adds the tiles S·ko + ks < ceil(K / BK): ko < ceil((K − BK·ks) / (BK·S))
        ks_tiles = {Ext(((e.parts[0][0] - Aff.of(split.loop, bk), bk * split.splits),)) for e in ks_tiles}
    if loop.ext not in ks_tiles:
        what = f"split {split.loop}'s tiles of {split.splits}" if split else "every tile"
        raise refuse(mapping, f"the k loop runs {loop.var} < {loop.ext}, not over {what} of {kdim}")
    # guards: every condition is a tile tail bound this mapping zero-fills or guards
    guarded: set[str] = set()
    tiles_b = {br: (kbase if not b_transposed else (g_n, bn)), bc: ((g_n, bn) if not b_transposed else kbase)}
    for conds, tiles, who in ((ga, tiles_a, sa.buf.name), (gb, tiles_b, sb.buf.name)):
        for c in conds:
            hit = [bound_cond(c, vt, local) for local, vt in tiles.items()]
            names = [h for h in hit if h]
            if len(names) != 1 or names[0] not in (m, n, kdim):
                raise refuse(mapping, f"buffer {who}'s condition {c} is not a tile tail bound")
            guarded.add(names[0])
    for c in k.store.guard:
        hit = [bound_cond(c, (g_m, bm), lane_r), bound_cond(c, (g_n, bn), lane_c)]
        if hit[0] == m:
            guarded.add(m)
        elif hit[1] == n:
            guarded.add(n)
        else:
            raise refuse(mapping, f"store condition {c} is not an output tile bound")
    implied = {c2 for c2 in _at_read(ga, sa.buf, ra_) | _at_read(gb, sb.buf, rb_)}
    for c in inner_conds:
        if c not in implied:
            raise refuse(mapping, f"the tile sum's condition {c} is not implied by the operands' zero fill "
                         "(this mapping computes the unmasked product; the SIMT mapping prints the mask)")
    for size, tile in ((m, bm), (n, bn), (kdim, bk)):  # a tile that can cross its bound is zero-filled
        if size not in fixed or fixed[size] % tile:    # (values there are never used: validated)
            guarded.add(size)
    if split:  # a split past the last tile still runs one (zero-filled) tile: it writes zeros
        guarded.add(kdim)
    lane_map = {ln.var: ln for ln in k.lanes}
    warps = {v: (ln.mapping.count or 1) if ln.mapping and ln.mapping.level == "warp" else 1 for v, ln in lane_map.items()}
    tiles = {g_m: (m, bm), g_n: (n, bn)}
    for pos, g in batch.items():
        tiles[g] = (c_op.dims[pos], 1)
    if a_read.tensor == b_read.tensor:
        raise refuse(mapping, f"both factors stage {a_read.tensor}: the kernel takes one pointer per tensor")
    names = {**size_names_c(k), lane_r: "er_", lane_c: "ec_", g_m: "tm", g_n: "tn"}
    for pos, g in batch.items():
        names[g] = f"bi_{ident(c_op.dims[pos])}"
    pointers = {t.name: f"p_e_{ident(t.name)}" for t in k.inputs}
    pointers.update({a_read.tensor: "p_a", b_read.tensor: "p_b"})
    epi = plan_epilogue(k, acc.name, names, pointers, bindings, mapping)
    sizes_used = set(a_op.dims) | set(b_op.dims) | set(c_op.dims)
    for t in (epi.tensors if epi else ()):
        sizes_used |= set(t.dims)
    return ContractionPlan(
        kernel_name=k.name, a=a_op, b=b_op, c=c_op, b_transposed=b_transposed, a_transposed=a_transposed, m=m, n=n, k=kdim,
        batch=c_op.dims[:-2], fixed=tuple((s, v) for s, v in k.sizes if v is not None and s in sizes_used)
        + (((split.dim, split.splits),) if split else ()),
        dynamic=tuple(s for s, v in k.sizes if v is None and s in sizes_used),
        block_m=bm, block_n=bn, block_k=bk, warps_m=warps[lane_r], warps_n=warps[lane_c],
        stages=max(sa.buf.stages, sb.buf.stages), mma=red.mma.instr, acc_dtype="f32",
        guard_m=m in guarded, guard_n=n in guarded, guard_k=kdim in guarded,
        grid=grid_axes(k, tiles, {split.dim: split.splits} if split else None), swizzle=True, epilogue=epi,
        args=tuple(t.name for t in k.tensors), k_split=split,
    )


SPLITS_DIM = "splits_"  # the size name of a split-K output's leading (literal) dimension


def _k_split(k: Kernel, sidx: tuple[Aff, ...], grid_vars: set[str], mapping: str) -> KSplit | None:
    """SPLIT-K's partial sums: the output [S, M, N] (S a literal) stored at [ks, rows, cols] with
    ks a grid loop; None for an ordinary contraction."""
    lead = k.tensor(k.output.name).dims[:1]
    if len(sidx) != 3 or not lead or not lead[0].is_const():
        return None
    g = sidx[0]
    if len(g.terms) != 1 or g.terms[0][1] != 1 or g.const or g.terms[0][0] not in grid_vars:
        raise refuse(mapping, f"the output's literal leading dimension is stored at {g}, not at a block index")
    if SPLITS_DIM in dict(k.sizes):
        raise refuse(mapping, f"a size is named {SPLITS_DIM}, the name of a split-K dimension")
    return KSplit(g.terms[0][0], SPLITS_DIM, lead[0].const)


def _output_operand(k: Kernel, name: str, split: KSplit | None, mapping: str):
    if split is None:
        return operand(k, name, "global", mapping)
    t = k.tensor(name)
    rest = tuple(size_name(a, mapping, f"tensor {name}") for a in t.dims[1:])
    return Operand(name, (split.dim, *rest), t.dtype, "global")


def size_names_c(k: Kernel) -> dict[str, str]:
    """C names of the sizes in a contraction template: literals for fixed, size arguments else."""
    return {n: (str(v) if v is not None else f"sz_{ident(n)}") for n, v in k.sizes}


def _check_batch(read: Read, batch: dict[int, str], mapping: str) -> None:
    for pos, a in enumerate(read.idx[:-2]):
        if batch.get(pos) is None or a != Aff.of(batch[pos]):
            raise refuse(mapping, f"{read.tensor}'s batch dimension {pos} is read at {a}, not at the output's")


def _at_read(conds: tuple, buf, read: Read) -> set:
    """The buffer's zero-fill conditions at the position `read` reads it."""
    out = set()
    for c in conds:
        for (v, _), a in zip(buf.dims, read.idx):
            c = c.subst(v, a)
        out.add(c)
    return out



def _promises(plan: ContractionPlan) -> dict:
    staged_ops = [op for op in (plan.a, plan.b) if op.level == "shared"]
    return {"expect_mma": plan.mma, "expect_async_copy": bool(staged_ops) and plan.stages > 1,
            "forbid_spills": True}


def _print(k: Kernel, options: tuple[str, ...], instr: str) -> Printed:
    """Match the contraction, check its instruction, print it (wgmma: the cp.async kernel and the
    warp-specialized TMA one, chosen per call); a printer's ValueError is a refusal."""
    name = f"contraction {instr}"
    plan = match(k, name)
    if plan.mma != instr:
        raise refuse(name, f"the tile product is mapped to {plan.mma}")
    if plan.k_split and instr != "wgmma":
        raise refuse(name, "split-K partial sums (a k loop over one split's tiles) print on wgmma only")
    try:
        if instr == "mma_sync":
            ks = render_contraction(plan, options)
            variants = (Variant("kernel", ks, launch_of(k, ks)),)
        else:
            ks, ks_tma = render_wgmma(plan, options, tma=False), render_wgmma(plan, options, tma=True)
            variants = (Variant("kernel", ks, launch_of(k, ks)),
                        Variant("kernel_tma", ks_tma, launch_of(k, ks_tma, ("tma_maps",))))
    except ValueError as exc:
        raise refuse(name, str(exc)) from None
    want = tuple(t.name for t in k.tensors) + k.dynamic()
    for v in variants:
        if v.source.arg_names[:len(want)] != want:
            raise refuse(name, f"{v.stem} takes arguments {v.source.arg_names}, the kernel IR passes {want}")
    return Printed(f"contraction_{instr}", k, plan, variants, _promises(plan))


def _host_wgmma(printed: Printed, sizes: dict[str, int], ptrs: tuple[int, ...],
                encode: Encoder = encode_driver) -> tuple[int, bytes | None]:
    """The warp-specialized TMA kernel when sizes and pointers allow (16-byte rows and bases);
    encode: the tensor-map encoding (the driver's, or the CPU emulation's)."""
    plan = printed.plan
    names = plan.args or (plan.a.name, plan.b.name)
    pa, pb = ptrs[names.index(plan.a.name)], ptrs[names.index(plan.b.name)]
    if tma_supported(plan, sizes, (pa, pb)):
        return 1, encode_tensor_maps(plan, sizes, pa, pb, encode)
    return 0, None


def _register() -> None:
    register(Mapping("contraction_mma_sync", "contraction", "mma_sync", lambda k, o: _print(k, o, "mma_sync")))
    register(Mapping("contraction_wgmma", "contraction", "wgmma", lambda k, o: _print(k, o, "wgmma"), _host_wgmma))


_register()
