"""Next legal steps for a schedule that stops short of a fast kernel (`derivc explain --hint`).

Each hint is read off the program the schedule has reached — a definition that is not fused, a
softmax not split, a loop neither tiled nor mapped, a tensor read from global memory inside a
sequential tile loop, a sum accumulated without a register accumulator, a tile sum not mapped to
tensor cores — and is a complete schedule step.  A candidate is shown only when the rule's own
precondition accepts it on that program (`compiler.derive.apply_step`: parameters, check and
rewrite), so every printed step can be appended to the schedule as it stands.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .ir import Def, Expr, Fold, Let, Program, Read, Reduce, Softmax, children, tail_fold, tensors_read, walk

ROW_TILE = 128  # rows of an output tile (a warpgroup pair's m, 8 warps of 16 rows)
SUM_TILE = 64  # a contraction's k-tile: 128 bytes of f16, one swizzle row
LANE_LIMIT = 256  # a fixed extent up to this stays whole inside a block (a head dim, a tile)
WARP_ROWS = 16  # rows per warp of an mma fragment
MAX_WARPS = 8


@dataclass(frozen=True)
class Hint:
    """A step the program state asks for, and why."""

    reason: str
    step: dict[str, Any]

    def yaml(self) -> str:
        """The step as a schedule line writes it: `{rule: tile, def: C, index: i, size: 128}`."""
        def value(v: Any) -> str:
            if isinstance(v, (list, tuple)):
                return "[" + ", ".join(value(x) for x in v) + "]"
            return str(v).lower() if isinstance(v, bool) else str(v)

        return "{" + ", ".join(f"{k}: {value(v)}" for k, v in self.step.items()) + "}"

    def line(self) -> str:
        return f"{self.reason}: add {self.yaml()}"


def next_steps(prog: Program) -> list[Hint]:
    """The legal next steps of `prog`, in the order a tensor-core schedule takes them (duplicates
    and steps the rule's precondition refuses left out)."""
    from .derive import apply_step

    def legal(hint: Hint) -> bool:
        params = {k: v for k, v in hint.step.items() if k != "rule"}
        try:
            apply_step(prog, 1, hint.step["rule"], params)
        except Exception:  # noqa: BLE001 - refused by the rule: not a legal next step
            return False
        return True

    out: list[Hint] = []
    seen: set[str] = set()
    for generate in GENERATORS:
        for alternatives in generate(prog):  # a hint, or alternatives: the first legal one
            for hint in (alternatives if isinstance(alternatives, tuple) else (alternatives,)):
                if hint.yaml() not in seen and legal(hint):
                    seen.add(hint.yaml())
                    out.append(hint)
                    break
    return out


# --------------------------------------------------------------------------- program facts


def _fixed(prog: Program, ext: Any) -> int | None:
    fixed = {n: v for n, v in prog.sizes if v is not None}
    return ext.evaluate(fixed) if ext.names() <= set(fixed) else None


def _reads(e: Expr) -> Iterator[Read]:
    """Reads of tensors in e, outside the values of CACHE bindings (those are staged already)."""
    if isinstance(e, Read):
        yield e
        return
    if isinstance(e, Let) and e.bind.source:
        yield from _reads(e.body)
        return
    for c in children(e):
        yield from _reads(c)


def _staged(d: Def) -> set[str]:
    """Tensors d already stages (CACHE bindings name their source)."""
    out = set()
    for e in walk(d.body):
        binds = (e.bind,) if isinstance(e, Let) else e.binds if isinstance(e, Fold) else ()
        out |= {b.source for b in binds if b.source}
    return out


def _reductions(d: Def) -> list[Reduce]:
    return [e for e in walk(d.body) if isinstance(e, Reduce)]


def _tile_scopes(d: Def) -> list[tuple[str, Expr]]:
    """(index, body) of the sequential tile loops of d: a fold, or a reduction whose body holds
    a reduction (the outer half of a tiled sum)."""
    out = []
    for e in walk(d.body):
        if isinstance(e, Fold):
            out.append((e.var, e))
        elif isinstance(e, Reduce) and any(isinstance(x, Reduce) for x in walk(e.body)):
            out.append((e.var, e.body))
    return out


def _inputs(prog: Program) -> set[str]:
    return {n for n, _ in prog.inputs}


def _is_batch_loop(prog: Program, d: Def, var: str) -> bool:
    """A loop every input read of d indexes (batch, heads): the grid takes it whole."""
    reads = [r for r in _reads(d.body) if r.tensor in _inputs(prog)]
    return bool(reads) and all(any(var in a.names() for a in r.idx) for r in reads)


def _is_tile_index(ext: Any) -> bool:
    """An extent ceil(N / T): the loop is the outer half of a tiled one."""
    return len(ext.parts) == 1 and ext.single()[1] > 1


def _tile_size(prog: Program, ext: Any, preferred: int) -> int | None:
    """`preferred`, halved until it fits a fixed extent; None when the extent is a tile already."""
    n = _fixed(prog, ext)
    if n is not None and n <= LANE_LIMIT:
        return None
    size = preferred
    while n is not None and size > n:
        size //= 2
    return size


# --------------------------------------------------------------------------- generators


def _split_softmax(prog: Program) -> Iterator[Hint]:
    for d in prog.defs:
        if any(isinstance(e, Softmax) for e in walk(d.body)):
            yield Hint(f"{d.name} holds a softmax: split it into max, exp, sum and divide (then fuse it into its reader)",
                       {"rule": "split_softmax", "def": d.name})


def _fuse(prog: Program) -> Iterator[Hint]:
    if dict(prog.facts).get("kernels"):
        return
    for d in prog.defs:
        readers = [r.name for r in prog.defs if r.name != d.name and d.name in tensors_read(r.body)]
        if d.name != prog.output and readers:
            yield Hint(f"{d.name} is a definition of its own (a second kernel, a round trip through global memory), "
                       f"read by {', '.join(readers)}: fuse it", {"rule": "fuse", "producer": d.name})


def _assoc(prog: Program) -> Iterator[Hint]:
    for d in prog.defs:
        for r in _reductions(d):
            if r.op == "sum" and r.mma is None:
                yield Hint(f"the sum over {r.var} in {d.name} multiplies terms that do not use {r.var}: factor them out",
                           {"rule": "assoc", "def": d.name, "index": r.var})


def _tiled_sum_sizes(prog: Program) -> list[int]:
    """Tile sizes of the tiled reductions (a second sum must be tiled the same way for ONLINE-AGG)."""
    out = []
    for d in prog.defs:
        for r in _reductions(d):
            inner = r.body if isinstance(r.body, Reduce) else None
            size = _fixed(prog, inner.ext) if inner is not None else None
            if size is not None and size not in out:
                out.append(size)
    return out


def _outside_folds(e: Expr) -> Iterator[Reduce]:
    """The reductions of e that are not inside a fold (a fold's own sums run over its tile)."""
    if isinstance(e, Fold):
        return
    if isinstance(e, Reduce):
        yield e
    for c in children(e):
        yield from _outside_folds(c)


def _tile_sums(prog: Program) -> Iterator[Hint]:
    matching = _tiled_sum_sizes(prog)
    for d in prog.defs:
        for r in _outside_folds(d.body):
            if r.mma is not None or any(isinstance(x, Reduce) for x in walk(r.body)):
                continue
            size = _tile_size(prog, r.ext, SUM_TILE)
            if size is None:
                continue
            for t in matching or [size]:
                yield Hint(f"the {r.op} over {r.var} < {r.ext} in {d.name} is not tiled: tile it "
                           f"({t} per step{', as the other tiled sum' if matching else ''})",
                           {"rule": "tile", "def": d.name, "index": r.var, "size": t})


def _online_agg(prog: Program) -> Iterator[Hint]:
    for d in prog.defs:
        for r in _reductions(d):
            if isinstance(r.body, Reduce) or any(isinstance(x, Reduce) for x in walk(r.body)):
                yield Hint(f"{d.name} divides a softmax-weighted sum over tiles {r.var} by its row sum: stream it "
                           "as one fold (online softmax)", {"rule": "online_agg", "def": d.name, "index": r.var})


def _tile_loops(prog: Program) -> Iterator[Hint]:
    d = prog.def_named(prog.output)
    if any(lp.mapping is not None for lp in d.loops):
        return
    for lp in d.loops:
        if _is_batch_loop(prog, d, lp.var) or _is_tile_index(lp.ext):
            continue
        size = _tile_size(prog, lp.ext, ROW_TILE)
        if size is not None:
            yield Hint(f"loop {lp.var} < {lp.ext} of {d.name} is not tiled: tile it ({size} per block)",
                       {"rule": "tile", "def": d.name, "index": lp.var, "size": size})


def _skip_masked(prog: Program) -> Iterator[Hint]:
    for d in prog.defs:
        for var, _ in _tile_scopes(d):
            yield Hint(f"a guard of {d.name} bounds the tile index {var}: skip the tiles it masks",
                       {"rule": "skip_masked", "def": d.name, "index": var})


def _reorder(prog: Program) -> Iterator[Hint]:
    for d in prog.defs:
        for a, b in zip(d.loops, d.loops[1:]):
            if a.mapping is None and b.mapping is None and _fixed(prog, a.ext) is not None \
                    and _fixed(prog, b.ext) is None:
                yield Hint(f"the tile index {b.var} < {b.ext} sits inside the tile loop {a.var} < {a.ext} of {d.name}: "
                           "reorder so that the tile indices come first (the grid takes them)",
                           {"rule": "reorder", "def": d.name, "outer": a.var, "inner": b.var})


def _tile_over(read: Read, inner: set[str]) -> list[str]:
    """The indices a read's tile spans: per position, the index of fixed extent it adds."""
    over = []
    for a in read.idx:
        var = next((v for v, c in a.terms if c == 1 and v in inner), None)
        if var is not None and var not in over:
            over.append(var)
    return over


def _fixed_vars(prog: Program, d: Def, scope: Expr | None) -> set[str]:
    """Indices of fixed extent: d's fixed loops and, inside scope, its reductions' indices."""
    out = {lp.var for lp in d.loops if _fixed(prog, lp.ext) is not None}
    for e in walk(scope if scope is not None else d.body):
        if isinstance(e, Reduce) and _fixed(prog, e.ext) is not None:
            out.add(e.var)
        binds = (e.bind,) if isinstance(e, Let) else e.binds if isinstance(e, Fold) else ()
        out |= {v for b in binds for v, ext in b.dims if _fixed(prog, ext) is not None}
    return out


def _needs_tiles(prog: Program, d: Def) -> bool:
    """Some loop of d still needs a tile (a dynamic extent that is neither a tile index nor a
    batch loop): a tile staged now would span a loop that is not tiled yet."""
    return any(_fixed(prog, lp.ext) is None and not _is_tile_index(lp.ext) and lp.mapping is None
               and not _is_batch_loop(prog, d, lp.var) for lp in d.loops)


def _cache_tiles(prog: Program) -> Iterator[Hint]:
    for d in prog.defs:
        if _needs_tiles(prog, d):
            continue
        staged = _staged(d)
        for at, scope in _tile_scopes(d):
            inner = _fixed_vars(prog, d, scope)
            for read in _reads(scope):
                if read.tensor in staged or read.tensor not in _inputs(prog):
                    continue
                over = _tile_over(read, inner)
                if not over:
                    continue
                if any(at in a.names() for a in read.idx):
                    yield Hint(f"{read.tensor} is read from global memory in every step of {at}: stage its tile in "
                               "shared memory (a pipeline of stages)",
                               {"rule": "cache", "def": d.name, "tensor": read.tensor, "at": at, "over": over,
                                "level": "shared", "stages": 2})
                else:
                    yield Hint(f"{read.tensor}'s tile is the same in every step of {at}: stage it once, in registers",
                               {"rule": "cache", "def": d.name, "tensor": read.tensor, "over": over,
                                "level": "register"})


def _grid_axes(prog: Program, d: Def) -> dict[str, str]:
    """The grid axis of each outer loop: the loops before the first fixed-extent loop, the
    innermost on x, then y, the rest sharing z (outside-in, as PARALLEL maps them)."""
    grid = []
    for lp in d.loops:
        if (lp.mapping is not None and lp.mapping.level != "grid") or \
                (lp.mapping is None and _fixed(prog, lp.ext) is not None):
            break
        grid.append(lp.var)
    axes = {}
    for k, var in enumerate(reversed(grid)):
        axes[var] = "grid." + "xyz"[min(k, 2)]
    return axes


def _loop_order_settled(prog: Program, d: Def) -> bool:
    """Every loop that needs a tile has one, and the tile indices come before the tiles."""
    for a, b in zip(d.loops, d.loops[1:]):
        if _fixed(prog, a.ext) is not None and _fixed(prog, b.ext) is None:
            return False
    return all(_is_tile_index(lp.ext) or _is_batch_loop(prog, d, lp.var) or _fixed(prog, lp.ext) is not None
               or lp.mapping is not None for lp in d.loops)


def _parallel(prog: Program) -> Iterator[Hint]:
    d = prog.def_named(prog.output)
    if not _loop_order_settled(prog, d):
        return  # tile and reorder first: the grid takes the tile indices, outside-in
    axes = _grid_axes(prog, d)
    for lp in d.loops:
        if lp.var in axes and lp.mapping is None:
            yield Hint(f"loop {lp.var} < {lp.ext} of {d.name} is not mapped to the grid",
                       {"rule": "parallel", "def": d.name, "index": lp.var, "to": axes[lp.var]})
            return  # grid loops are mapped outside-in
    warps = 1
    for lp in d.loops:
        if lp.mapping is not None and lp.mapping.level == "warp":
            warps *= max(lp.mapping.count, 1)
    for lp in d.loops:
        n = _fixed(prog, lp.ext)
        if lp.mapping is not None or n is None or warps >= MAX_WARPS or lp.var in axes:
            continue
        count = min(MAX_WARPS // warps, max(n // WARP_ROWS, 1))
        yield Hint(f"the {n} iterations of loop {lp.var} in a block are not spread over warps",
                   {"rule": "parallel", "def": d.name, "index": lp.var, "to": "warp", "count": count})
        return


def _accumulator(prog: Program) -> Iterator[Hint]:
    for d in prog.defs:
        for r in _reductions(d):
            if r.op == "sum" and r.acc is None and isinstance(r.body, (Reduce, Let)):
                yield Hint(f"the sum over tiles {r.var} of {d.name} is not kept in registers: accumulate it there in f32",
                           {"rule": "cache", "def": d.name, "accumulator": r.var, "level": "register",
                            "dtype": "f32"})


def _map_mma(prog: Program) -> Iterator[Hint]:
    for d in prog.defs:
        rows = [lp.var for lp in d.loops if lp.mapping is not None and lp.mapping.level == "warp"]
        for r in _reductions(d):
            if r.op != "sum" or r.mma is not None or _fixed(prog, r.ext) is None:
                continue
            for instr in ("mma_sync", "wgmma"):
                why = f"the tile product over {r.var} < {r.ext} of {d.name} is not on tensor cores ({instr})"
                step = {"rule": "map_mma", "def": d.name, "index": r.var, "instr": instr}
                # an operand computed in registers (P in P·V) needs its rows named
                yield (Hint(why, step), *(Hint(why, {**step, "m": m}) for m in rows))


GENERATORS: tuple[Callable[[Program], Iterator[Hint]], ...] = (
    _split_softmax, _fuse, _assoc, _tile_sums, _online_agg, _tile_loops, _skip_masked, _reorder,
    _cache_tiles, _parallel, _accumulator, _map_mma,
)


def kernel_status(derivation: Any) -> str:
    """Whether the final program is a kernel now, and which mapping prints it (or why not: the
    lowering's or the mappings' reason, as `derivc build` would fail with it)."""
    from .kernel_chain import chain_of

    chain = chain_of(derivation)
    if chain:
        return f"kernels: a chain of {len(chain)} ({', '.join(chain)}), each lowered on its own by derivc build"
    try:
        from codegen.build import CodegenError, prepare, print_checked
    except ImportError:  # pragma: no cover - a compiler-only install
        return "kernel: not checked (codegen not installed)"
    try:
        printed = print_checked(prepare(derivation)[0])
    except CodegenError as exc:
        return f"no kernel yet: {' '.join(str(exc).split())}"
    final = derivation.final
    tail = tail_fold(final.def_named(final.output).body)
    mma = sorted({e.mma.instr for d in final.defs for e in walk(d.body) if isinstance(e, Reduce) and e.mma})
    what = f"tensor cores ({', '.join(mma)})" if mma else "no tensor cores"
    return f"kernel: mapping {printed.mapping}, {what}{', one streaming fold' if tail is not None else ''}"
