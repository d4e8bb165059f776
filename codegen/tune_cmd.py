"""`derivc tune DIR --sizes M=128,N=4096,K=4096 [--sizes ...]`: pick a schedule variant per shape.

DIR is a build of a schedule with `variants:` (FILE -o DIR builds it first).  At each shape the
variants are pruned by compiler.tuning_table's rule: the over-split ones are skipped (their grid
at the shape says so), every other one runs on the same inputs and its output must match the
default's within the output dtype's tolerance (the variants are proved equal: a difference is a
miscompile, and tuning stops), then it is screened (SCREEN: a few repetitions), and the KEEP
fastest (and any within WITHIN of the fastest) are timed in full (FULL); device time, CUDA
events behind a sleep kernel.  The fastest finalist per shape bucket goes into DIR/tuning.json
with every measurement and each variant's grid (so `derivc verify` re-applies the rule), and the
build's marker is written again over it, so `derivc verify` and `derivc.load` see the table.
`--budget SECONDS` stops measuring new shapes past that time (they run the default).
A chain of kernels (OUT/kernels.json: split-KV, split-K) is tuned the same way: each variant is a
chain (or, beside chains, one kernel: split-K's S = 1), run and timed whole (its time is the sum
of its kernels' and the intermediates' allocation), bucketed by the spec's dynamic sizes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from compiler.errors import EXIT_DERIVATION_FAILED, EXIT_INVALID_INPUT, EXIT_OK
from compiler.outdir import BUILD_MARKER, foreign_files, write_marker
from compiler.tuning_table import (KEEP, SATURATED_WAVES, TUNING_FILE, WITHIN, Candidate, bucket, chain_dynamic,
                                   finalists, resident_blocks, skipped)
from compiler.variant_build import built_dirs

from .run_cmd import TOLERANCE, parse_sizes, random_inputs_torch
from .tuned import has_chain, open_variant, variant_trace

SPLIT_RULES = ("split_k", "split_kv")


def _error(msg: str) -> int:
    import sys

    sys.stderr.write(f"derivc: error: {msg}\n")
    return EXIT_INVALID_INPUT


@dataclass(frozen=True)
class Timing:
    """One timing of a call: `reps` medians of `inner` back-to-back calls (device time)."""

    reps: int
    inner: int


SCREEN = Timing(reps=3, inner=5)    # rule 2's brief timing of every kept variant
FULL = Timing(reps=15, inner=10)    # the finalists'
SLEEP_CYCLES_PER_CALL = 2_000_000   # ~1 ms at 1.98 GHz per queued call: longer than the host takes to enqueue it


def device_ms(fn: Callable[[], Any], timing: Timing) -> float:
    """Median over `timing.reps` of the mean device time of `timing.inner` back-to-back calls
    (CUDA events).  A sleep kernel is queued first so that the host enqueues the calls while the
    GPU waits: the events time the kernels back to back, not Python's per-call overhead (a chain
    of kernels costs more host time per call than one kernel; the GPU time is what is compared)."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(timing.reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES_PER_CALL * timing.inner)
        start.record()
        for _ in range(timing.inner):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / timing.inner)
    return float(statistics.median(times))


def device_error(got: Any, ref: Any) -> float:
    """compiler.derive.output_error on the GPU (float64): ‖got − ref‖ / ‖ref‖ over the finite
    entries, a -inf of ref matched exactly, inf for a NaN or a shape mismatch."""
    import torch

    if tuple(got.shape) != tuple(ref.shape):
        return float("inf")
    g, r = got.double(), ref.double()
    ninf = r == -torch.inf
    if not torch.equal(g[ninf], r[ninf]):
        return float("inf")
    g, r = g.masked_fill(ninf, 0.0), r.masked_fill(ninf, 0.0)
    if not bool(torch.isfinite(g).all()):
        return float("inf")
    den = float(r.norm())
    num = float((g - r).norm())
    return num / den if den > 0 else num


