"""The sizes at which every derivation step is checked numerically.

Priority: a size named in the spec's `check_sizes` takes that value; a fixed size keeps its
value; every other (dynamic) size gets a small value that is *not* a multiple of any tile
applied along it, so that tiled programs are checked with a partial last tile:

    T_max + T_max // 2 + 1      (two tiles, the second partial), bumped until no tile divides it
                                and every tiled extent has a partial last tile (see below)
    5                           when no tile ranges over the size

Which size a tiled index ranges over is read off the program *at that step*: the extent of the
loop or reduction binding the index is `ceil((S + c) / d)` for some size S, so a tile of t on it
is a tile of d·t on S.  Each tiled extent is also checked exactly where it is shortest:
ceil((S + c) / d) itself, or, for a tile nested in an outer tile of T (extent S - T·o + c),
the outer tile's last extent (S + c - 1) mod T + 1.  A tile that leaves no partial tile at
the check sizes (a fixed extent it divides, a size given in `check_sizes`) is reported by
`check_size_notes` (derivation.json and report.md say so).  To see the programs at each step, the schedule is replayed without
numeric checks; the replay stops quietly at the first step that fails (the derivation reports
that failure itself, attributed to its step).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import SpecError
from .checkcost import program_points
from .lower_spec import MAX_CHECK_POINTS
from .ir import Aff, Cond, Def, Ext, Fold, Program, Reduce, Select, Softmax, walk
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


@dataclass(frozen=True)
class TiledExtent:
    """A tile of `tile` applied to an extent ceil(num / div) that ranges over the size `size`."""

    size: str
    num: Aff
    div: int
    tile: int

    def last_extent(self, sizes: dict[str, int]) -> int:
        """The extent where it is shortest: the last tile of an outer tiling (num = S - T·o + c,
        the outer indices' coefficients multiples of T)."""
        others = [(n, c) for n, c in self.num.terms if n not in sizes]
        if not others:
            return -(-self.num.evaluate(sizes) // self.div)
        known = Aff.build({n: c for n, c in self.num.terms if n in sizes}, self.num.const)
        step = min(abs(c) for _, c in others)  # the outer tiles start at multiples of it
        outer = step if self.div == 1 and all(c % step == 0 for _, c in others) else self.div * self.tile
        return (known.evaluate(sizes) - 1) % outer + 1

    def partial(self, sizes: dict[str, int]) -> bool:
        return self.last_extent(sizes) % self.tile != 0

    def __str__(self) -> str:
        shown = str(self.num) if self.div == 1 else f"ceil({self.num}/{self.div})"
        return f"tile {self.tile} on {shown}"


def tiled_extents(prog: Program, params: dict[str, Any]) -> list[TiledExtent]:
    """The extents a step with an integer `size` parameter tiles, one per size they range over."""
    size = params.get("size")
    index = params.get("index")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 1 or not isinstance(index, str):
        return []
    name = params.get("def")
    defs = [d for d in prog.defs if d.name == name] if isinstance(name, str) else list(prog.defs)
    declared = {n for n, _ in prog.sizes}
    out: list[TiledExtent] = []
    for d in defs:
        ext = _binder_extent(d, index)
        if ext is None:
            continue
        parts = list(ext.parts)
        if ext.const_value() is not None:  # a tile's inner index: its guard bounds it by a size
            parts = [(bound, 1) for bound in _guard_bounds(d, index)]
        for aff, div in parts:
            for s, coef in aff.terms:
                if s in declared and coef == 1:
                    out.append(TiledExtent(s, aff, div, size))
        break
    return out


def _guard_bounds(d: Def, index: str) -> list[Aff]:
    """For each guard `index + rest < rhs` (or <=) of the definition: rhs - rest (+ 1), the
    number of live values of the index (e.g. M - 128·io for 128·io + ii < M)."""
    conds = list(d.guard) + [c for e in walk(d.body) if isinstance(e, Select) for c in e.conds]
    out = []
    for c in conds:
        if isinstance(c, Cond) and c.lhs.coef(index) == 1 and c.rhs.coef(index) == 0:
            out.append(c.rhs - (c.lhs - Aff.of(index)) + (1 if c.op == "<=" else 0))
    return out


def tiled_sizes(programs: list[Program], steps: list[dict[str, Any]]) -> frozenset[str]:
    """The sizes some step's tile ranges over."""
    return frozenset(t.size for prog, params in zip(programs, steps) for t in tiled_extents(prog, params))


def tile_constraints(prog: Program, params: dict[str, Any]) -> dict[str, set[int]]:
    """{dynamic size name: effective tile sizes on it} for one step (a tile of t on
    ceil((S + c) / d) is a tile of d·t on S)."""
    dynamic = {n for n, v in prog.sizes if v is None}
    out: dict[str, set[int]] = {}
    for t in tiled_extents(prog, params):
        if t.size in dynamic:
            out.setdefault(t.size, set()).add(t.div * t.tile)
    return out


def _pick(tiles: Iterable[int], extents: list[TiledExtent], name: str, sizes: dict[str, int]) -> int:
    tiles = sorted(set(t for t in tiles if t > 1))
    if not tiles:
        return UNTILED
    t_max = tiles[-1]
    n = t_max + t_max // 2 + 1
    for candidate in range(n, n + 4 * t_max):
        trial = {**sizes, name: candidate}
        if not any(candidate % t == 0 for t in tiles) and all(e.partial(trial) for e in extents):
            return candidate
    return n


def choose_check_sizes(
    spec: SpecFile, ir0: Program, programs: list[Program] = (), steps: list[dict[str, Any]] = ()
) -> dict[str, int]:
    """Sizes for the numeric checks of a derivation starting from IR₀ = `ir0`.

    `programs[k]` is the program a step `steps[k]` (its raw parameters) was applied to; the
    lists may be shorter than the schedule (a replay that stopped early).
    """
    declared = list(spec.sizes)  # a backward kernel's program may use only some of them
    for name, value in spec.check_sizes.items():
        if name not in declared:
            raise SpecError(f"check_sizes.{name}", f"unknown size {name!r} (declared: {', '.join(declared)})")
        if value <= 0:
            raise SpecError(f"check_sizes.{name}", f"must be positive, got {value}")
    tiles: dict[str, set[int]] = {}
    extents: dict[str, list[TiledExtent]] = {}
    for prog, params in zip(programs, steps):
        for s, ts in tile_constraints(prog, params).items():
            tiles.setdefault(s, set()).update(ts)
        for t in tiled_extents(prog, params):
            extents.setdefault(t.size, []).append(t)
    out: dict[str, int] = {}
    untiled: list[str] = []
    for name, fixed in ir0.sizes:
        if name in spec.check_sizes:
            out[name] = int(spec.check_sizes[name])
        elif fixed is not None:
            out[name] = fixed
        elif name not in tiles:
            out[name] = UNTILED
            untiled.append(name)
    for name, fixed in ir0.sizes:  # the tiled ones last: an extent may read other sizes
        if name not in out:
            out[name] = _pick(tiles[name], extents.get(name, []), name, {**out, name: 0})
    if untiled and _largest_space(ir0, out) > BIG:
        for name in untiled:
            out[name] = 3
    if untiled and _largest_space(ir0, out) > MAX_CHECK_POINTS:  # many batch dims (GQA: B, HK, G)
        for name in untiled:
            out[name] = 2
    return out


def check_size_notes(
    spec: SpecFile, ir0: Program, sizes: dict[str, int], programs: list[Program] = (),
    steps: list[dict[str, Any]] = (),
) -> list[str]:
    """Where a tile leaves no partial last tile at the check sizes, and why."""
    fixed = dict(ir0.sizes)
    notes: list[str] = []
    for k, (prog, params) in enumerate(zip(programs, steps), start=1):
        for t in tiled_extents(prog, params):
            if t.partial(sizes):
                continue
            if fixed.get(t.size) is not None and t.size not in spec.check_sizes:
                why = f"{t.size} = {sizes[t.size]} is fixed"
            elif t.size in spec.check_sizes:
                why = f"{t.size} = {sizes[t.size]} is given in check_sizes"
            else:
                why = f"no {t.size} near {sizes[t.size]} leaves one for every tile"
            notes.append(f"step {k}: {t} divides it ({why}): no partial last tile")
    return notes


def _largest_space(prog: Program, sizes: dict[str, int]) -> int:
    """Points of the largest array the interpreter materialises for IR₀ (compiler/checkcost.py)."""
    return program_points(prog, sizes)


def check_step_work(programs: list[Program], rules: list[str], steps: list[dict[str, Any]],
                    sizes: dict[str, int]) -> None:
    """Refuse (exit 2, at its step) a step whose numeric check could not run at the check sizes:
    the largest array of the program after the step, counted over padded extents, above
    MAX_CHECK_POINTS.  A tile of t pads an extent n to ceil(n/t)·t and the interpreter evaluates
    every padded point, masked or not: a tile of 2^31 on an extent of 5 is 2^31 points.  (A tile
    longer than a dynamic extent at the check sizes is legitimate: the kernel meets short inputs
    too, and the examples check tiles of 128 at N = 77.)

    `programs[k]` is the program step k+1 applies to, `programs[k + 1]` its result."""
    shown = ", ".join(f"{n}={v}" for n, v in sizes.items())
    for k, (rule, params) in enumerate(zip(rules, steps), start=1):
        if k >= len(programs):
            break
        points = program_points(programs[k], sizes)
        if points > MAX_CHECK_POINTS:
            tile = params.get("size")
            padded = f" (a tile of {tile} pads an extent n to ceil(n/{tile})·{tile})" if rule == "tile" else ""
            raise SpecError(f"schedule[{k - 1}]", f"step {k} ({rule}): the numeric checks would evaluate about "
                                                  f"{points:.3g} points at {shown}, counted over padded extents"
                                                  f"{padded} (limit {MAX_CHECK_POINTS:.3g}): choose smaller tiles, "
                                                  "splits or check_sizes")
