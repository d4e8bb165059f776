"""Final derivation program → kernel IR, totally: every construct is translated or refused.

The translation is structural, never by names:

- the definition's loops mapped to the grid (PARALLEL) become the grid, in loop-nest order (loops
  sharing a CUDA axis enumerate its blocks row-major in that order); every other loop is a
  lane dimension of the block's output tile and needs a fixed extent (TILE made it one), except
  a loop over a dynamic size mapped to threads with a count (the threads stride over it);
- a `Let` at a statement position becomes a `Stage` (a CACHE copy of a tensor) or a `Compute`
  (a register tile), with its dimensions, level and stages;
- a `Fold` becomes a `TileLoop` whose state, initial values and updates are the fold's own
  expressions (the ONLINE-AGG rescale is carried as written, never re-derived);
- a sum / max whose body stages tiles becomes a `TileLoop` with one accumulator state; a fold's
  updates each adding such a sum over one index, extent and staged body (FUSE-SUMS with `inner`:
  GQA's dV and dK inside the group sum) put one `TileLoop` carrying all those states in the fold's
  loop (the sums are independent: the loops' fusion);
- every other expression, guard, index map and constant is carried unchanged.

Anything with no kernel-IR form — several definitions, a dynamic extent inside a block, a
softmax that was never split, a binding inside an arithmetic expression that depends on a
reduction index — stops the build with a `LoweringError` naming the construct.
"""
from __future__ import annotations

import re

from compiler.ir import (
    BINARY_OPERATORS, UNARY_FUNCTIONS, AccFact, Aff, Bin, Binding, Cond, Const, Def, Expr, Ext, Fold, IndexValue,
    Let, Program, Read, Reduce, Select, Softmax, Un, tail_fold, walk,
)
from compiler.kernel_view import kernel_view
from compiler.printer import show_expr

from .ir import Buffer, Compute, GridDim, Kernel, LaneDim, Stage, State, Stmt, Store, TensorArg, TileLoop

BINARY_OPS = BINARY_OPERATORS
UNARY_OPS = UNARY_FUNCTIONS
REDUCTIONS = {"sum": 0.0, "max": float("-inf")}


class LoweringError(Exception):
    """The final program has no kernel-IR form; the message names the construct."""


class UnsupportedMapping(LoweringError):
    """The kernel IR exists, but no printer implements it with the mapping the schedule asked for."""


def kernel_name(spec_name: str) -> str:
    return "derivc_" + re.sub(r"\W", "_", spec_name)


def _short(e: Expr) -> str:
    text = " ".join(show_expr(e).split())
    return text if len(text) <= 160 else text[:157] + "..."