def tune_shape(cands: tuple[Candidate, ...], check: Callable[[str], None], time_ms: Callable[[str, Timing], float],
               sm_count: int, waves: int = SATURATED_WAVES, keep: int = KEEP, within: float = WITHIN) -> dict[str, Any]:
    """One shape's row by the pruning rule (compiler.tuning_table): skip the over-split variants,
    check and screen the rest, time the finalists in full; the winner is the fastest finalist.
    `check(name)` raises for a variant whose output is wrong; `time_ms(name, timing)` times it."""
    skip = skipped(cands, sm_count, waves)
    kept = [c.name for c in cands if c.name not in skip]
    for name in kept:
        check(name)
    screen = {name: round(time_ms(name, SCREEN), 5) for name in kept}
    full = {name: round(time_ms(name, FULL), 5) for name in finalists(screen, keep, within)}
    best = min(full, key=lambda n: (full[n], n))
    return {"variant": best, "ms": full, "screen_ms": screen, "skipped": skip,
            "candidates": {c.name: c.as_list() for c in cands}}


def _split_factor(variant_dir: Path) -> int:
    """The reduction split factor of a built variant (its SPLIT-K / SPLIT-KV step), 1 without one."""
    trace = json.loads((variant_dir / "derivation.json").read_text())
    return max([int(s["params"]["splits"]) for s in trace["steps"] if s.get("rule") in SPLIT_RULES] or [1])


def _first_printed(v: Any) -> Any:
    """The printed kernel that a variant launches first (its partial kernel, for a chain)."""
    from .tuned import OneKernel

    if isinstance(v, OneKernel):
        return v.build.printed
    if hasattr(v, "kernels"):
        return v.kernels[0].build.printed
    return v.printed  # a CompiledKernel


def candidate(name: str, printed: Any, splits: int, sizes: dict[str, int], limits: dict[str, int]) -> Candidate:
    """A variant at a shape: its first kernel's grid blocks (the largest of its printed variants)
    and the blocks of it one SM holds."""
    from .kir.grid import axis_blocks

    at = {**printed.kernel.fixed(), **sizes}
    blocks, resident = 0, limits["max_blocks"]
    for pv in printed.variants:
        grid = axis_blocks(tuple((axis, ext.evaluate(at)) for axis, ext in pv.launch.grid))
        blocks = max(blocks, math.prod(grid))
        resident = min(resident, resident_blocks(pv.launch.threads, pv.launch.smem_bytes, **limits))
    return Candidate(name, blocks, splits, resident)


def _device_limits() -> tuple[int, dict[str, int]]:
    """(SM count, resident_blocks' limits) of the current GPU."""
    import torch

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return p.multi_processor_count, {"max_threads": int(getattr(p, "max_threads_per_multi_processor", 2048)),
                                     "smem_per_sm": int(getattr(p, "shared_memory_per_multiprocessor", 233472)),
                                     "max_blocks": 32}


