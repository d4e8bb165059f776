"""Final IR → KernelPlan (trusted, tested): read off what the derivation decided.

The lowering re-decides nothing: tile sizes come from the tiled store indices and reduction
extents, the grid from PARALLEL's grid loops, warps from PARALLEL's warp counts, staging
levels and pipeline depth from CACHE bindings, tensor cores from MAP-MMA facts, guards from the
guards TILE and the spec put in, tile skipping from MASK.  It only recognises two program
shapes and refuses anything else with a `LoweringError` that says what it expected:

- contraction: one definition C[.., m, n] = sum over k of a product of two operand reads;
- online fold:  one definition O[.., i, d] = the ONLINE-AGG fold of an attention spec.
"""
from __future__ import annotations

import re

from compiler.ir import (
    Aff, Bin, Binding, Const, Def, Expr, Fold, Let, Program, Read, Reduce, Select, walk,
)

from .plan import AttentionPlan, ContractionPlan, GridAxis, Operand, Plan, check_plan


class LoweringError(Exception):
    """The final program has no CUDA lowering (shape not recognised or facts missing)."""


class UnsupportedMapping(LoweringError):
    """The program has a lowering, but not with the hardware mapping its schedule asked for."""


def _strip_lets(e: Expr) -> tuple[Expr, list[Binding]]:
    binds: list[Binding] = []
    while isinstance(e, Let):
        binds.append(e.bind)
        e = e.body
    return e, binds


def _unguard(e: Expr) -> Expr:
    while isinstance(e, Select) and e.other == Const(0.0):
        e = e.then
    return e


def _all_bindings(e: Expr) -> dict[str, Binding]:
    out: dict[str, Binding] = {}
    for x in walk(e):
        if isinstance(x, Let):
            out[x.bind.name] = x.bind
        if isinstance(x, Fold):
            for b in x.binds:
                out[b.name] = b
    return out


def _grid(d: Def) -> tuple[GridAxis, ...]:
    """Grid axes: each grid loop with the dimension it enumerates and its tile."""
    axes = []
    for lp in d.loops:
        if lp.mapping is None or lp.mapping.level != "grid":
            continue
        pos = [k for k, a in enumerate(d.store) if a.coef(lp.var)]
        if len(pos) != 1:
            raise LoweringError(f"grid loop {lp.var} must index exactly one output dimension")
        tile = d.store[pos[0]].coef(lp.var)
        dim = d.type.dims[pos[0]]
        axes.append(GridAxis(lp.var, _dim_name(dim), tile, lp.mapping.axis))
    return tuple(axes)


def _dim_name(a: Aff) -> str:
    if len(a.terms) != 1 or a.terms[0][1] != 1 or a.const:
        raise LoweringError(f"dimension {a} is not a plain size name")
    return a.terms[0][0]


def _operand(prog: Program, name: str, level: str) -> Operand:
    t = prog.tensor_type(name)
    return Operand(name, tuple(_dim_name(a) for a in t.dims), t.dtype, level)


def _source(read: Read, binds: dict[str, Binding]) -> tuple[str, str, int]:
    """(source tensor, level, stages) of an operand read, through a CACHE buffer if any."""
    if read.tensor in binds:
        b = binds[read.tensor]
        if not b.source:
            raise LoweringError(f"operand {read.tensor} is computed, not read from a tensor")
        return b.source, b.level, b.stages
    return read.tensor, "global", 1


def _warp_counts(d: Def) -> dict[str, int]:
    return {lp.var: (lp.mapping.count or 1) for lp in d.loops if lp.mapping and lp.mapping.level == "warp"}


def _fixed_dynamic(prog: Program, names: set[str]) -> tuple[tuple[tuple[str, int], ...], tuple[str, ...]]:
    fixed = tuple((n, v) for n, v in prog.sizes if v is not None and n in names)
    dynamic = tuple(n for n, v in prog.sizes if v is None and n in names)
    return fixed, dynamic


def kernel_name(spec_name: str) -> str:
    return "derivc_" + re.sub(r"\W", "_", spec_name)


