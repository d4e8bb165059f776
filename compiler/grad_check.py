"""GRAD's numeric validation: the gradient program against central finite differences.

For each draw (the plain and masked draws of compiler/draws.py, and inputs ×3 at the check sizes) and
each input X the gradient is taken with respect to, a random direction t and a random seed
adjoint g are drawn; the directional derivative of ⟨g, f⟩ along t by central differences of
the forward program in float64,

    D(h) = (⟨g, f(x + h·t)⟩ − ⟨g, f(x − h·t)⟩) / 2h,  taken as (4·D(h/2) − D(h)) / 3,

must equal ⟨dX, t⟩ from the gradient program, to a relative error below TOLERANCE of
Σ |dX|·|t| (the scale of the terms summed, so a cancellation does not hide an error), or of
what the forward's rounding leaves resolvable (a softmax of logits ×100 has derivatives of
1e-76: both are 0 then).  One
direction per input catches a wrong gradient with probability 1; a gradient that is wrong only
where the forward is not differentiable (ties of a max) is not seen — that is what "validated
numerically" means here.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .draws import Draw, DrawPlan
from .errors import DerivationError
from .grad import RULE, Gradient
from .interp import run_program
from .ir import Program

TOLERANCE = 1e-6
LARGE_SCALE = 3.0
# A difference quotient whose step crosses a kink (ReLU's max(x, 0) at x = 0, a tie of a max) is
# not a derivative: a direction fails only if ATTEMPTS random directions all fail — a wrong
# gradient is wrong along almost every direction, a kink is crossed along few.
ATTEMPTS = 3
ROUNDING = 1e-13  # relative rounding error of a float64 forward evaluation, with room
STEP = 1e-4  # with Richardson's extrapolation: truncation ~h⁴, rounding ~1e-16/h


def check_gradient(forward: Program, grad: Gradient, plan: DrawPlan, seed: int) -> list[dict[str, Any]]:
    """One record per draw; raises DerivationError on a mismatch or a non-finite gradient."""
    records = []
    draws = [d for d in plan.draws(seed) if d.kind != "large"]
    # inputs ×3 (attention logits ×9): large, yet not so large that softmax saturates and every
    # derivative underflows below what a difference quotient resolves
    draws.append(Draw("large", seed + 1, dict(plan.sizes), LARGE_SCALE, True))
    for draw in draws:
        rng = np.random.default_rng(draw.seed + 7)
        inputs = draw.inputs(forward)
        with np.errstate(all="ignore"):
            out = run_program(forward, draw.sizes, inputs)[grad.of]
        g = rng.standard_normal(out.shape)
        with np.errstate(all="ignore"):
            grads = run_program(grad.program, draw.sizes, {**inputs, grad.seed: g})
        # what rounding the forward values leaves of a difference quotient
        resolution = ROUNDING * float(np.sum(np.abs(g * out))) / STEP
        errors: dict[str, float] = {}
        for x, dx in grad.grads:
            errors[x] = _directional(forward, grad, draw, inputs, g, x, grads[dx], rng, resolution)
        records.append({"draw": draw.kind, "seed": draw.seed, "sizes": dict(draw.sizes),
                        "scale": draw.scale, "rel_error": errors})
    return records


def _directional(forward: Program, grad: Gradient, draw: Any, inputs: dict[str, np.ndarray], g: np.ndarray,
                 x: str, dx: np.ndarray, rng: np.random.Generator, resolution: float) -> float:
    where = f"d{grad.of}/d{x} at {', '.join(f'{k}={v}' for k, v in draw.sizes.items())} ({draw.kind} draw, seed {draw.seed})"
    if not np.all(np.isfinite(dx)):
        raise DerivationError(RULE, f"numeric check failed: {where}: the gradient has NaN / inf values")
    failures = []
    for _ in range(ATTEMPTS):
        t = rng.standard_normal(inputs[x].shape)
        ad, fd, err = _one_direction(forward, grad, draw, inputs, g, x, dx, t, resolution)
        if err <= TOLERANCE:
            return err
        failures.append((ad, fd, err))
    ad, fd, err = min(failures, key=lambda f: f[2])
    raise DerivationError(RULE, f"numeric check failed: {where}: directional derivative {ad:.10g} from the "
                                f"gradient program, {fd:.10g} by central differences (relative error "
                                f"{err:.3g} > {TOLERANCE:g}, the best of {ATTEMPTS} directions)")


def _one_direction(forward: Program, grad: Gradient, draw: Any, inputs: dict[str, np.ndarray], g: np.ndarray,
                   x: str, dx: np.ndarray, t: np.ndarray, resolution: float) -> tuple[float, float, float]:
    def value(step: float) -> float:
        moved = dict(inputs)
        moved[x] = inputs[x] + step * t
        with np.errstate(all="ignore"):
            return float(np.sum(g * run_program(forward, draw.sizes, moved)[grad.of]))

    def central(h: float) -> float:
        return (value(h) - value(-h)) / (2 * h)

    fd = (4 * central(STEP / 2) - central(STEP)) / 3
    ad = float(np.sum(dx * t))
    # the terms' scale (a cancellation does not hide an error)
    scale = float(np.sum(np.abs(dx) * np.abs(t)))
    err = abs(fd - ad) / max(scale, resolution / TOLERANCE, np.finfo(float).tiny)
    return ad, fd, err
