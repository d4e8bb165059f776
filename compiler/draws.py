"""The inputs of the per-step numeric checks: several draws per step, all from the step's seed.

Step k (seed s = base + k) is checked on each draw of the plan; draw number n uses seed
s + n·2³², so a derivation re-run with the recorded base seed draws the same inputs:

- `plain`  standard normal inputs at the check sizes;
- `large`  standard normal × σ·(1 + 3t), t ∈ [0, 1) the element's position in its input
  (row-major), at the check sizes with every dynamic size that no tile ranges over and no mask
  reads at 1 (one batch and head: the overflow and the rescale are per row).  σ is chosen once
  per derivation so that the spec's largest live softmax score is about 2,000, and adjusted per
  step until it passes twice 709.78: exp of a score without the right shift overflows float64,
  so a wrong running max gives inf / NaN.  The magnitudes grow along every input, so along the
  keys of a row too: a streaming max keeps growing from tile to tile and a missing rescale
  shows in (nearly) every row.  Without a softmax, σ = 100.
- `masked` standard normal at sizes where a row of a softmax or of a guarded reduction has no
  live element (the spec gives 0 there, by x / 0 = 0): only when the check sizes have no such
  row and a dynamic size that the masks read but no shape nor extent (a window W) can make
  one (0 or 1).

The scores and the masked rows are read off IR₀ by probes: for each softmax (and guarded
reduction), a definition over its row indices and reduced index that the interpreter runs.
The plan is made from IR₀ alone (its large draw at seed base, which no step uses).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from .ir import (
    Aff, Bin, Cond, Const, Def, Expr, Loop, Program, Reduce, Select, Softmax, TensorType, Un, free_indices,
)
from .int_inputs import int_input
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
        for name, t in prog.inputs:
            if t.dtype == "i32":  # data of conditions: never scaled
                out[name] = int_input(prog, name, shape_of(prog, name, self.sizes), self.sizes, rng)
                continue
            x = rng.standard_normal(shape_of(prog, name, self.sizes))
            if self.ramp and x.size:
                x = x * (1.0 + RAMP * np.arange(x.size).reshape(x.shape) / x.size)
            out[name] = x * self.scale if self.scale != 1.0 else x
        return out

    def record(self, rel_error: float, check_sizes: dict[str, int], score: float, masked_rows: int) -> dict[str, Any]:
        """The draw as derivation.json records it (its sizes where they are not the check sizes)."""
        out: dict[str, Any] = {"kind": self.kind, "seed": self.seed, "scale": self.scale}
        if self.ramp:
            out["ramp"] = RAMP
        if self.sizes != check_sizes:
            out["sizes"] = dict(self.sizes)
        if self.kind == "large":
            out["score_max"] = score
        out["masked_rows"] = masked_rows
        out["rel_error"] = rel_error
        return out


@dataclass(frozen=True)
class DrawPlan:
    sizes: dict[str, int]  # the check sizes
    large_sizes: dict[str, int]  # the check sizes, batch-like sizes at 1
    large_scale: float
    degree: float  # the largest score grows as scale ** degree
    score_max: float  # the spec's largest softmax score on the plan's large draw (0: no softmax)
    masked_rows: int  # rows without a live element at the check sizes
    masked_sizes: dict[str, int] | None  # sizes of the masked draw (None: none)
    masked_draw_rows: int = 0
    large_masked_rows: int = 0

    def draws(self, seed: int) -> tuple[Draw, ...]:
        out = [Draw("plain", seed, self.sizes), Draw("large", seed + STREAM, self.large_sizes, self.large_scale, True)]
        if self.masked_sizes is not None:
            out.append(Draw("masked", seed + 2 * STREAM, self.masked_sizes))
        return tuple(out)

    def masked_rows_of(self, draw: Draw) -> int:
        return {"plain": self.masked_rows, "large": self.large_masked_rows}.get(draw.kind, self.masked_draw_rows)

    def to_json(self) -> dict[str, Any]:
        return {
            "kinds": [d.kind for d in self.draws(0)],
            "large_sizes": self.large_sizes,
            "large_scale": self.large_scale,
            "score_degree": self.degree,
            "large_score_max": self.score_max,
            "masked_rows_at_check_sizes": self.masked_rows,
            "masked_sizes": self.masked_sizes,
            "masked_draw_rows": self.masked_draw_rows,
        }


# --------------------------------------------------------------------------- the probes


def _probe_defs(prog: Program, scores: bool) -> list[Def]:
    """For every softmax (and, without `scores`, every guarded reduction): a definition over its
    row indices and its reduced index, valued the score (or 0) where live, NaN where masked,
    -inf off its path."""
    out: list[Def] = []
    nan, off, zero = Const(float("nan")), Const(float("-inf")), Const(0.0)

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
            value = e.score if scores else zero
            site(loops, conds, var, Select(e.mask, value, nan) if e.mask else value)
            visit(e.score, loops + (var,), conds + e.mask)
        elif isinstance(e, Reduce):
            var = Loop(e.var, e.ext)
            body = e.body
            if isinstance(body, Select) and isinstance(body.other, Const) and body.other.value in (0.0, -math.inf):
                if not scores:
                    site(loops, conds, var, Select(body.conds, zero, nan))
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


def empty_rows(prog: Program, sizes: Mapping[str, int]) -> int:
    """Rows of a softmax or guarded reduction of `prog` (IR₀) with no live element at `sizes`,
    counted over the indices its mask reads (a causal row 0 counts once, whatever the heads);
    a mask on integer data is counted on one draw of it (seed 0)."""
    count = 0
    rng = np.random.default_rng(0)  # a mask on integer data: counted on one draw of that data
    data = {n: int_input(prog, n, shape_of(prog, n, sizes), sizes, rng) for n, t in prog.inputs if t.dtype == "i32"}
    for probe in _probe_defs(prog, scores=False):
        values = run_def(probe, sizes, data)
        if values.size:
            count += int(np.sum(np.all(np.isnan(values), axis=-1)))
    return count


def score_max(prog: Program, sizes: Mapping[str, int], tensors: dict[str, np.ndarray]) -> float:
    """The largest live softmax score of a run of `prog` (IR₀) at `sizes` (0 when none is positive)."""
    best = 0.0
    for probe in _probe_defs(prog, scores=True):
        values = run_def(probe, sizes, tensors)
        live = values[np.isfinite(values)]
        if live.size:
            best = max(best, float(live.max()))
    return best


# --------------------------------------------------------------------------- the plan


def reference(ir0: Program, draw: Draw, degree: float = 1.0) -> tuple[Draw, dict[str, np.ndarray], float]:
    """IR₀'s tensors on the draw and its largest softmax score.  A large draw is rescaled (a
    few times at most) until that score passes twice the float64 overflow of exp while IR₀'s
    output stays finite: σ is the plan's, adjusted to the step's own inputs."""
    for _ in range(6):
        tensors = run_program(ir0, draw.sizes, draw.inputs(ir0))
        if draw.kind != "large":
            return draw, tensors, 0.0
        score = score_max(ir0, draw.sizes, tensors)
        if not np.all(np.isfinite(tensors[ir0.output])):  # the spec overflows: toward 1
            scale = math.sqrt(draw.scale) if draw.scale > 1.0001 else 1.0
        elif score == 0.0 or score >= 2 * OVERFLOW:
            return draw, tensors, score
        else:
            scale = draw.scale * min(1e3, (TARGET_SCORE / max(score, 1e-3)) ** (1.0 / degree))
        if scale == draw.scale:
            break
        draw = replace(draw, scale=scale)
    return draw, tensors, score_max(ir0, draw.sizes, tensors)


def _large_scale(ir0: Program, sizes: dict[str, int], seed: int) -> tuple[float, float, float]:
    """σ of the large draw, the degree of the largest score in σ, and that score at σ."""
    def score_at(scale: float) -> float:
        draw = Draw("large", seed, sizes, scale, True)
        return score_max(ir0, sizes, run_program(ir0, sizes, draw.inputs(ir0)))

    one = score_at(1.0)
    if one == 0.0:
        scale, degree = NO_SOFTMAX_SCALE, 1.0
    else:
        degree = min(4.0, max(0.5, math.log2(max(score_at(2.0), 1e-300) / one)))
        scale = (TARGET_SCORE / one) ** (1.0 / degree)
    draw, _, score = reference(ir0, Draw("large", seed, sizes, scale, True), degree)
    return draw.scale, degree, score


def _mask_sizes(ir0: Program) -> tuple[set[str], set[str]]:
    """(sizes read by a mask or guard, sizes in a shape or an extent)."""
    shaped: set[str] = set()
    for _, t in list(ir0.inputs) + [(d.name, d.type) for d in ir0.defs]:
        shaped |= set().union(*(a.names() for a in t.dims))
    masked: set[str] = set()
    for p in _probe_defs(ir0, scores=False):
        shaped |= set().union(*(a.names() for a in p.type.dims))
        masked |= free_indices(p.body)
    return masked, shaped


def plan_draws(ir0: Program, sizes: dict[str, int], base: int, tiled: frozenset[str] = frozenset()) -> DrawPlan:
    """The draws every step of a derivation from IR₀ is checked on; `tiled`: the sizes a tile
    ranges over (they keep their check size in every draw)."""
    masked, shaped = _mask_sizes(ir0)
    dynamic = [n for n, v in ir0.sizes if v is None]
    # the overflow and the rescale are per row: one batch / head is enough for the large draw
    large_sizes = {n: 1 if n in dynamic and n not in tiled and n not in masked else v for n, v in sizes.items()}
    scale, degree, score = _large_scale(ir0, large_sizes, base)
    rows = empty_rows(ir0, sizes)
    masked_sizes, masked_rows = None, 0
    for name in [n for n in dynamic if n in masked and n not in shaped] if not rows else []:
        for value in (0, 1):
            trial = {**sizes, name: value}
            if empty_rows(ir0, trial):
                masked_sizes, masked_rows = trial, empty_rows(ir0, trial)
                break
        if masked_sizes is not None:
            break
    return DrawPlan(dict(sizes), large_sizes, scale, degree, score, rows, masked_sizes, masked_rows,
                    empty_rows(ir0, large_sizes))