class _Lowering:
    def __init__(self, prog: Program, d: Def):
        self.prog = prog
        self.d = d
        self.taken: set[str] = set()
        self.tail = tail_fold(d.body)
        self.also_values: list[Expr] = []  # the tail fold's further results, lowered
        for x in walk(d.body):
            if isinstance(x, Let):
                self.taken.add(x.bind.name)
            if isinstance(x, Fold):
                self.taken |= set(x.state) | {b.name for b in x.binds}

    def fresh(self, base: str) -> str:
        name, k = base, 2
        while name in self.taken:
            name, k = f"{base}{k}", k + 1
        self.taken.add(name)
        return name

    # ----------------------------------------------------------------- statements
    def buffer(self, b: Binding) -> Buffer:
        dims = []
        for v, x in b.dims:
            n = fixed_extent(x, self.prog)
            if n is None:
                raise LoweringError(f"buffer {b.name}: extent {x} of {v} is not a fixed tile size")
            dims.append((v, n))
        if b.level not in ("register", "shared", "global"):
            raise LoweringError(f"buffer {b.name}: unknown memory level {b.level!r}")
        return Buffer(b.name, tuple(dims), b.level, b.stages, b.source)

    def binding(self, b: Binding) -> tuple[list[Stmt], Stmt]:
        pre, value = self.expr(b.value, inside_dims=bool(b.dims))
        buf = self.buffer(b)
        if b.source:
            reads = {x.tensor for x in walk(value) if isinstance(x, Read)}
            if reads != {b.source}:
                raise LoweringError(f"buffer {b.name} caches {b.source} but its value reads {sorted(reads)}")
            return pre, Stage(buf, value)
        return pre, Compute(buf, value)

    def expr(self, e: Expr, inside_dims: bool = False) -> tuple[list[Stmt], Expr]:
        """Statements to run first, and the lane-level value of e."""
        if isinstance(e, (Const, Read, IndexValue)):
            if isinstance(e, Const) and not isinstance(e.value, (int, float)):
                raise LoweringError(f"constant {e!r} is not a number")
            return [], e
        if isinstance(e, Let):
            if inside_dims:
                raise LoweringError(f"binding {e.bind.name} sits inside a buffer's value: {_short(e)}")
            pre, stmt = self.binding(e.bind)
            rest, value = self.expr(e.body)
            return pre + [stmt] + rest, value
        if isinstance(e, Fold):
            if inside_dims:
                raise LoweringError(f"fold over {e.var} sits inside a buffer's value")
            return self.fold(e)
        if isinstance(e, Reduce):
            if e.op not in REDUCTIONS:
                raise LoweringError(f"reduction {e.op!r} has no kernel-IR form")
            if any(isinstance(x, (Let, Fold)) for x in walk(e.body)):
                if inside_dims:
                    raise LoweringError(f"staged reduction over {e.var} sits inside a buffer's value")
                return self.tile_loop(e)
            self.check_pure(e.body)
            return [], e
        if isinstance(e, Softmax):
            raise LoweringError(f"softmax over {e.var} has no kernel-IR form (derive it with split_softmax "
                                f"and online_agg first): {_short(e)}")
        if isinstance(e, Bin):
            if e.op not in BINARY_OPS:
                raise LoweringError(f"operator {e.op!r} has no kernel-IR form: {_short(e)}")
            pa, va = self.expr(e.a, inside_dims)
            pb, vb = self.expr(e.b, inside_dims)
            return pa + pb, Bin(e.op, va, vb)
        if isinstance(e, Un):
            if e.op not in UNARY_OPS:
                raise LoweringError(f"function {e.op!r} has no kernel-IR form: {_short(e)}")
            pa, va = self.expr(e.a, inside_dims)
            return pa, Un(e.op, va)
        if isinstance(e, Select):
            pt, vt = self.expr(e.then, inside_dims)
            po, vo = self.expr(e.other, inside_dims)
            # statements hoisted out of a guarded branch run unguarded: values are pure, so sound
            return pt + po, Select(e.conds, vt, vo)
        raise LoweringError(f"expression {e!r} has no kernel-IR form")

    def check_pure(self, e: Expr) -> None:
        for x in walk(e):
            if isinstance(x, Softmax):
                raise LoweringError(f"softmax over {x.var} inside a reduction has no kernel-IR form")
            if isinstance(x, Bin) and x.op not in BINARY_OPS:
                raise LoweringError(f"operator {x.op!r} has no kernel-IR form")
            if isinstance(x, Un) and x.op not in UNARY_OPS:
                raise LoweringError(f"function {x.op!r} has no kernel-IR form")
            if isinstance(x, Reduce) and x.op not in REDUCTIONS:
                raise LoweringError(f"reduction {x.op!r} has no kernel-IR form")

    def fold(self, f: Fold) -> tuple[list[Stmt], Expr]:
        pre: list[Stmt] = []
        inits = []
        for x in f.init:
            p, v = self.expr(x)
            pre += p
            inits.append(v)
        body: list[Stmt] = []
        for b in f.binds:
            p, stmt = self.binding(b)
            body += p + [stmt]
        updates = []
        inner: list[TileLoop] = []
        for name, u in zip(f.state, f.update):
            p, v = self.expr(u)
            if p and not (len(p) == 1 and isinstance(p[0], TileLoop) and isinstance(u, Bin)
                          and isinstance(u.b, Reduce) and _same_steps(p[0], inner)):
                raise LoweringError(f"fold update of {name} stages a tile inside an expression: {_short(u)}")
            inner += p
            updates.append(v)
        if inner:  # the updates' tile sums over one index, staged alike (FUSE-SUMS with inner): one loop
            body.append(TileLoop(inner[0].var, inner[0].ext, tuple(s for x in inner for s in x.state), inner[0].body))
        if len(updates) != len(f.state) or len(inits) != len(f.state):
            raise LoweringError(f"fold over {f.var}: {len(f.state)} states, {len(inits)} inits, {len(updates)} updates")
        loop = TileLoop(f.var, f.ext, tuple(State(n, i, u) for n, i, u in zip(f.state, inits, updates)), tuple(body))
        post, result = self.expr(f.result)
        for x in f.also:
            if f is not self.tail:
                raise LoweringError(f"fold over {f.var} has further results but is not the definition's tail fold")
            p, v = self.expr(x)
            if p:
                raise LoweringError(f"a further result of the fold over {f.var} stages a tile: {_short(x)}")
            self.also_values.append(v)
        return pre + [loop] + post, result

    def tile_loop(self, r: Reduce) -> tuple[list[Stmt], Expr]:
        if r.mma is not None:
            raise LoweringError(f"reduction over {r.var} stages tiles and is mapped to {r.mma.instr}: "
                                "MAP-MMA applies to the inner tile product only")
        body, value = self.expr(r.body)
        acc = self.fresh(f"{r.op}_{r.var}")
        update = Bin("+" if r.op == "sum" else "max", Read(acc, ()), value)
        loop = TileLoop(r.var, r.ext, (State(acc, Const(REDUCTIONS[r.op]), update, r.acc or AccFact("register", "f32")),),
                        tuple(body))
        return [loop], Read(acc, ())


