"""Template-context helpers shared by the tensor-core printers: C identifiers, size expressions,
kernel parameters, batch offsets and the block -> tile order of contraction kernels."""
from __future__ import annotations

import re

from compiler.machine import DEVICE, DTYPES

from codegen.plan import ContractionPlan, Operand, Plan, inputs, output
from codegen.source import KernelSource
from codegen.templates_env import render_template

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


def params(plan: Plan, sz: Sizes) -> tuple[str, tuple[str, ...]]:
    """The kernel's parameter list: tensor pointers (in `plan.args` order for a contraction: the
    kernel IR's, which the runtime passes; else inputs then output), then the dynamic sizes."""
    short = ("a", "b") if isinstance(plan, ContractionPlan) else ("q", "k", "v")
    decls: dict[str, str] = {}
    for s, op in zip(short, inputs(plan)):
        decls.setdefault(op.name, f"const {DTYPES[op.dtype].ctype}* __restrict__ p_{s}")
    if isinstance(plan, ContractionPlan) and plan.epilogue is not None:
        for op, ptr in zip(plan.epilogue.tensors, plan.epilogue.pointers):
            decls.setdefault(op.name, f"const {DTYPES[op.dtype].ctype}* __restrict__ {ptr}")
    out = output(plan)
    decls[out.name] = f"{DTYPES[out.dtype].ctype}* __restrict__ p_{'c' if isinstance(plan, ContractionPlan) else 'o'}"
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
    decls = []
    for d in plan.batch:
        g = by_dim.get(d)
        if g is None:
            raise ValueError(f"batch dim {d!r} has no grid axis")
        if g.tile != 1:
            raise ValueError(f"batch dim {d!r}: grid tile must be 1, got {g.tile}")
        decls.append(f"const long long bi_{ident(d)} = blockIdx.{g.axis};")
    offs = {}
    for key, op in ops.items():
        terms = [f"bi_{ident(d)} * {sz.stride(op, d)}" for d in plan.batch if d in op.dims]
        offs[key] = " + ".join(terms) if terms else "0"
    return decls, offs


def tile_axis(plan: Plan, dim: str, tile: int) -> str:
    for g in plan.grid:
        if g.dim == dim:
            if g.tile != tile:
                raise ValueError(f"grid axis for {dim!r} tiles by {g.tile}, plan block is {tile}")
            return g.axis
    raise ValueError(f"dim {dim!r} has no grid axis")


def contraction_grid_ctx(p: ContractionPlan, sz: Sizes) -> dict:
    """Batch offsets and the block → (m-tile, n-tile) order (grouped rasterisation when both
    tile axes are on the grid) shared by the mma.sync and wgmma contraction skeletons."""
    decls, offs = batch(p, sz, {"a": p.a, "b": p.b, "c": p.c})
    ctx = dict(batch_decls=decls, off_a=offs["a"], off_b=offs["b"], off_c=offs["c"])
    ax_m, ax_n = tile_axis(p, p.m, p.block_m), tile_axis(p, p.n, p.block_n)
    if {ax_m, ax_n} == {"x", "y"}:
        ctx["raster"] = dict(ax_m=ax_m, ax_n=ax_n, group=RASTER_GROUP)
    else:
        ctx["raster"] = None
        ctx["tm_expr"], ctx["tn_expr"] = f"(int)blockIdx.{ax_m}", f"(int)blockIdx.{ax_n}"
    return ctx


def source(template: str, ctx: dict, options: tuple[str, ...]) -> KernelSource:
    """Render a kernel skeleton with its context (every tensor-core family ends here)."""
    if ctx["smem_bytes"] > DEVICE.smem_per_block:
        raise ValueError(f"the kernel needs {ctx['smem_bytes']} bytes of shared memory > "
                         f"{DEVICE.smem_per_block} (fewer stages or smaller tiles)")
    return KernelSource(source=render_template(template, ctx), entry=ctx["kname"], arg_names=ctx["_arg_names"],
                        threads=ctx["threads"], smem_bytes=ctx["smem_bytes"], options=tuple(options))
