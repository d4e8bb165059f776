"""The sizes at which every derivation step is checked numerically.

Priority: a size named in the spec's `check_sizes` takes that value; a fixed size keeps its
value; every other (dynamic) size gets a small value that is *not* a multiple of any tile
applied along it, so that tiled programs are checked with a partial last tile:

    T_max + T_max // 2 + 1      (two tiles, the second partial), bumped until no tile divides it
    5                           when no tile ranges over the size

Which size a tiled index ranges over is read off the program *at that step*: the extent of the
loop or reduction binding the index is `ceil((S + c) / d)` for some size S, so a tile of t on it
is a tile of d·t on S.  To see the programs at each step, the schedule is replayed without
numeric checks; the replay stops quietly at the first step that fails (the derivation reports
that failure itself, attributed to its step).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .errors import SpecError
from .lower_spec import MAX_CHECK_POINTS
from .ir import Def, Ext, Fold, Program, Reduce, Softmax, walk
from .spec import SpecFile

UNTILED = 5
# Beyond this many points in the largest index space, untiled dynamic sizes shrink to 3.
BIG = 2_000_000


def _binder_extent(d: Def, index: str) -> Ext | None:
    for lp in d.loops:
        if lp.var == index:
            return lp.ext
    for e in walk(d.body):
        if isinstance(e, (Reduce, Softmax, Fold)) and e.var == index:
            return e.ext
    return None


def tile_constraints(prog: Program, params: dict[str, Any]) -> dict[str, set[int]]:
    """{size name: effective tile sizes on it} for one step with an integer `size` parameter."""
    size = params.get("size")
    index = params.get("index")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 1 or not isinstance(index, str):
        return {}
    name = params.get("def")
    defs = [d for d in prog.defs if d.name == name] if isinstance(name, str) else list(prog.defs)
    dynamic = {n for n, v in prog.sizes if v is None}
    out: dict[str, set[int]] = {}
    for d in defs:
        ext = _binder_extent(d, index)
        if ext is None:
            continue
        for aff, div in ext.parts:
            for s, coef in aff.terms:
                if s in dynamic and abs(coef) == 1:
                    out.setdefault(s, set()).add(div * size)
        break
    return out


def _pick(tiles: Iterable[int]) -> int:
    tiles = sorted(set(t for t in tiles if t > 1))
    if not tiles:
        return UNTILED
    t_max = tiles[-1]
    n = t_max + t_max // 2 + 1
    while any(n % t == 0 for t in tiles):
        n += 1
    return n


def choose_check_sizes(
    spec: SpecFile, ir0: Program, programs: list[Program] = (), steps: list[dict[str, Any]] = ()
) -> dict[str, int]:
    """Sizes for the numeric checks of a derivation starting from IR₀ = `ir0`.

    `programs[k]` is the program a step `steps[k]` (its raw parameters) was applied to; the
    lists may be shorter than the schedule (a replay that stopped early).
    """
    declared = [n for n, _ in ir0.sizes]
    for name, value in spec.check_sizes.items():
        if name not in declared:
            raise SpecError(f"check_sizes.{name}", f"unknown size {name!r} (declared: {', '.join(declared)})")
        if value <= 0:
            raise SpecError(f"check_sizes.{name}", f"must be positive, got {value}")
    tiles: dict[str, set[int]] = {}
    for prog, params in zip(programs, steps):
        for s, ts in tile_constraints(prog, params).items():
            tiles.setdefault(s, set()).update(ts)
    out: dict[str, int] = {}
    untiled: list[str] = []
    for name, fixed in ir0.sizes:
        if name in spec.check_sizes:
            out[name] = int(spec.check_sizes[name])
        elif fixed is not None:
            out[name] = fixed
        elif name in tiles:
            out[name] = _pick(tiles[name])
        else:
            out[name] = UNTILED
            untiled.append(name)
    if untiled and _largest_space(ir0, out) > BIG:
        for name in untiled:
            out[name] = 3
    if untiled and _largest_space(ir0, out) > MAX_CHECK_POINTS:  # many batch dims (GQA: B, HK, G)
        for name in untiled:
            out[name] = 2
    return out


def _largest_space(prog: Program, sizes: dict[str, int]) -> int:
    """Points in the largest loop nest × reduction of IR₀ (what the interpreter materialises)."""
    best = 1
    for d in prog.defs:
        n = 1
        for lp in d.loops:
            n *= max(1, lp.ext.evaluate(sizes))
        inner = 1
        for e in walk(d.body):
            if isinstance(e, (Reduce, Softmax, Fold)):
                try:
                    inner = max(inner, e.ext.evaluate(sizes))
                except KeyError:
                    pass
        best = max(best, n * inner)
    return best