def lower_to_plan(prog: Program, name: str) -> Plan:
    """The kernel plan of a final program; LoweringError when it has no CUDA lowering."""
    if len(prog.defs) != 1:
        raise LoweringError(
            f"the program has {len(prog.defs)} definitions ({', '.join(d.name for d in prog.defs)}); "
            "one kernel needs them fused into one"
        )
    d = prog.defs[0]
    body, _ = _strip_lets(d.body)
    plan: Plan
    if isinstance(body, Fold):
        plan = _lower_attention(prog, d, body, kernel_name(name))
    elif isinstance(body, Reduce):
        plan = _lower_contraction(prog, d, body, kernel_name(name))
    else:
        raise LoweringError("the definition is neither a contraction (sum of products) nor an online fold")
    try:
        check_plan(plan)
    except ValueError as exc:
        raise LoweringError(f"plan check failed: {exc}") from None
    return plan


def _tile_of(d: Def, pos: int) -> tuple[str | None, int, str | None]:
    """(grid loop, tile, inner loop) of output position pos: store = tile*outer + inner."""
    a = d.store[pos]
    loops = {lp.var: lp for lp in d.loops}
    grid = [(v, c) for v, c in a.terms if v in loops and loops[v].mapping and loops[v].mapping.level == "grid"]
    inner = [(v, c) for v, c in a.terms if v in loops and (v, c) not in grid]
    if len(grid) != 1 or len(inner) > 1:
        raise LoweringError(f"output dimension {pos} ({a}) must be tiled with its tile loop mapped to the grid")
    g, t = grid[0]
    return g, t, (inner[0][0] if inner else None)


def _lower_contraction(prog: Program, d: Def, outer: Reduce, kname: str) -> ContractionPlan:
    if outer.op != "sum":
        raise LoweringError("a contraction must be a sum")
    inner_body, binds_here = _strip_lets(outer.body)
    binds = _all_bindings(d.body)
    if isinstance(inner_body, Reduce) and inner_body.op == "sum":
        inner = inner_body
        block_k = inner.ext.const_value()
        if block_k is None:
            raise LoweringError("the inner k tile must have a fixed extent")
    else:
        raise LoweringError("tile the reduction (k = BK*ko + ki) before lowering a contraction")
    prod = _unguard(inner.body)
    if not (isinstance(prod, Bin) and prod.op == "*" and isinstance(prod.a, Read) and isinstance(prod.b, Read)):
        raise LoweringError("the inner reduction must be a product of two operand reads")
    a_src, a_level, a_stages = _source(prod.a, binds)
    b_src, b_level, b_stages = _source(prod.b, binds)
    c = _operand(prog, d.name, "global")
    a = _operand(prog, a_src, a_level)
    b = _operand(prog, b_src, b_level)
    m, n = c.dims[-2], c.dims[-1]
    k = a.dims[-1]
    if a.dims[-2] != m:
        raise LoweringError(f"operand {a.name} must be [.., {m}, {k}]")
    if b.dims[-2:] == (k, n):
        b_t = False
    elif b.dims[-2:] == (n, k):
        b_t = True
    else:
        raise LoweringError(f"operand {b.name} must be [.., {k}, {n}] or [.., {n}, {k}]")
    _, block_m, im = _tile_of(d, len(d.store) - 2)
    _, block_n, jn = _tile_of(d, len(d.store) - 1)
    warps = _warp_counts(d)
    guard_names = set().union(*(cnd.names() for cnd in d.guard)) if d.guard else set()
    fixed, dynamic = _fixed_dynamic(prog, set(a.dims) | set(b.dims) | set(c.dims))
    sizes = dict(prog.sizes)
    k_fixed = sizes.get(k)
    return ContractionPlan(
        kernel_name=kname, a=a, b=b, c=c, b_transposed=b_t, m=m, n=n, k=k,
        batch=c.dims[:-2], fixed=fixed, dynamic=dynamic,
        block_m=block_m, block_n=block_n, block_k=block_k,
        warps_m=warps.get(im, 1), warps_n=warps.get(jn, 1),
        stages=max(a_stages, b_stages), mma=inner.mma.instr if inner.mma else None,
        acc_dtype=(outer.acc.dtype if outer.acc else "f32"),
        guard_m=m in guard_names, guard_n=n in guard_names,
        guard_k=k_fixed is None or k_fixed % block_k != 0,
        grid=_grid(d), swizzle=inner.mma is not None,
    )