def _same_steps(loop: TileLoop, others: list[TileLoop]) -> bool:
    """loop runs over the index, extent and staged body of the loops in `others` (or there are none):
    the sums differ in their states only, so one loop carries them all."""
    return all(x.var == loop.var and x.ext == loop.ext and x.body == loop.body for x in others)


def fixed_extent(x: Ext, prog: Program) -> int | None:
    """The extent's value when it depends on fixed sizes only."""
    for n, v in prog.sizes:
        if v is not None:
            x = x.subst(n, Aff.lit(v))
    return x.const_value()


def lower(prog: Program, name: str) -> Kernel:
    """The kernel IR of a final program; `LoweringError` naming the construct it cannot translate.
    Tensors another build step writes (`computed_by`) are arguments, like the inputs."""
    prog = kernel_view(prog)
    if len(prog.defs) != 1:
        raise LoweringError(
            f"the program has {len(prog.defs)} definitions ({', '.join(d.name for d in prog.defs)}); "
            "one kernel needs them fused into one (FUSE)"
        )
    d = prog.defs[0]
    if d.level != "global":
        raise LoweringError(f"definition {d.name} is stored at level {d.level!r}, not global")
    grid: list[GridDim] = []
    lanes: list[LaneDim] = []
    grid_vars: set[str] = set()
    sizes = {n for n, _ in prog.sizes}
    for lp in d.loops:
        if lp.mapping is not None and lp.mapping.level == "grid":
            if not lp.ext.names() <= sizes:
                raise LoweringError(f"grid loop {lp.var} < {lp.ext}: the extent depends on another loop")
            grid.append(GridDim(lp.var, lp.ext, lp.mapping.axis))
            grid_vars.add(lp.var)
        else:
            n = fixed_extent(lp.ext, prog)
            m = lp.mapping
            if n is None and m is not None and m.level == "thread" and m.count and lp.ext.names() <= sizes:
                lanes.append(LaneDim(lp.var, None, m, lp.ext))  # threads stride over a dynamic extent
                continue
            if n is None:
                raise LoweringError(f"loop {lp.var} < {lp.ext} is not mapped to the grid and has no fixed extent: "
                                    "a thread block needs a fixed tile (TILE it, then PARALLEL the outer loop)")
            lanes.append(LaneDim(lp.var, n, lp.mapping))
    low = _Lowering(prog, d)
    body, value = low.expr(d.body)
    tensors = [TensorArg(n, t.dims, t.dtype) for n, t in prog.inputs]
    tensors.append(TensorArg(d.name, d.type.dims, d.type.dtype, output=True))
    if len(low.also_values) != len(d.also):
        raise LoweringError(f"definition {d.name} writes {len(d.also)} further outputs, its tail fold gives "
                            f"{len(low.also_values)}")
    also = []
    for a, v in zip(d.also, low.also_values):
        tensors.append(TensorArg(a.name, a.type.dims, a.type.dtype, output=True))
        once = tuple(Cond(d.store[k], "<=", Aff.lit(0)) for k in range(len(d.store)) if k not in a.keep)
        also.append(Store(a.name, tuple(d.store[k] for k in a.keep), d.guard + once, v))
    return Kernel(kernel_name(name), prog.sizes, tuple(tensors), tuple(grid), tuple(lanes), tuple(body),
                  Store(d.name, d.store, d.guard, value), tuple(also))
