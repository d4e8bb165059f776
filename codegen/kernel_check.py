"""The `kernel` step of every build: the printed kernel.cu, run on the CPU, against the spec.

The lowering step checks the kernel IR; this step checks the text the printers made of it.  The
very source NVRTC compiles is compiled by the host C++ compiler with the instruction wrappers
replaced by their emulation (codegen.emu: threads as fibers, the wrappers' instructions in
scalar C++, each checked against the real instruction on the GPU by tests/gpu), and run at the
derivation's check sizes on several draws of inputs:

- `plain`: standard normal inputs;
- `large`: inputs ×4 (attention logits ×16: a fold that forgets to rescale, or shifts by the
  wrong max, is far off), under the reverse fiber order (a missing barrier shows under one
  order or the other);
- `wide`: every tiled dynamic size at 4.5 of its largest tile (in this kernel) rounded up to a multiple of 8
  (aligned rows reach the unguarded main loops and the TMA kernels, five tiles wrap every
  pipeline ring), batch sizes at 1, the seeded random fiber order;
- `masked`: where the derivation's numeric checks found sizes that leave a row with no live key
  (a dynamic window W = 0) and the check sizes have none, the kernel runs there too (the spec
  gives 0 for such a row; strict causal's row 0 is masked at the check sizes already).

Inputs are rounded to the kernel's input dtypes; the reference is the final program in the
float64 interpreter on the rounded inputs.  A draw passes when the output is finite where the
reference is, ‖out − ref‖ / ‖ref‖ ≤ the dtype's tolerance (fp32 1e-5, fp16 2e-3, bf16 1e-2),
and no element is off by more than 16 tolerances of the largest reference magnitude (a single
wrong row or tail element does not hide in the norm).  Each draw runs the variant the host
would pick at its sizes (cp.async or TMA kernel); a variant no draw reached runs once more at
the check sizes rounded up to multiples of 8.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from compiler.derive import checked_outputs, output_error
from compiler.interp import run_program
from compiler.kernel_view import kernel_view, written_by
from compiler.ir import Program

from .kir.ir import Kernel, TileLoop, statements

from .mappings import Printed
from .run_cmd import TOLERANCE  # the GPU check's tolerances by output dtype: one table

ELEMENT_FACTOR = 16.0  # an element's error against the tolerance, relative to max |ref|
KERNEL_SEED_OFFSET = 2000  # the kernel step's seed: base seed + number of steps + this


@dataclass(frozen=True)
class Draw:
    name: str
    scale: float
    order: str  # fiber scheduling order of the emulation
    at: str  # the sizes: "check", "wide" (below) or "masked" (the derivation's masked draw)


DRAWS = (Draw("plain", 1.0, "forward", "check"), Draw("large", 4.0, "reverse", "check"),
         Draw("wide", 1.0, "random", "wide"), Draw("masked", 1.0, "reverse", "masked"))


class KernelCheckError(Exception):
    """The kernel text disagrees with the spec on the CPU (or could not run there)."""


def compare(got: np.ndarray, ref: np.ndarray, dtype: str, tol_dtype: str | None = None) -> dict[str, Any]:
    """The draw's verdict: norm error, worst element, and where the output is not finite
    (tol_dtype: the dtype whose tolerance applies, when the kernel rounds the value through it)."""
    tol = TOLERANCE[tol_dtype or dtype]
    if dtype == "f16":  # what an f16 output can hold at best: a reference below f16's range is 0
        with np.errstate(over="ignore"):
            ref = ref.astype(np.float16).astype(np.float64)
    finite_ref = np.isfinite(ref)
    bad = (~np.isfinite(got) & finite_ref) | (~finite_ref & (got != ref))  # an infinity of ref must be matched
    top = float(np.abs(ref[finite_ref]).max()) if finite_ref.any() else 0.0
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: not used
        diff = np.abs(np.where(finite_ref & np.isfinite(got), got - ref, 0.0))
    worst = int(np.argmax(diff)) if diff.size else 0
    elem = (float(diff.flat[worst]) if diff.size else 0.0) / (top or 1.0)
    err = output_error(got, ref)
    passed = (not bad.any()) and err <= tol and elem <= ELEMENT_FACTOR * tol
    record = {"rel_error": err if math.isfinite(err) else "inf", "max_elem_error": elem,
              "nonfinite": int(bad.sum()), "passed": bool(passed)}
    if not passed:
        idx = np.argwhere(bad)[0] if bad.any() else np.unravel_index(worst, ref.shape)
        record["first_bad_index"] = [int(i) for i in idx]
        record["got"] = _num(float(got[tuple(idx)]))
        record["want"] = _num(float(ref[tuple(idx)]))
    return record


def rounding_dtype(printed: Printed, dtype: str) -> str:
    """The dtype whose tolerance an output of `dtype` is held to: a tensor-core attention rounds
    its probabilities P to the operands' dtype for the P·V product, so an f32 output it computes
    (SPLIT-KV's unnormalised partial acc) carries that dtype's rounding; otherwise `dtype` (the
    statistics m, l beside it are not products: the caller keeps their own dtype's)."""
    from .mappings.plan import AttentionPlan

    plan = printed.plan
    if isinstance(plan, AttentionPlan) and plan.mma is not None and TOLERANCE[plan.q.dtype] > TOLERANCE[dtype]:
        return plan.q.dtype
    return dtype


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def given_sizes(printed: Printed, sizes: dict[str, int]) -> dict[str, int]:
    """The dynamic sizes no input's shape determines (passed by name at a call)."""
    kernel = printed.kernel
    from_shapes = {a.terms[0][0] for t in kernel.inputs for a in t.dims
                   if len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const}
    return {n: sizes[n] for n in kernel.dynamic() if n not in from_shapes}


def kernel_tiles(kernel: Kernel) -> dict[str, int]:
    """{dynamic size: the largest tile the kernel's own grid, tile loops and strided lanes divide
    it by} (an extent ceil(.. N ../T) tiles N by T)."""
    exts = [g.ext for g in kernel.grid] + [s.ext for s in statements(kernel.body) if isinstance(s, TileLoop)] \
        + [ln.ext for ln in kernel.lanes if ln.ext is not None]
    out: dict[str, int] = {}
    for ext in exts:
        for num, div in ext.parts:
            for n in num.names():
                if div > 1:
                    out[n] = max(out.get(n, 0), div)
    return out


def wide_sizes(printed: Printed, sizes: dict[str, int], tiles: dict[str, int]) -> dict[str, int]:
    """Sizes that reach what the check sizes do not: every tiled dynamic size at 4.5 tiles of its
    largest tile rounded up to a multiple of 8 (aligned rows: the unguarded main loops and the
    TMA kernels; five tiles: every pipeline ring of up to four stages wraps; still a partial last
    tile), the length of a lane threads stride over (a dynamic row) rounded up to a multiple of 8
    (its vector path), every other dynamic size that an input's shape gives at 1 (batch dims: the
    cost).  A chain kernel gets the whole derivation's tiles: a size is held to the largest tile
    this kernel divides it by where that is smaller (the split-K partial sums of a tuned GEMM are
    not run at 4.5 tiles of the combine's 1024 columns: 4.5 of their own 128 wrap every ring)."""
    own = kernel_tiles(printed.kernel)
    tiles = {n: min(t, own[n]) if own.get(n) else t for n, t in tiles.items()}
    dyn = set(printed.kernel.dynamic())
    given = given_sizes(printed, sizes)
    strided = {n for ln in printed.kernel.lanes if ln.extent is None for n in ln.ext.names()}
    out = dict(sizes)
    for n in dyn:
        if n in tiles:
            out[n] = -(-(4 * tiles[n] + tiles[n] // 2 + 1) // 8) * 8
        elif n in strided:
            out[n] = -(-max(1, sizes[n]) // 8) * 8
        elif n not in given:
            out[n] = 1
    return out


def aligned_sizes(printed: Printed, sizes: dict[str, int]) -> dict[str, int]:
    """The check sizes with every dynamic size rounded up to a multiple of 8 (16-byte rows)."""
    dyn = set(printed.kernel.dynamic())
    return {n: (-(-v // 8) * 8 if n in dyn and v > 0 else v) for n, v in sizes.items()}


Runner = Callable[..., np.ndarray]


def check_kernel_text(printed: Printed, program: Program, sizes: dict[str, int], seed: int,
                      tiles: dict[str, int] | None = None, masked_sizes: dict[str, int] | None = None,
                      runner: Runner | None = None) -> dict[str, Any]:
    """Run the kernel text on the CPU for every draw, each on the variant the host picks at its
    sizes, and every variant no draw reached once more at aligned sizes; the step's record.
    Raises KernelCheckError with a one-line reason on the first failing draw."""
    from .emu import run_printed

    runner = runner or run_printed
    at = {"check": dict(sizes), "wide": wide_sizes(printed, sizes, tiles or {}), "masked": masked_sizes}
    plan = [(d, at[d.at], None) for d in DRAWS if at[d.at] is not None]
    records: list[dict[str, Any]] = []
    k = 0
    while k < len(plan):
        draw, vs, forced = plan[k]
        records.append(_run_draw(printed, program, draw, vs, seed + k, forced, runner))
        k += 1
        if k == len(plan):
            reached = {r["variant_index"] for r in records}
            plan += [(Draw("variant", 1.0, "forward", "check"), aligned_sizes(printed, sizes), v)
                     for v in range(len(printed.variants)) if v not in reached]
    return {"draws": records, "passed": True}


def _run_draw(printed: Printed, program: Program, draw: Draw, vs: dict[str, int], draw_seed: int,
              forced: int | None, runner: Runner) -> dict[str, Any]:
    from compiler.int_inputs import int_input

    from .emu import EmuError, VariantUnavailable, from_storage, to_storage

    rng = np.random.default_rng(draw_seed)
    exact = {}
    for name, t in program.inputs:
        shape = tuple(a.evaluate(vs) for a in t.dims)
        # the inputs' values once rounded to their dtype: what the kernel reads, in float64
        if t.dtype == "i32":  # data of conditions (targets, document ids): drawn for their use
            exact[name] = int_input(program, name, shape, vs, rng)
            continue
        exact[name] = from_storage(to_storage(rng.standard_normal(shape) * draw.scale, t.dtype),
                                   t.dtype).astype(np.float64)
    if any(d.computed_by for d in program.defs):  # written by another step, stored in its dtype
        tensors = run_program(program, vs, exact)
        for d in program.defs:
            if d.computed_by:
                for name in written_by(d):  # the definition and its further outputs (a split's m, l)
                    dtype = program.tensor_type(name).dtype
                    exact[name] = from_storage(to_storage(tensors[name], dtype), dtype).astype(np.float64)
        program = kernel_view(program)
    tensors = run_program(program, vs, exact)
    names = [t.name for t in printed.kernel.outputs]
    if set(names) != set(checked_outputs(program)):
        raise KernelCheckError(f"the kernel writes {', '.join(names)}, the program's outputs are "
                               f"{', '.join(checked_outputs(program))}")
    args = [exact[t.name] for t in printed.kernel.inputs]
    # the host hook picks a TMA kernel (a later variant) whenever sizes and pointers allow it, and
    # run_printed refuses a variant the host would not pick: the first one that runs is the host's
    candidates = [forced] if forced is not None else reversed(range(len(printed.variants)))
    got, variant, last = None, None, None
    for v in candidates:
        stem = printed.variants[v].stem
        try:
            got = runner(printed, v, args, given_sizes(printed, vs), order=draw.order, seed=draw_seed)
            variant = v
            break
        except VariantUnavailable as exc:
            last = exc
        except (EmuError, ValueError) as exc:
            raise KernelCheckError(f"{stem}.cu on the CPU, draw {draw.name} at {_sizes(vs)}: {exc}") from None
    if variant is None:
        raise KernelCheckError(f"no kernel variant runs at {_sizes(vs)}: {last}")
    stem = printed.variants[variant].stem
    got_all = got if isinstance(got, tuple) else (got,)
    verdicts = {}
    for name, out in zip(names, got_all):  # every output of the kernel against the spec
        dtype = program.tensor_type(name).dtype
        tol_dtype = rounding_dtype(printed, dtype) if name == printed.kernel.output.name else dtype
        verdict = verdicts[name] = compare(np.asarray(out, dtype=np.float64), tensors[name], dtype, tol_dtype)
        if not verdict["passed"]:
            where = ""
            if "first_bad_index" in verdict:
                where = f"; {name}{verdict['first_bad_index']} = {verdict['got']}, expected {verdict['want']}"
            raise KernelCheckError(
                f"{stem}.cu on the CPU disagrees with the spec, draw {draw.name} (seed {draw_seed}) at {_sizes(vs)}: "
                f"{name}: relative error {verdict['rel_error']}, worst element {verdict['max_elem_error']:.3g} of "
                f"max|ref| (tolerance {TOLERANCE[tol_dtype]:.0e}){where}")
    main = verdicts[names[0]]
    record = {"variant": stem, "variant_index": variant, "draw": draw.name, "scale": draw.scale,
              "order": draw.order, "seed": draw_seed, "sizes": vs,
              "tolerance": TOLERANCE[rounding_dtype(printed, program.tensor_type(names[0]).dtype)], **main}
    if len(names) > 1:
        record["outputs"] = verdicts
    return record


def _sizes(s: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in s.items())
