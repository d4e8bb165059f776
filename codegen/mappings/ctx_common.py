"""Template-context helpers shared by the tensor-core printers: C identifiers, size expressions,
kernel parameters, block indices (loops sharing a grid axis decomposed row-major), batch
offsets and row strides of any attention layout, and the block -> tile order of contraction
kernels."""
from __future__ import annotations

import re
from dataclasses import replace

from compiler.machine import DEVICE, DTYPES

from codegen.kir.grid import block_index_c
from codegen.mappings.plan import AttentionPlan, ContractionPlan, GridAxis, Operand, Plan, inputs, output
from codegen.source import KernelSource
from codegen.mappings.templates_env import render_template

DEFAULT_OPTIONS = (f"--gpu-architecture={DEVICE.arch}", "-std=c++17")
RASTER_GROUP = 8  # m-tiles per group in the grouped tile rasterization (L2 reuse of B panels)


def ident(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return s if re.match(r"[A-Za-z_]", s) else "_" + s


class Sizes:
    """C expressions for sizes: fixed -> literal, dynamic -> the int32 kernel argument."""

    def __init__(self, plan: Plan):
        self.fixed = dict(plan.fixed)
        self.dynamic = tuple(plan.dynamic)

    def expr(self, name: str) -> str:
        if name in self.fixed:
            return str(int(self.fixed[name]))
        if name in self.dynamic:
            return "sz_" + ident(name)
        raise ValueError(f"size {name!r} is neither fixed nor dynamic")

    def stride(self, op: Operand, dim: str) -> str:
        i = op.dims.index(dim)
        rest = [self.expr(d) for d in op.dims[i + 1:]]
        return "(long long)" + " * ".join(["1"] + rest)

    def stride_at(self, op: Operand, pos: int) -> str:
        """Elements between neighbours along dim `pos` of a row-major operand (constants folded)."""
        lit, names = 1, []
        for d in op.dims[pos + 1:]:
            if d in self.fixed:
                lit *= int(self.fixed[d])
            else:
                names.append(self.expr(d))
        if not names:
            return str(lit)
        return "(long long)" + " * ".join(names + ([str(lit)] if lit != 1 else []))

    def extent(self, dim: str, tile: int) -> str:
        """ceil(dim / tile) as C."""
        e = self.expr(dim)
        return e if tile == 1 else f"(({e} + {tile - 1}) / {tile})"


def block_indices(plan: Plan, sz: Sizes) -> dict[str, str]:
    """C block index of every grid loop (loops sharing an axis decomposed row-major, codegen.kir.grid)."""
    return block_index_c([(g.loop, sz.extent(g.dim, g.tile), g.axis) for g in plan.grid])


def _tiling(plan: Plan, dim: str, tile: int) -> GridAxis:
    """The grid entry that tiles `dim` by `tile`."""
    for g in plan.grid:
        if g.dim == dim:
            if g.tile != tile:
                raise ValueError(f"grid axis for {dim!r} tiles by {g.tile}, plan block is {tile}")
            return g
    raise ValueError(f"dim {dim!r} has no grid axis")


def tile_index(plan: Plan, dim: str, tile: int, sz: Sizes) -> str:
    """C block index of the grid loop that tiles `dim` by `tile`."""
    return block_indices(plan, sz)[_tiling(plan, dim, tile).loop]


def alone_on_axis(plan: Plan, loop: str) -> bool:
    axis = next(g.axis for g in plan.grid if g.loop == loop)
    return sum(g.axis == axis for g in plan.grid) == 1


def loop_block_var(loop: str) -> str:
    """The C variable holding an attention batch loop's block index (attn_addressing declares it)."""
    return f"bi_{ident(loop)}"


def attn_addressing(p: AttentionPlan, sz: Sizes) -> dict:
    """Block-index declarations of the batch loops, and per operand (q, k, v, o) its batch
    offset and row stride (`ld_*`), read off the operands' roles: any row-major layout whose
    head dim is innermost ([B, H, N, D], [B, N, H, D], GQA's shared K / V heads)."""
    bidx = block_indices(p, sz)
    decls = [f"const long long {loop_block_var(g.loop)} = {bidx[g.loop]};" for g in p.grid if g.tile == 1]
    ctx: dict = {"batch_decls": decls}
    for key, op in (("q", p.q), ("k", p.k), ("v", p.v), ("o", p.o)):
        roles = op_roles(op)
        if roles[-1] != "head":
            raise ValueError(f"operand {op.name}: the head dim must be innermost (stride 1)")
        terms = [f"{loop_block_var(r)} * {sz.stride_at(op, i)}" for i, r in enumerate(roles)
                 if r not in ("seq", "head", "pack")]
        ctx[f"off_{key}"] = " + ".join(terms) if terms else "0"
        ctx[f"ld_{key}"] = sz.stride_at(op, roles.index("seq"))
        _pack_stride(ctx, key, op, roles, p, sz)
    ctx["lse"] = p.lse is not None
    ctx["state"] = p.state is not None
    rows = (("lse", p.lse),) if p.lse is not None else ()
    rows += tuple(zip(("m", "l"), p.state or ()))
    for key, op in rows:  # the statistic, SPLIT-KV's m and l: O's layout without the head dim
        roles = op_roles(op)
        terms = [f"{loop_block_var(r)} * {sz.stride_at(op, i)}" for i, r in enumerate(roles) if r not in ("seq", "pack")]
        ctx[f"off_{key}"] = " + ".join(terms) if terms else "0"
        ctx[f"ld_{key}"] = sz.stride_at(op, roles.index("seq"))
        _pack_stride(ctx, key, op, roles, p, sz)
    return ctx


def _pack_stride(ctx: dict, key: str, op: Operand, roles: tuple[str, ...], p: AttentionPlan, sz: Sizes) -> None:
    """`ldp_<key>`: the stride of the packed query head (the operand's 'pack' dim), when the
    plan packs heads into the tile rows; K and V are read once per block, never at it."""
    if "pack" in roles:  # a packed extent of 1 (G = 1) is the unpacked tile: head 0 only
        if key in ("k", "v"):
            raise ValueError(f"operand {op.name} reads the packed head: K / V are read once per block")
        ctx[f"ldp_{key}"] = sz.stride_at(op, roles.index("pack"))
    elif p.pack > 1 and key not in ("k", "v"):
        raise ValueError(f"operand {op.name} has no packed-head dim; the plan packs {p.pack} heads per tile")


def with_roles(p: AttentionPlan) -> AttentionPlan:
    """The plan with index roles on every operand: a plan built without them (by hand, in tests)
    means the contiguous [batch.., seq, head] layout, each batch dim read at its grid loop."""
    by_dim = {g.dim: g.loop for g in p.grid if g.tile == 1}

    def fill(op: Operand) -> Operand:
        if op.roles:
            return op
        missing = [d for d in op.dims[:-2] if d not in by_dim]
        if missing:
            raise ValueError(f"operand {op.name}: batch dims {missing} have no grid axis")
        return replace(op, roles=tuple(by_dim[d] for d in op.dims[:-2]) + ("seq", "head"))

    return replace(p, q=fill(p.q), k=fill(p.k), v=fill(p.v), o=fill(p.o))


def op_roles(op: Operand) -> tuple[str, ...]:
    if not op.roles:
        raise ValueError(f"operand {op.name} carries no index roles (which dim is the row, the head, a batch loop)")
    return op.roles


def batch_groups(op: Operand) -> list[list[int]]:
    """The operand's batch dims (roles naming a grid loop) in runs of adjacent dims: one run is
    one dimension of a strided view (adjacent row-major dims flatten into one)."""
    groups: list[list[int]] = []
    roles = op_roles(op)
    for i, r in enumerate(roles):
        if r in ("seq", "head"):
            continue
        if groups and groups[-1][-1] == i - 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def params(plan: Plan, sz: Sizes) -> tuple[str, tuple[str, ...]]:
    """The kernel's parameter list: tensor pointers (in `plan.args` order for a contraction: the
    kernel IR's, which the runtime passes; else the inputs, an attention's score-term tensors
    after Q, K, V, then the output), then the dynamic sizes."""
    short = ("a", "b") if isinstance(plan, ContractionPlan) else \
        ("q", "k", "v") + tuple(f"x{n}" for n in range(len(plan.extras)))
    decls: dict[str, str] = {}
    for s, op in zip(short, inputs(plan)):
        decls.setdefault(op.name, f"const {DTYPES[op.dtype].ctype}* __restrict__ p_{s}")
    if isinstance(plan, ContractionPlan) and plan.epilogue is not None:
        for op, ptr in zip(plan.epilogue.tensors, plan.epilogue.pointers):
            decls.setdefault(op.name, f"const {DTYPES[op.dtype].ctype}* __restrict__ {ptr}")
    out = output(plan)
    decls[out.name] = f"{DTYPES[out.dtype].ctype}* __restrict__ p_{'c' if isinstance(plan, ContractionPlan) else 'o'}"
    lse = getattr(plan, "lse", None)
    if lse is not None:  # FOLD-STAT's second output, after O (the kernel IR's order)
        decls[lse.name] = f"{DTYPES[lse.dtype].ctype}* __restrict__ p_lse"
    for short_name, op in zip(("p_m", "p_l"), getattr(plan, "state", None) or ()):  # SPLIT-KV's m, l after O
        decls[op.name] = f"{DTYPES[op.dtype].ctype}* __restrict__ {short_name}"
    order = getattr(plan, "args", ()) or tuple(decls)
    if set(order) != set(decls):
        raise ValueError(f"kernel arguments {order} do not match the plan's tensors {tuple(decls)}")
    parts, names = [decls[n] for n in order], list(order)
    for d in plan.dynamic:
        parts.append(f"int {sz.expr(d)}")
        names.append(d)
    return ", ".join(parts), tuple(names)


def batch(plan: Plan, sz: Sizes, ops: dict[str, Operand]) -> tuple[list[str], dict[str, str]]:
    """Block-index declarations for the batch dims and each operand's batch offset expression."""
    by_dim = {g.dim: g for g in plan.grid}
    bidx = block_indices(plan, sz)
    decls = []
    for d in plan.batch:
        g = by_dim.get(d)
        if g is None:
            raise ValueError(f"batch dim {d!r} has no grid axis")
        if g.tile != 1:
            raise ValueError(f"batch dim {d!r}: grid tile must be 1, got {g.tile}")
        decls.append(f"const long long bi_{ident(d)} = {bidx[g.loop]};")
    offs = {}
    for key, op in ops.items():
        terms = [f"bi_{ident(d)} * {sz.stride(op, d)}" for d in plan.batch if d in op.dims]
        offs[key] = " + ".join(terms) if terms else "0"
    return decls, offs


def tile_axis(plan: Plan, dim: str, tile: int) -> str:
    return _tiling(plan, dim, tile).axis


def contraction_grid_ctx(p: ContractionPlan, sz: Sizes) -> dict:
    """Batch offsets and the block → (m-tile, n-tile) order (grouped rasterisation when both
    tile axes are on the grid) shared by the mma.sync and wgmma contraction skeletons."""
    decls, offs = batch(p, sz, {"a": p.a, "b": p.b, "c": p.c})
    ctx = dict(batch_decls=decls, off_a=offs["a"], off_b=offs["b"], off_c=offs["c"])
    ax_m, ax_n = tile_axis(p, p.m, p.block_m), tile_axis(p, p.n, p.block_n)
    alone = sum(g.axis in (ax_m, ax_n) for g in p.grid) == 2
    if {ax_m, ax_n} == {"x", "y"} and alone:
        ctx["raster"] = dict(ax_m=ax_m, ax_n=ax_n, group=RASTER_GROUP)
    else:
        ctx["raster"] = None
        ctx["tm_expr"] = f"(int){tile_index(p, p.m, p.block_m, sz)}"
        ctx["tn_expr"] = f"(int){tile_index(p, p.n, p.block_n, sz)}"
    return ctx


def source(template: str, ctx: dict, options: tuple[str, ...]) -> KernelSource:
    """Render a kernel skeleton with its context (every tensor-core family ends here)."""
    if ctx["smem_bytes"] > DEVICE.smem_per_block:
        raise ValueError(f"the kernel needs {ctx['smem_bytes']} bytes of shared memory > "
                         f"{DEVICE.smem_per_block} (fewer stages or smaller tiles)")
    return KernelSource(source=render_template(template, ctx), entry=ctx["kname"], arg_names=ctx["_arg_names"],
                        threads=ctx["threads"], smem_bytes=ctx["smem_bytes"], options=tuple(options))
