"""Kernel plans: the contract between the lowering (derivation -> plan) and CUDA codegen.

A plan says *what* the kernel computes (operands, which size names play which role) and *how*
(tile sizes, warps, pipeline depth, staging level of each operand, MMA mapping, guards, grid).
It is plain data: frozen dataclasses, no behaviour beyond validation and small lookups.

ContractionPlan: c[batch..., m, n] = epilogue(sum_k a[batch..., m, k] * b[batch..., k, n])
    (b stored [..., n, k] when b_transposed), fp32 accumulation, output dtype c.dtype; the
    epilogue (EpiloguePlan, printed from the kernel IR's stored value) is the identity when None.
AttentionPlan: o[b,h,i,:] = sum_j softmax_j(scale * q[b,h,i,:].k[b,h,j,:], MASK) v[b,h,j,:]
    computed with the FlashAttention streaming fold (running max, running sum, rescaled accumulator);
    the mask and the key tile range are not plan fields: the printers print them from the kernel IR.

Plans are read off the kernel IR by codegen.mappings (never off the derivation program): they
are the instruction choices of a tensor-core printer, checked against the kernel IR's meaning.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from compiler.machine import DTYPES

LEVELS = ("global", "shared", "register")
AXES = ("x", "y", "z")


@dataclass(frozen=True)
class Operand:
    name: str
    dims: tuple[str, ...]  # size names, row-major contiguous (last dim has stride 1)
    dtype: str             # 'f16' | 'bf16' | 'f32'
    level: str             # where the kernel stages its tiles: 'global' | 'shared' | 'register'


@dataclass(frozen=True)
class GridAxis:
    loop: str   # IR loop variable this axis enumerates
    dim: str    # size name it tiles
    tile: int   # elements of `dim` per block (1 for batch / head dims)
    axis: str   # 'x' | 'y' | 'z'


@dataclass(frozen=True)
class EpiloguePlan:
    """A contraction's stored value around the accumulator, printed to C by codegen.epilogue."""

    source: str                     # the kernel IR's stored value, as the IR prints it
    tensors: tuple[Operand, ...]    # input tensors the epilogue reads, kernel-IR order
    pointers: tuple[str, ...]       # their C pointer names, same order
    body: str                       # C body of the lambda epi(acc_, er_, ec_): locals, then return
    interior: str                   # C condition on the block: every read guard holds on the tile
    helpers: tuple[str, ...]        # C device functions the value calls


@dataclass(frozen=True)
class ContractionPlan:
    kernel_name: str
    a: Operand
    b: Operand
    c: Operand
    b_transposed: bool
    m: str
    n: str
    k: str
    batch: tuple[str, ...]
    fixed: tuple[tuple[str, int], ...]
    dynamic: tuple[str, ...]
    block_m: int
    block_n: int
    block_k: int
    warps_m: int
    warps_n: int
    stages: int
    mma: Optional[str]       # None (SIMT fp32 FMA) | 'mma_sync' | 'wgmma' (later)
    acc_dtype: str
    guard_m: bool
    guard_n: bool
    guard_k: bool
    grid: tuple[GridAxis, ...]
    swizzle: bool
    epilogue: Optional[EpiloguePlan] = None  # None: the store writes the accumulator
    args: tuple[str, ...] = ()  # tensor names in kernel-argument order (the kernel IR's); () = a, b, c


@dataclass(frozen=True)
class AttentionPlan:
    kernel_name: str
    q: Operand
    k: Operand
    v: Operand
    o: Operand
    batch: tuple[str, ...]
    seq_q: str
    seq_k: str
    head_dim: int
    scale: float
    fixed: tuple[tuple[str, int], ...]
    dynamic: tuple[str, ...]
    block_m: int
    block_n: int
    warps: int
    stages: int
    mma: Optional[str]
    p_in_registers: bool
    guard_q: bool
    guard_kv: bool
    grid: tuple[GridAxis, ...]
    swizzle: bool


Plan = Union[ContractionPlan, AttentionPlan]


def inputs(plan: Plan) -> tuple[Operand, ...]:
    """Input operands in kernel-argument order."""
    if isinstance(plan, ContractionPlan):
        return (plan.a, plan.b)
    return (plan.q, plan.k, plan.v)