def _lower_attention(prog: Program, d: Def, fold: Fold, kname: str) -> AttentionPlan:
    if len(fold.state) != 3 or len(fold.binds) < 3:
        raise LoweringError("the fold is not an online aggregation (state m, l, acc)")
    binds = _all_bindings(d.body)
    score_tiles = [b for b in fold.binds if b.dims and not b.source]
    if len(score_tiles) < 2:
        raise LoweringError("the fold step has no register score / probability tiles")
    s_bind = score_tiles[0]
    s_val = s_bind.value
    conds = s_val.conds if isinstance(s_val, Select) else ()
    s_expr = s_val.then if isinstance(s_val, Select) else s_val
    scale = 1.0
    if isinstance(s_expr, Bin) and s_expr.op == "*" and isinstance(s_expr.a, Const):
        scale, s_expr = s_expr.a.value, s_expr.b
    if not (isinstance(s_expr, Reduce) and s_expr.op == "sum"):
        raise LoweringError("the score tile must be (scale ·) a sum over the head dimension")
    qk = _unguard(s_expr.body)
    if not (isinstance(qk, Bin) and qk.op == "*" and isinstance(qk.a, Read) and isinstance(qk.b, Read)):
        raise LoweringError("the score must be a product of a query read and a key read")
    q_src, q_level, _ = _source(qk.a, binds)
    k_src, k_level, k_stages = _source(qk.b, binds)
    pv = [x for x in walk(fold.update[2]) if isinstance(x, Reduce)]
    if len(pv) != 1:
        raise LoweringError("the accumulator update must hold one sum (the P·V product)")
    pv_prod = _unguard(pv[0].body)
    if not (isinstance(pv_prod, Bin) and pv_prod.op == "*" and isinstance(pv_prod.b, Read)):
        raise LoweringError("the accumulator update must be P · V")
    v_src, v_level, v_stages = _source(pv_prod.b, binds)
    q = _operand(prog, q_src, q_level)
    k = _operand(prog, k_src, k_level)
    v = _operand(prog, v_src, v_level)
    o = _operand(prog, d.name, "global")
    g_i, block_m, ii = _tile_of(d, len(d.store) - 2)
    block_n = s_bind.dims[0][1].const_value()
    if block_n is None:
        raise LoweringError("the key tile must have a fixed extent")
    seq_q, seq_k = o.dims[-2], k.dims[-2]
    causal = any(
        cnd.op == "<=" and cnd.rhs.coef(g_i) and not (cnd.rhs.names() & set(dict(prog.sizes)))
        for cnd in conds
    )
    guard_kv = any(seq_k in cnd.rhs.names() for cnd in conds)
    qk_mma = s_expr.mma.instr if s_expr.mma else None
    pv_mma = pv[0].mma.instr if pv[0].mma else None
    if qk_mma != pv_mma:
        raise UnsupportedMapping("map both products (QKᵀ and P·V) to the same instruction, or neither")
    p_read = pv_prod.a
    p_in_regs = isinstance(p_read, Read) and p_read.tensor in binds and binds[p_read.tensor].level == "register"
    warps = _warp_counts(d)
    names = set(q.dims) | set(k.dims) | set(v.dims) | set(o.dims)
    fixed, dynamic = _fixed_dynamic(prog, names)
    head = dict(fixed).get(o.dims[-1])
    if head is None:
        raise LoweringError(f"the head dimension {o.dims[-1]} must be a fixed size")
    return AttentionPlan(
        kernel_name=kname, q=q, k=k, v=v, o=o, batch=o.dims[:-2], seq_q=seq_q, seq_k=seq_k,
        head_dim=head, scale=scale, causal=causal, fixed=fixed, dynamic=dynamic,
        block_m=block_m, block_n=block_n, warps=warps.get(ii, 1), stages=max(k_stages, v_stages),
        mma=qk_mma, p_in_registers=p_in_regs, skip_masked_tiles=len(fold.ext.parts) > 1,
        guard_q=bool(d.guard), guard_kv=guard_kv, grid=_grid(d), swizzle=qk_mma is not None,
    )
