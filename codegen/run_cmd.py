"""`derivc run FILE [--check] [--sizes B=2,H=4,N=1000]`: build, launch on the GPU, compare.

The reference is the spec itself: IR₀ evaluated by the float64 interpreter at the same sizes
(so keep --check sizes moderate).  Tolerance on ‖out − ref‖/‖ref‖ by output dtype: fp32 1e-5,
fp16 2e-3, bf16 1e-2.  The output buffer is NaN-poisoned before the launch.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

TOLERANCE = {"f64": 1e-10, "f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}
_TORCH = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}


def parse_sizes(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in (text or "").split(","):
        if part.strip():
            k, _, v = part.partition("=")
            out[k.strip()] = int(v)
    return out


def random_inputs_torch(program: Any, sizes: dict[str, int], seed: int, scale: float = 1.0) -> dict[str, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for name, t in program.inputs:
        shape = tuple(a.evaluate(sizes) for a in t.dims)
        x = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) * scale
        out[name] = x.to(getattr(torch, _TORCH[t.dtype]))
    return out


def check_kernel(kernel: Any, program: Any, sizes: dict[str, int], seed: int = 0, scale: float = 1.0) -> dict[str, Any]:
    """Run the kernel on fresh inputs (standard normal times `scale`: large logits for attention)
    with a NaN-poisoned output and compare with IR₀ in float64 on the same (rounded) inputs."""
    import torch

    from compiler.derive import checked_outputs, output_error
    from compiler.interp import run_program

    sizes = {**{n: v for n, v in program.sizes if v is not None}, **sizes}
    xs = random_inputs_torch(program, sizes, seed, scale)
    names = checked_outputs(program)  # the output, then the further ones (LSE): each compared
    outs = []
    for name in names:
        t = program.tensor_type(name)
        shape = tuple(a.evaluate(sizes) for a in t.dims)
        outs.append(torch.full(shape, float("nan"), device="cuda", dtype=getattr(torch, _TORCH[t.dtype])))
    order = list(kernel.inputs)
    kernel(*[xs[n] for n in order], out=outs[0] if len(outs) == 1 else tuple(outs))
    torch.cuda.synchronize()
    tensors = run_program(program, sizes, {n: x.double().cpu().numpy() for n, x in xs.items()})
    result: dict[str, Any] = {"sizes": sizes, "outputs": {}}
    for name, out in zip(names, outs):
        got = out.double().cpu().numpy()
        err, tol = output_error(got, tensors[name]), TOLERANCE[program.tensor_type(name).dtype]
        result["outputs"][name] = {"rel_error": err, "tolerance": tol, "passed": bool(err <= tol)}
        if name == program.output:
            result.update(rel_error=err, tolerance=tol, nan=bool(np.isnan(got).any()))
    result["passed"] = all(r["passed"] for r in result["outputs"].values())
    return result


def main(args: argparse.Namespace) -> int:
    import derivc
    from compiler.errors import EXIT_DERIVATION_FAILED

    with tempfile.TemporaryDirectory(prefix="derivc-run-") as tmp:
        build_dir = Path(tmp) / "build"
        from compiler.cli import build_to

        d = build_to(Path(args.file), build_dir, proofs=False)
        kernel = derivc.load(build_dir)
        sizes = dict(d.check_sizes)
        sizes.update(parse_sizes(getattr(args, "sizes", None)))
        result = check_kernel(kernel, d.programs[0], sizes, seed=getattr(args, "seed", None) or 0)
    print(f"{kernel.name} at {', '.join(f'{k}={v}' for k, v in sizes.items())}: "
          f"‖out − ref‖/‖ref‖ = {result['rel_error']:.3e} (tolerance {result['tolerance']:.0e}) "
          f"{'ok' if result['passed'] else 'FAILED'}")
    if not args.check:
        return 0
    return 0 if result["passed"] else EXIT_DERIVATION_FAILED