def output(plan: Plan) -> Operand:
    return plan.c if isinstance(plan, ContractionPlan) else plan.o


def operands(plan: Plan) -> tuple[Operand, ...]:
    extra = plan.epilogue.tensors if isinstance(plan, ContractionPlan) and plan.epilogue else ()
    return inputs(plan) + extra + (output(plan),)


def threads(plan: Plan) -> int:
    if isinstance(plan, ContractionPlan):
        return plan.warps_m * plan.warps_n * 32
    return plan.warps * 32


def size_names(plan: Plan) -> tuple[str, ...]:
    """Every size name the operands use, first-seen order."""
    seen: list[str] = []
    for op in operands(plan):
        for d in op.dims:
            if d not in seen:
                seen.append(d)
    return tuple(seen)


def check_plan(plan: Plan) -> None:
    """Structural checks every lowering must satisfy; raises ValueError naming the field."""
    fixed = dict(plan.fixed)
    for op in operands(plan):
        if op.dtype not in DTYPES:
            raise ValueError(f"operand {op.name}: dtype {op.dtype!r} not in {tuple(DTYPES)}")
        if op.level not in LEVELS:
            raise ValueError(f"operand {op.name}: level {op.level!r} not in {LEVELS}")
    for name in size_names(plan):
        if (name in fixed) == (name in plan.dynamic):
            raise ValueError(f"size {name!r} must be exactly one of fixed / dynamic")
    for g in plan.grid:
        if g.axis not in AXES:
            raise ValueError(f"grid axis {g.axis!r} for loop {g.loop!r} not in {AXES}")
        if g.tile < 1:
            raise ValueError(f"grid axis {g.axis}: tile must be >= 1")
    axes = [g.axis for g in plan.grid]
    if len(set(axes)) != len(axes):
        raise ValueError(f"grid axes repeat: {axes}")
    if isinstance(plan, ContractionPlan):
        a, b, c = plan.a, plan.b, plan.c
        bt = (plan.n, plan.k) if plan.b_transposed else (plan.k, plan.n)
        if a.dims[-2:] != (plan.m, plan.k):
            raise ValueError(f"operand {a.name}: last dims {a.dims[-2:]} != ({plan.m}, {plan.k})")
        if b.dims[-2:] != bt:
            raise ValueError(f"operand {b.name}: last dims {b.dims[-2:]} != {bt}")
        if c.dims[-2:] != (plan.m, plan.n):
            raise ValueError(f"operand {c.name}: last dims {c.dims[-2:]} != ({plan.m}, {plan.n})")
        for op in (a, b, c):
            extra = [d for d in op.dims[:-2] if d not in plan.batch]
            if extra:
                raise ValueError(f"operand {op.name}: dims {extra} are not batch dims")
        if c.dims[:-2] != plan.batch:
            raise ValueError(f"operand {c.name}: batch dims {c.dims[:-2]} != {plan.batch}")
        if plan.acc_dtype != "f32":
            raise ValueError("acc_dtype must be 'f32'")
        named = {a.name, b.name, c.name} | {t.name for t in (plan.epilogue.tensors if plan.epilogue else ())}
        if plan.args and set(plan.args) != named:
            raise ValueError(f"kernel arguments {plan.args} are not the plan's tensors {sorted(named)}")
    else:
        for op in (plan.q, plan.k, plan.v, plan.o):
            if len(op.dims) != len(plan.batch) + 2 or op.dims[:-2] != plan.batch:
                raise ValueError(f"operand {op.name}: dims {op.dims} must be batch + (seq, head_dim)")
        if plan.q.dims[-2] != plan.seq_q or plan.o.dims[-2] != plan.seq_q:
            raise ValueError(f"q / o sequence dim must be {plan.seq_q!r}")
        if plan.k.dims[-2] != plan.seq_k or plan.v.dims[-2] != plan.seq_k:
            raise ValueError(f"k / v sequence dim must be {plan.seq_k!r}")
        hd = {op.dims[-1] for op in (plan.q, plan.k, plan.v, plan.o)}
        if len(hd) != 1 or fixed.get(hd.pop()) != plan.head_dim:
            raise ValueError(f"head dim must be one fixed size equal to {plan.head_dim}")
        if not plan.scale > 0:
            raise ValueError("scale must be > 0")
