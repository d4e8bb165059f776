"""`derivc run FILE [--check] [--sizes B=2,H=4,N=1000]`: build, launch on the GPU, compare.

The reference is the spec itself: IR₀ evaluated by the float64 interpreter at the same sizes
(so keep --check sizes moderate).  Tolerance on ‖out − ref‖/‖ref‖ by output dtype: fp32 1e-5,
fp16 2e-3, bf16 1e-2.  The output buffer is NaN-poisoned before the launch.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from compiler.machine import DTYPES

TOLERANCE = {"f64": 1e-10, "f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}
ARRAYS = ("torch", "cupy")  # the kinds of GPU array a kernel takes


def parse_sizes(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in (text or "").split(","):
        if part.strip():
            k, _, v = part.partition("=")
            out[k.strip()] = int(v)
    return out


def _shape(t: Any, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(a.evaluate(sizes) for a in t.dims)


def _int_values(program: Any, name: str, sizes: dict[str, int], seed: int) -> np.ndarray:
    from compiler.int_inputs import int_input

    rng = np.random.default_rng(seed)
    return int_input(program, name, _shape(program.tensor_type(name), sizes), sizes, rng).astype(np.int32)


def random_inputs_torch(program: Any, sizes: dict[str, int], seed: int, scale: float = 1.0) -> dict[str, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for name, t in program.inputs:
        if t.dtype == "i32":  # targets / document ids, drawn for their use (compiler/int_inputs.py)
            out[name] = torch.from_numpy(_int_values(program, name, sizes, seed)).to("cuda")
            continue
        x = torch.randn(_shape(t, sizes), generator=g, device="cuda", dtype=torch.float32) * scale
        out[name] = x.to(getattr(torch, DTYPES[t.dtype].torch))
    return out


def random_inputs_cupy(program: Any, sizes: dict[str, int], seed: int, scale: float = 1.0) -> dict[str, Any]:
    """As random_inputs_torch, as CuPy arrays (ValueError for a dtype CuPy lacks: bf16)."""
    import cupy

    rng = cupy.random.default_rng(seed)
    out = {}
    for name, t in program.inputs:
        if t.dtype == "i32":
            out[name] = cupy.asarray(_int_values(program, name, sizes, seed))
            continue
        dt = DTYPES[t.dtype].numpy
        if dt is None:
            raise ValueError(f"{name}: dtype {t.dtype} has no CuPy array type")
        x = rng.standard_normal(_shape(t, sizes), dtype=cupy.float32) * scale
        out[name] = x.astype(dt)
    return out


class _Arrays(NamedTuple):
    """What check_kernel needs of an array library."""

    inputs: Callable[..., dict[str, Any]]  # (program, sizes, seed, scale) -> {name: array}
    nan_filled: Callable[[tuple[int, ...], str], Any]  # (shape, spec dtype) -> array of NaN
    to_f64: Callable[[Any], np.ndarray]
    synchronize: Callable[[], None]


def _arrays(kind: str) -> _Arrays:
    if kind == "torch":
        import torch

        return _Arrays(random_inputs_torch,
                       lambda shape, dtype: torch.full(shape, float("nan"), device="cuda",
                                                       dtype=getattr(torch, DTYPES[dtype].torch)),
                       lambda x: x.double().cpu().numpy(), torch.cuda.synchronize)
    if kind == "cupy":
        import cupy

        return _Arrays(random_inputs_cupy, lambda shape, dtype: cupy.full(shape, np.nan, dtype=DTYPES[dtype].numpy),
                       lambda x: cupy.asnumpy(x).astype(np.float64),
                       lambda: cupy.cuda.get_current_stream().synchronize())
    raise ValueError(f"arrays {kind!r}: expected one of {', '.join(ARRAYS)}")


def sizes_by_name(program: Any, sizes: dict[str, int]) -> dict[str, int]:
    """The program's dynamic sizes no input's shape gives (a window W): passed by name at a call."""
    from_shapes = {a.terms[0][0] for _, t in program.inputs for a in t.dims
                   if len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const}
    return {n: sizes[n] for n, v in program.sizes if v is None and n not in from_shapes}


def check_kernel(kernel: Any, program: Any, sizes: dict[str, int], seed: int = 0, scale: float = 1.0,
                 arrays: str = "torch") -> dict[str, Any]:
    """Run the kernel on fresh inputs (standard normal times `scale`: large logits for attention;
    torch CUDA tensors or CuPy arrays, `arrays`) with a NaN-poisoned output and compare with IR₀
    in float64 on the same (rounded) inputs; a size no input's shape gives is passed by name."""
    from compiler.derive import checked_outputs, output_error
    from compiler.interp import run_program

    lib = _arrays(arrays)
    sizes = {**{n: v for n, v in program.sizes if v is not None}, **sizes}
    xs = lib.inputs(program, sizes, seed, scale)
    names = checked_outputs(program)  # the output, then the further ones (LSE): each compared
    outs = [lib.nan_filled(_shape(program.tensor_type(n), sizes), program.tensor_type(n).dtype) for n in names]
    order = list(kernel.inputs)
    kernel(*[xs[n] for n in order], out=outs[0] if len(outs) == 1 else tuple(outs), **sizes_by_name(program, sizes))
    lib.synchronize()
    tensors = run_program(program, sizes, {n: lib.to_f64(x) for n, x in xs.items()})
    result: dict[str, Any] = {"sizes": sizes, "outputs": {}}
    for name, out in zip(names, outs):
        got = lib.to_f64(out)
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
