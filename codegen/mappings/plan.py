"""Kernel plans: the contract between the lowering (derivation -> plan) and CUDA codegen.

A plan says *what* the kernel computes (operands, which size names play which role) and *how*
(tile sizes, warps, pipeline depth, staging level of each operand, MMA mapping, guards, grid).
It is plain data: frozen dataclasses, no behaviour beyond validation and small lookups.

ContractionPlan: c[batch..., m, n] = epilogue(sum_k a[batch..., m, k] * b[batch..., k, n])
    (k_split: c[split, m, n] = sum over the split's k tiles only, a and b unbatched)
    (a stored [..., k, m] when a_transposed, b stored [..., n, k] when b_transposed: the layouts
    NN / NT / TN / TT, `layout(plan)`), fp32 accumulation, output dtype c.dtype; the
    epilogue (EpiloguePlan, printed from the kernel IR's stored value) is the identity when None.
AttentionPlan: o[b,h,i,:] = sum_j softmax_j(scale * q[b,h,i,:].k[b,h,j,:], MASK) v[b,h,j,:]
    for any layout whose head dim is innermost: each operand's `roles` say which dim holds the
    rows and which grid loop addresses each other dim (e.g. [B, N, H, D]; GQA's K / V shared by
    the query heads of a group);
    computed with the FlashAttention streaming fold (running max, running sum, rescaled accumulator);
    the mask, the key tile range and the key tile of each step (SPLIT-KV's S·j + ks) are not plan
    fields: the printers print them from the kernel IR.

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
    # attention operands: per dim, the index it is read at — 'seq' (the tile rows), 'head' (the
    # head dim, innermost) or the grid loop whose block index addresses it (a batch / head dim)
    roles: tuple[str, ...] = ()


@dataclass(frozen=True)
class GridAxis:
    loop: str   # IR loop variable this axis enumerates
    dim: str    # size name it tiles
    tile: int   # elements of `dim` per block (1 for batch / head dims)
    axis: str   # 'x' | 'y' | 'z'


@dataclass(frozen=True)
class EpiloguePlan:
    """A contraction's stored value around the accumulator, printed to C by codegen.mappings.epilogue."""

    source: str                     # the kernel IR's stored value, as the IR prints it
    tensors: tuple[Operand, ...]    # input tensors the epilogue reads, kernel-IR order
    pointers: tuple[str, ...]       # their C pointer names, same order
    body: str                       # C body of the lambda epi(acc_, er_, ec_): locals, then return
    interior: str                   # C condition on the block: every read guard holds on the tile
    helpers: tuple[str, ...]        # instruction wrappers the value calls (macros of constructs/instr.cu.j2)


@dataclass(frozen=True)
class KSplit:
    """SPLIT-K's partial sums: block `loop` (the output's leading batch dim `dim`, a literal
    `splits` long) adds the k tiles splits·kt + split, kt < ceil((K − BK·split) / (BK·splits))."""

    loop: str    # the grid loop of the split index
    dim: str     # the size name standing for the output's leading dimension (= splits)
    splits: int


@dataclass(frozen=True)
class ContractionPlan:
    kernel_name: str
    a: Operand
    b: Operand
    c: Operand
    b_transposed: bool
    a_transposed: bool       # a stored [.., k, m] (read as [m, k]): a gradient's Aᵀ·dC
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
    k_split: Optional[KSplit] = None  # SPLIT-K: this block adds its split's k tiles only


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
    extras: tuple[Operand, ...] = ()  # inputs the additive score term reads (after q, k, v)
    # FOLD-STAT's second output: the rows' log-sum-exp m + log(l), f32, O's layout without the
    # head dim (roles: O's without 'head'); None: the kernel writes O only
    lse: Optional[Operand] = None
    # SPLIT-KV's partial state: O is stored unnormalised (acc) and the rows' running max m
    # (natural units) and running sum l beside it, f32, O's layout without the head dim
    # (m first, then l: the kernel IR's order); None: O = acc / l
    state: Optional[tuple[Operand, Operand]] = None
    # packed rows (grouped-query decode): the mma tile's rows are `pack` query heads of one K / V
    # head times block_m query rows each, row pack_index * block_m + r; the operands Q, O (and the
    # state / statistic) read the head at the dim whose role is 'pack'; 1: one head per block
    pack: int = 1


def tile_rows(plan: AttentionPlan) -> int:
    """Rows of an attention block's tile: its query rows times the packed heads."""
    return plan.block_m * plan.pack


Plan = Union[ContractionPlan, AttentionPlan]


def inputs(plan: Plan) -> tuple[Operand, ...]:
    """Input operands in kernel-argument order."""
    if isinstance(plan, ContractionPlan):
        return (plan.a, plan.b)
    return (plan.q, plan.k, plan.v) + plan.extras


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


def layout(plan: ContractionPlan) -> str:
    """BLAS-style layout name: first letter a, second b; 'T' when stored transposed."""
    return ("T" if plan.a_transposed else "N") + ("T" if plan.b_transposed else "N")


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
    loops = [g.loop for g in plan.grid]
    if len(set(loops)) != len(loops):
        raise ValueError(f"grid loops repeat: {loops}")
    if isinstance(plan, ContractionPlan):
        a, b, c = plan.a, plan.b, plan.c
        at = (plan.k, plan.m) if plan.a_transposed else (plan.m, plan.k)
        bt = (plan.n, plan.k) if plan.b_transposed else (plan.k, plan.n)
        if a.dims[-2:] != at:
            raise ValueError(f"operand {a.name}: last dims {a.dims[-2:]} != {at}")
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
        grid_loops = {g.loop for g in plan.grid}
        for op, seq in ((plan.q, plan.seq_q), (plan.k, plan.seq_k), (plan.v, plan.seq_k), (plan.o, plan.seq_q)):
            roles = op.roles or tuple(f"batch:{d}" for d in op.dims[:-2]) + ("seq", "head")
            if len(roles) != len(op.dims) or roles.count("seq") != 1 or roles[-1:] != ("head",):
                raise ValueError(f"operand {op.name}: roles {roles} must name one seq dim and the head dim last")
            if op.dims[roles.index("seq")] != seq:
                raise ValueError(f"operand {op.name}: sequence dim must be {seq!r}")
            if op.roles and any(r not in ("seq", "head", "pack") and r not in grid_loops for r in roles):
                raise ValueError(f"operand {op.name}: roles {roles} name a loop that is not on the grid")
            if roles.count("pack") > (0 if op in (plan.k, plan.v) else 1) or (plan.pack > 1 and op in (plan.q, plan.o)
                                                                               and "pack" not in roles):
                raise ValueError(f"operand {op.name}: roles {roles}: the plan packs {plan.pack} query heads per "
                                 "tile; Q and O read the packed head at one dim, K and V never")
            if not op.roles and op.dims[:-2] != plan.batch:
                raise ValueError(f"operand {op.name}: dims {op.dims} must be batch + (seq, head_dim)")
        hd = {op.dims[-1] for op in (plan.q, plan.k, plan.v, plan.o)}
        if len(hd) != 1 or fixed.get(hd.pop()) != plan.head_dim:
            raise ValueError(f"head dim must be one fixed size equal to {plan.head_dim}")
        if not plan.scale > 0:
            raise ValueError("scale must be > 0")