def tune(out_dir: Path, shapes: list[dict[str, int]], seed: int = 0, budget_s: float | None = None,
         keep: int = KEEP, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure the built variants at every shape by the pruning rule; return the table (not
    written).  Shapes are measured in the order given; past `budget_s` seconds (from the start,
    loading included) the remaining ones are not (listed under `unmeasured`: the default runs
    there); the first is always measured."""
    import torch

    from compiler.lower_spec import lower_spec
    from compiler.trace import spec_of_trace

    from .build_dir import load_build
    from .cuda.runtime import CompiledKernel

    t0 = time.monotonic()
    dirs = built_dirs(out_dir)
    default = next(iter(dirs))
    if has_chain(out_dir):  # chains (and one-kernel variants beside them: S = 1): run whole, by the spec's sizes
        kernels: dict[str, Any] = {name: open_variant(d) for name, d in dirs.items()}
        program = lower_spec(spec_of_trace(variant_trace(kernels[default])))
        dynamic = chain_dynamic(program)
        order = kernels[default].inputs
    else:
        loaded = {name: load_build(d) for name, d in dirs.items()}
        kernels = {name: CompiledKernel(b.printed, b.cubins) for name, b in loaded.items()}
        program = lower_spec(spec_of_trace(loaded[default].trace))
        dynamic = loaded[default].printed.kernel.dynamic()
        order = loaded[default].inputs
    printed = {name: _first_printed(k) for name, k in kernels.items()}
    splits = {name: _split_factor(d) for name, d in dirs.items()}
    sm_count, limits = _device_limits()
    tol = TOLERANCE[program.tensor_type(program.output).dtype]
    buckets: dict[str, Any] = {}
    unmeasured: list[dict[str, Any]] = []
    for sizes in shapes:
        if budget_s is not None and buckets and time.monotonic() - t0 > budget_s:  # the first shape always
            unmeasured.append({"sizes": sizes, "why": f"past the {budget_s:g} s budget"})
            continue
        at = {**{n: v for n, v in program.sizes if v is not None}, **sizes}
        xs = random_inputs_torch(program, at, seed)
        args = [xs[n] for n in order]
        given = {n: v for n, v in sizes.items() if n in dynamic and not any(n in map(str, t.dims) for _, t in program.inputs)}

        def call(name: str) -> Any:
            got = kernels[name](*args, **given)
            return got[0] if isinstance(got, tuple) else got

        ref = call(default)

        def check(name: str) -> None:
            err = device_error(call(name), ref)
            if not err <= tol:
                raise RuntimeError(f"variant {name} at {sizes}: output differs from the default's by {err:.2e} "
                                   f"(> {tol:.0e}): a miscompile, not a tuning result")

        cands = tuple(candidate(name, printed[name], splits[name], at, limits) for name in kernels)
        row = tune_shape(cands, check, lambda name, timing: device_ms(lambda: call(name), timing), sm_count, keep=keep)
        buckets[bucket(sizes, dynamic)] = {"sizes": sizes, **row}
        if log is not None:
            log(_row_line(bucket(sizes, dynamic), buckets[bucket(sizes, dynamic)]))
        torch.cuda.empty_cache()
    rule = {"sm_count": sm_count, "waves": SATURATED_WAVES, "keep": keep, "within": WITHIN,
            "screen": [SCREEN.reps, SCREEN.inner], "full": [FULL.reps, FULL.inner]}
    return {"dynamic": list(dynamic), "device": torch.cuda.get_device_name(), "rule": rule, "buckets": buckets,
            "unmeasured": unmeasured}


def _row_line(key: str, row: dict[str, Any]) -> str:
    ms = ", ".join(f"{n} {t:.4f} ms" for n, t in sorted(row["ms"].items(), key=lambda x: x[1]))
    pruned = f"; screened {len(row.get('screen_ms', row['ms']))}, skipped {len(row.get('skipped', {}))}"
    return f"{key} ({row['sizes']}): {row['variant']}   [{ms}{pruned}]"


def main(args: argparse.Namespace) -> int:
    out_dir = Path(args.dir)
    if out_dir.suffix in (".yaml", ".yml"):
        if not args.output:
            return _error(f"tune {out_dir}: a schedule file needs -o DIR for its build")
        from compiler.cli import build_to

        build_to(out_dir, Path(args.output), proofs=not args.no_proofs)
        out_dir = Path(args.output)
    foreign = foreign_files(out_dir)
    if foreign is None:
        return _error(f"{out_dir}: not a derivc build directory (no readable {BUILD_MARKER})")
    if foreign:
        return _error(f"{out_dir}: holds {foreign[0]}, which derivc did not write: nothing tuned")
    if len(built_dirs(out_dir)) < 2:
        return _error(f"{out_dir}: one schedule only (no variants: in the spec, or every other variant refused): "
                      "nothing to tune")
    try:
        shapes = [parse_sizes(s) for s in args.sizes]
    except ValueError:
        return _error(f"tune: --sizes {args.sizes}: expected NAME=INT,NAME=INT")
    if not shapes:
        return _error("tune: give at least one --sizes")
    try:
        table = tune(out_dir, shapes, seed=args.seed, budget_s=getattr(args, "budget", None),
                     keep=getattr(args, "keep", None) or KEEP, log=print)
    except (ValueError, RuntimeError) as exc:
        import sys

        sys.stderr.write(f"derivc: error: {out_dir}: tune: {exc}\n")
        return EXIT_DERIVATION_FAILED
    tmp = out_dir / (TUNING_FILE + ".tmp")
    tmp.write_text(json.dumps(table, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, out_dir / TUNING_FILE)
    write_marker(out_dir, BUILD_MARKER)
    for row in table["unmeasured"]:
        print(f"not measured: {row['sizes']} ({row['why']}): the default runs there")
    print(f"wrote {out_dir / TUNING_FILE}")
    return EXIT_OK
