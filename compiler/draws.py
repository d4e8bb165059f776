"""The inputs of the per-step numeric checks: several draws per step, all from the step's seed.

Step k (seed s = base + k) is checked on each draw of the plan; draw number n uses seed
s + n·2³², so a derivation re-run with the recorded base seed draws the same inputs:

- `plain`  standard normal inputs at the check sizes;
- `large`  standard normal × σ·(1 + 3t) at the check sizes, t ∈ [0, 1) the element's position in
  its input (row-major).  σ is chosen once per derivation so that the spec's largest softmax
  score is about 2,000: exp of a score without the right shift overflows float64 (beyond
  709.78), so a wrong running max gives inf / NaN.  The magnitudes grow along every input, so
  along the keys of a row too: a streaming max keeps growing from tile to tile and a missing
  rescale shows in (nearly) every row.  Without a softmax, σ = 100.
- `masked` standard normal at sizes where a row of a softmax or of a guarded reduction has no
  live element (the spec gives 0 there, by x / 0 = 0): only when the check sizes have no such
  row and a size that appears in the masks only (a window W) can make one (0 or 1).

The plan is made from IR₀ alone (a probe draw at seed base, which no step uses), so every step
of a derivation is checked on draws of the same kinds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from .ir import (
    Aff, Bin, Cond, Const, Def, Expr, Ext, Loop, Program, Reduce, Select, Softmax, TensorType, Un, free_indices,
)
from .interp import run_def, run_program, shape_of

STREAM = 2**32  # draw n of a step uses seed + n·STREAM
RAMP = 3.0  # the large draw's magnitude grows by 1 + RAMP along each input
TARGET_SCORE = 2000.0  # the large draw's largest softmax score (exp overflows float64 beyond 709.78)
OVERFLOW = 709.78
NO_SOFTMAX_SCALE = 100.0


@dataclass(frozen=True)
class Draw:
    kind: str  # plain | large | masked
    seed: int
    sizes: dict[str, int]
    scale: float = 1.0
    ramp: bool = False

    def inputs(self, prog: Program) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        out = {}
        for name, _ in prog.inputs:
            x = rng.standard_normal(shape_of(prog, name, self.sizes))
            if self.ramp and x.size:
                x = x * (1.0 + RAMP * np.arange(x.size).reshape(x.shape) / x.size)
            out[name] = x * self.scale if self.scale != 1.0 else x
        return out

    def record(self, rel_error: float, stats: "RowStats") -> dict[str, Any]:
        """The draw as derivation.json records it."""
        out: dict[str, Any] = {"kind": self.kind, "seed": self.seed, "scale": self.scale}
        if self.ramp:
            out["ramp"] = RAMP
        if self.kind == "masked":
            out["sizes"] = dict(self.sizes)
        out["score_max"] = stats.score_max
        out["masked_rows"] = stats.empty_rows
        out["rel_error"] = rel_error
        return out


@dataclass(frozen=True)
class DrawPlan:
    sizes: dict[str, int]  # the check sizes
    large_scale: float
    degree: float  # the largest score grows as scale ** degree
    score_max: float  # the spec's largest softmax score on the probe's large draw (0: no softmax)
    masked_rows: int  # rows without a live element at the check sizes
    masked_sizes: dict[str, int] | None  # sizes of the masked draw (None: none)
    masked_draw_rows: int = 0

    def draws(self, seed: int) -> tuple[Draw, ...]:
        out = [Draw("plain", seed, self.sizes), Draw("large", seed + STREAM, self.sizes, self.large_scale, True)]
        if self.masked_sizes is not None:
            out.append(Draw("masked", seed + 2 * STREAM, self.masked_sizes))
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "kinds": [d.kind for d in self.draws(0)],
            "large_scale": self.large_scale,
            "score_degree": self.degree,
            "large_score_max": self.score_max,
            "masked_rows_at_check_sizes": self.masked_rows,
            "masked_sizes": self.masked_sizes,
            "masked_draw_rows": self.masked_draw_rows,
        }


# --------------------------------------------------------------------------- the probe


@dataclass(frozen=True)
class RowStats:
    score_max: float  # largest live softmax score (0 when none is positive)
    empty_rows: int  # rows of a softmax / guarded reduction with no live element


def _probe_defs(prog: Program) -> list[Def]:
    """For every softmax and guarded reduction: a definition over its row indices and its
    reduced index, valued the score where live, NaN where masked, -inf off its path."""
    out: list[Def] = []
    nan, off = Const(float("nan")), Const(float("-inf"))

    def site(loops: tuple[Loop, ...], conds: tuple[Cond, ...], var: Loop, value: Expr) -> None:
        value = Select(conds, value, off) if conds else value
        used = free_indices(value)
        kept = tuple(lp for lp in loops if lp.var in used) + (var,)
        dims = []
        for lp in kept:
            num, div = lp.ext.parts[0]
            if len(lp.ext.parts) != 1 or div != 1 or num.names() & {x.var for x in loops + (var,)}:
                return  # an extent that varies along the nest: not probed
            dims.append(num)
        out.append(Def(f"__probe{len(out)}", TensorType(tuple(dims), "f64"), kept,
                       tuple(Aff.of(lp.var) for lp in kept), value))

    def visit(e: Expr, loops: tuple[Loop, ...], conds: tuple[Cond, ...]) -> None:
        if isinstance(e, Softmax):
            var = Loop(e.var, e.ext)
            site(loops, conds, var, Select(e.mask, e.score, nan) if e.mask else e.score)
            visit(e.score, loops + (var,), conds + e.mask)
        elif isinstance(e, Reduce):
            var = Loop(e.var, e.ext)
            body = e.body
            if isinstance(body, Select) and isinstance(body.other, Const) and body.other.value in (0.0, -math.inf):
                site(loops, conds, var, Select(body.conds, Const(0.0), nan))
                visit(body.then, loops + (var,), conds + body.conds)
            else:
                visit(body, loops + (var,), conds)
        elif isinstance(e, Select):
            visit(e.then, loops, conds + e.conds)
            visit(e.other, loops, conds)
        elif isinstance(e, (Bin, Un)):
            for c in (e.a, e.b) if isinstance(e, Bin) else (e.a,):
                visit(c, loops, conds)

    for d in prog.defs:
        visit(d.body, d.loops, d.guard)
    return out


def row_stats(prog: Program, sizes: Mapping[str, int], tensors: dict[str, np.ndarray]) -> RowStats:
    """The probe on tensors of a run of `prog` (IR₀) at `sizes`."""
    score, empty = 0.0, 0
    for probe in _probe_defs(prog):
        values = run_def(probe, sizes, tensors)
        if values.size == 0:
            continue
        empty += int(np.sum(np.all(np.isnan(values), axis=-1)))
        finite = values[np.isfinite(values)]
        if finite.size:
            score = max(score, float(finite.max()))
    return RowStats(score, empty)


# --------------------------------------------------------------------------- the plan


def _run(ir0: Program, draw: Draw) -> tuple[bool, RowStats]:
    tensors = run_program(ir0, draw.sizes, draw.inputs(ir0))
    finite = bool(np.all(np.isfinite(tensors[ir0.output])))
    return finite, row_stats(ir0, draw.sizes, tensors)


def _large_scale(ir0: Program, sizes: dict[str, int], seed: int) -> tuple[float, float, float]:
    """σ of the large draw, the degree of the largest score in σ, and that score at σ."""
    _, one = _run(ir0, Draw("large", seed, sizes, 1.0, True))
    if one.score_max == 0.0:
        scale, degree = NO_SOFTMAX_SCALE, 1.0
    else:
        _, two = _run(ir0, Draw("large", seed, sizes, 2.0, True))
        degree = min(4.0, max(0.5, math.log2(max(two.score_max, 1e-300) / one.score_max)))
        scale = (TARGET_SCORE / one.score_max) ** (1.0 / degree)
    draw, _, stats = reference(ir0, Draw("large", seed, sizes, scale, True), degree)
    return draw.scale, degree, stats.score_max


def reference(
    ir0: Program, draw: Draw, degree: float = 1.0
) -> tuple[Draw, dict[str, np.ndarray], RowStats]:
    """IR₀'s tensors on the draw, with the probe's statistics.  A large draw is rescaled (at most
    a few times) until its largest softmax score passes twice the float64 overflow of exp while
    IR₀ stays finite: its σ is the plan's, adjusted to the step's own inputs."""
    for _ in range(6):
        tensors = run_program(ir0, draw.sizes, draw.inputs(ir0))
        stats = row_stats(ir0, draw.sizes, tensors)
        finite = bool(np.all(np.isfinite(tensors[ir0.output])))
        if draw.kind != "large" or draw.scale == 1.0 and finite and stats.score_max == 0.0:
            return draw, tensors, stats
        if not finite:  # the spec overflows: toward 1
            scale = math.sqrt(draw.scale) if draw.scale > 1.0001 else 1.0
        elif stats.score_max == 0.0 or stats.score_max >= 2 * OVERFLOW:
            return draw, tensors, stats
        else:
            scale = draw.scale * min(1e3, (TARGET_SCORE / max(stats.score_max, 1e-3)) ** (1.0 / degree))
        draw = replace(draw, scale=scale)
    return draw, tensors, stats


def _mask_only_sizes(ir0: Program) -> list[str]:
    """Dynamic sizes read by a mask or guard but by no shape nor extent (a window W)."""
    shaped: set[str] = set()
    for _, t in ir0.inputs:
        shaped |= set().union(*(a.names() for a in t.dims))
    masked: set[str] = set()
    for p in _probe_defs(ir0):
        shaped |= set().union(*(a.names() for a in p.type.dims))
        masked |= free_indices(p.body)
    for d in ir0.defs:
        shaped |= set().union(*(a.names() for a in d.type.dims))
    return [n for n, v in ir0.sizes if v is None and n in masked and n not in shaped]


def plan_draws(ir0: Program, sizes: dict[str, int], base: int) -> DrawPlan:
    """The draws every step of a derivation from IR₀ is checked on."""
    scale, degree, score = _large_scale(ir0, sizes, base)
    _, plain = _run(ir0, Draw("plain", base, sizes))
    masked_sizes, masked_rows = None, 0
    if plain.empty_rows == 0:
        for name in _mask_only_sizes(ir0):
            for value in (0, 1):
                trial = {**sizes, name: value}
                finite, stats = _run(ir0, Draw("masked", base, trial))
                if finite and stats.empty_rows:
                    masked_sizes, masked_rows = trial, stats.empty_rows
                    break
            if masked_sizes is not None:
                break
    return DrawPlan(dict(sizes), scale, degree, score, plain.empty_rows, masked_sizes, masked_rows)
