"""`derivc tune DIR --sizes M=128,N=4096,K=4096 [--sizes ...]`: pick a schedule variant per shape.

DIR is a build of a schedule with `variants:` (FILE -o DIR builds it first).  At each shape
every built variant runs on the same inputs; its output must match the default's within the
output dtype's tolerance (the variants are proved equal: a difference is a miscompile, and
tuning stops), then it is timed (median of `triton.testing.do_bench`).  The fastest per shape
bucket (compiler.tuning_table) goes into DIR/tuning.json with every measurement, and the build's
marker is written again over it, so `derivc verify` and `derivc.load` see the table.
A chain of kernels (OUT/kernels.json: split-KV, split-K) is tuned the same way: each variant is a
chain (or, beside chains, one kernel: split-K's S = 1), run and timed whole (its time is the sum
of its kernels' and the intermediates' allocation), bucketed by the spec's dynamic sizes.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from compiler.errors import EXIT_DERIVATION_FAILED, EXIT_INVALID_INPUT, EXIT_OK
from compiler.outdir import BUILD_MARKER, foreign_files, write_marker
from compiler.tuning_table import TUNING_FILE, bucket, chain_dynamic
from compiler.variant_build import built_dirs

from .run_cmd import TOLERANCE, parse_sizes, random_inputs_torch
from .tuned import has_chain, open_variant, variant_trace


def _error(msg: str) -> int:
    import sys

    sys.stderr.write(f"derivc: error: {msg}\n")
    return EXIT_INVALID_INPUT


def _time_ms(fn: Any) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def tune(out_dir: Path, shapes: list[dict[str, int]], seed: int = 0) -> dict[str, Any]:
    """Measure every built variant at every shape; return the table (not written)."""
    import torch

    from compiler.derive import output_error
    from compiler.lower_spec import lower_spec
    from compiler.trace import spec_of_trace

    from .build_dir import load_build
    from .cuda.runtime import CompiledKernel

    dirs = built_dirs(out_dir)
    default = next(iter(dirs))
    if has_chain(out_dir):  # chains (and one-kernel variants beside them: S = 1): run whole, by the spec's sizes
        chains = {name: open_variant(d) for name, d in dirs.items()}
        program = lower_spec(spec_of_trace(variant_trace(chains[default])))
        kernels: dict[str, Any] = dict(chains)
        dynamic = chain_dynamic(program)
        order = chains[default].inputs
    else:
        loaded = {name: load_build(d) for name, d in dirs.items()}
        kernels = {name: CompiledKernel(b.printed, b.cubins) for name, b in loaded.items()}
        program = lower_spec(spec_of_trace(loaded[default].trace))
        dynamic = loaded[default].printed.kernel.dynamic()
        order = loaded[default].inputs
    tol = TOLERANCE[program.tensor_type(program.output).dtype]
    buckets: dict[str, Any] = {}
    for sizes in shapes:
        xs = random_inputs_torch(program, {**{n: v for n, v in program.sizes if v is not None}, **sizes}, seed)
        args = [xs[n] for n in order]
        given = {n: v for n, v in sizes.items() if n in dynamic and not any(n in map(str, t.dims) for _, t in program.inputs)}
        ref = kernels[default](*args, **given)
        ref = ref[0] if isinstance(ref, tuple) else ref
        times = {}
        for name, k in kernels.items():
            got = k(*args, **given)
            got = got[0] if isinstance(got, tuple) else got
            torch.cuda.synchronize()
            err = output_error(got.double().cpu().numpy(), ref.double().cpu().numpy())
            if not err <= tol:
                raise RuntimeError(f"variant {name} at {sizes}: output differs from the default's by {err:.2e} "
                                   f"(> {tol:.0e}): a miscompile, not a tuning result")
            times[name] = round(_time_ms(lambda: k(*args, **given)), 5)
        key = bucket(sizes, dynamic)
        best = min(times, key=lambda n: times[n])
        buckets[key] = {"sizes": sizes, "variant": best, "ms": times}
    import torch.cuda as tc

    return {"dynamic": list(dynamic), "device": tc.get_device_name(), "buckets": buckets}


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
        table = tune(out_dir, shapes, seed=args.seed)
    except (ValueError, RuntimeError) as exc:
        import sys

        sys.stderr.write(f"derivc: error: {out_dir}: tune: {exc}\n")
        return EXIT_DERIVATION_FAILED
    tmp = out_dir / (TUNING_FILE + ".tmp")
    tmp.write_text(json.dumps(table, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, out_dir / TUNING_FILE)
    write_marker(out_dir, BUILD_MARKER)
    for key, row in table["buckets"].items():
        ms = ", ".join(f"{n} {t:.4f} ms" for n, t in sorted(row["ms"].items(), key=lambda x: x[1]))
        print(f"{key} ({row['sizes']}): {row['variant']}   [{ms}]")
    print(f"wrote {out_dir / TUNING_FILE}")
    return EXIT_OK
