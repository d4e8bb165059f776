"""The gradient GEMMs on the H200 against cuBLAS of the same layout, in one process (issue 17:
dA = dC·Bᵀ (NT) and dB = Aᵀ·dC (TN) ≥ 0.95 × cuBLAS at 4096³ and 8192³; bias + ReLU / GELU
backward fused at ≥ 0.95 × cuBLAS + a separate activation-backward kernel).

Cases, fp16 in, fp32 accumulation, M = N = K = n for n in 4096, 8192:
  nt           examples/gemm_grad_a_wgmma.yaml, dA = dC·Bᵀ          vs torch.matmul(dC, B.t())
  tn           examples/gemm_grad_b_wgmma.yaml, dB = Aᵀ·dC          vs torch.matmul(A.t(), dC)
  relu_dx      gemm_bias_relu_grad.yaml's dX kernel: dX = dC·[X > 0] with X = A·B + bias recomputed
               by its wgmma GEMM (the activation's derivative the accumulators' epilogue)
               vs torch.addmm(bias, A, B) + aten.threshold_backward(dC, X, 0)
  gelu_dx      gemm_bias_gelu_grad.yaml's dX kernel vs addmm + aten.gelu_backward(dC, X, "tanh")
  relu_bwd / gelu_bwd / gelu_bwd_block
               the whole backward of C = act(A·B + bias) (dX, dA, dB, dbias: every kernel of
               grad.json as load_training(...).backward runs them; gelu_bwd_block:
               devtools/train_block/block_gemm_bias_gelu_grad.yaml, dbias as 64 partial column sums) vs
               torch.autograd.grad of act(addmm(bias, A, B)) (PyTorch saves X: no recompute)
ratio = PyTorch ms / derived ms (> 1: derived faster).  TFLOP/s count 2·n³ per GEMM (the dX kernel
one GEMM, a whole backward three: dX's recompute, dA and dB).  Device time: CUDA events around
back-to-back calls behind a sleep kernel, warm-up, median (train_step_bench.device_ms).  Each
case also checks the derived result against PyTorch's (relative error in norm).

    python devtools/gemm_grad_bench.py prepare OUTDIR   # CPU (NVRTC): builds the examples into OUTDIR
    python devtools/gemm_grad_bench.py run OUTDIR       # GPU: one line per case, $OUT/gemm_grad_bench.json

A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "devtools")]
from train_step_bench import DEVICE, Recorder, device_ms, rel, spec_digest  # noqa: E402

EXAMPLES = ROOT / "examples"
BLOCK = ROOT / "devtools" / "train_block"  # the training block's pieces (bench inputs, not CI examples)


def spec_of(name: str) -> Path:
    return BLOCK / f"{name}.yaml" if name.startswith("block_") else EXAMPLES / f"{name}.yaml"
RESULT = "gemm_grad_bench.json"
SIZES = (4096, 8192)
TRAINING = ("gemm_bias_relu_grad", "gemm_bias_gelu_grad", "block_gemm_bias_gelu_grad")  # builds with grad.json
BUILDS = ("gemm_grad_a_wgmma", "gemm_grad_b_wgmma", *TRAINING)
ERR_TOL = 2e-2  # fp16 outputs of fp32 sums, derived vs cuBLAS (a wrong kernel is off by O(1))


def prepare(outdir: Path) -> int:
    """Build every example into outdir/<example> (no proofs) and load it back on the CPU: the
    training builds through the emulation runtime (re-derived, compared with the sources on disk),
    the one-kernel builds through codegen.build_dir.load_build (the same re-derivation)."""
    import derivc
    from codegen.build_dir import load_build
    from compiler.cli import build_to

    outdir.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in BUILDS:
        t0 = time.time()
        try:
            build_to(spec_of(name), outdir / name, seed=1, proofs=False)
            if name in TRAINING:
                t = derivc.load_training(outdir / name, device="emu")
                what = "backward kernels " + ", ".join(e.name for e in t.manifest.kernels)
            else:
                what = "kernel " + load_build(outdir / name).printed.kernel.name
            print(f"{name}: built and loaded ({time.time() - t0:.0f} s; {what})", flush=True)
        except Exception as exc:  # noqa: BLE001 - one example failing must not hide the others
            failed.append(name)
            print(f"{name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
    (outdir / "builds.json").write_text(json.dumps({n: spec_digest(spec_of(n)) for n in BUILDS}, indent=1))
    size = sum(f.stat().st_size for f in outdir.rglob("*") if f.is_file())
    print(f"{outdir}: {size / 2**20:.1f} MiB" + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


def run(outdir: Path, out: Path) -> int:
    import torch
    import torch.nn.functional as F

    import derivc

    rec = Recorder(out / RESULT)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    recorded = json.loads((outdir / "builds.json").read_text())
    stale = [n for n in BUILDS if recorded.get(n) != spec_digest(spec_of(n))]
    if stale:
        print(f"WARNING: {', '.join(stale)} changed since prepare (the builds run as built)", flush=True)
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False  # fp32 accumulation
    aten = torch.ops.aten
    act_bwd = {"relu": lambda dc, x: aten.threshold_backward(dc, x, 0),
               "gelu": lambda dc, x: aten.gelu_backward(dc, x, approximate="tanh")}
    act_fwd = {"relu": torch.relu, "gelu": lambda x: F.gelu(x, approximate="tanh")}

    def timing(derived: Callable[[], Any], anchor: Callable[[], Any], flops: float, inner: int) -> dict[str, Any]:
        """Both timed, the derived result checked against the anchor's."""
        got, want = derived(), anchor()
        got, want = (got if isinstance(got, (tuple, list)) else (got,)), (want if isinstance(want, (tuple, list)) else (want,))
        errs = [rel(g, w) for g, w in zip(got, want)]
        d = device_ms(torch, derived, warmup=3, reps=10, inner=inner)
        a = device_ms(torch, anchor, warmup=3, reps=10, inner=inner)
        return {"derived_ms": d["ms"], "pytorch_ms": a["ms"], "ratio": round(a["ms"] / d["ms"], 3),
                "derived_tflops": round(flops / d["ms"] / 1e9, 1), "pytorch_tflops": round(flops / a["ms"] / 1e9, 1),
                "rel_err": [float(f"{e:.2e}") for e in errs], "ok": all(e < ERR_TOL for e in errs)}

    loaded: dict[str, Any] = {}

    def kernel(name: str) -> Any:
        if name not in loaded:
            loaded[name] = derivc.load(outdir / name)
        return loaded[name]

    def training(name: str) -> Any:
        if name not in loaded:
            loaded[name] = derivc.load_training(outdir / name)
        return loaded[name]

    def dx_kernel(name: str) -> Any:
        key = f"{name}/dX"
        if key not in loaded:
            loaded[key] = derivc.load(outdir / name / "grad" / "dX")
        return loaded[key]

    for n in SIZES:
        g = torch.Generator(device=DEVICE).manual_seed(n)

        def t(*shape: int, std: float = 1.0) -> Any:
            return (torch.randn(*shape, generator=g, device=DEVICE) * std).half()

        a, b, dc = t(n, n, std=n ** -0.25), t(n, n, std=n ** -0.25), t(n, n)
        bias = t(n, std=0.1)
        env = {"A": a, "B": b, "dC": dc, "bias": bias}
        gemm = 2.0 * n ** 3
        inner = 5 if n <= 4096 else 2

        def args(k: Any) -> list[Any]:
            return [env[x] for x in k.inputs]

        cases: dict[str, Callable[[], dict[str, Any]]] = {
            "nt": lambda: timing(lambda: kernel("gemm_grad_a_wgmma")(*args(kernel("gemm_grad_a_wgmma"))),
                                 lambda: torch.matmul(dc, b.t()), gemm, inner),
            "tn": lambda: timing(lambda: kernel("gemm_grad_b_wgmma")(*args(kernel("gemm_grad_b_wgmma"))),
                                 lambda: torch.matmul(a.t(), dc), gemm, inner),
        }
        for act, example in (("relu", "gemm_bias_relu_grad"), ("gelu", "gemm_bias_gelu_grad")):
            cases[f"{act}_dx"] = (lambda act=act, example=example: timing(
                lambda: dx_kernel(example)(*args(dx_kernel(example))),
                lambda: act_bwd[act](dc, torch.addmm(bias, a, b)), gemm, inner))
        for case, act, example in (("relu_bwd", "relu", "gemm_bias_relu_grad"), ("gelu_bwd", "gelu", "gemm_bias_gelu_grad"),
                                   ("gelu_bwd_block", "gelu", "block_gemm_bias_gelu_grad")):
            def whole(act: str = act, example: str = example) -> dict[str, Any]:
                tr = training(example)
                _, saved = tr.forward_with_saved(A=a, B=b, bias=bias)
                leaves = [x.clone().requires_grad_(True) for x in (a, b, bias)]
                y = act_fwd[act](torch.addmm(leaves[2], leaves[0], leaves[1]))

                def derived() -> Any:
                    grads = tr.backward(saved, dc)
                    return grads["A"], grads["B"], grads["bias"]

                return timing(derived, lambda: torch.autograd.grad(y, leaves, dc, retain_graph=True), 3 * gemm, 1)
            cases[case] = whole
        for case, fn in cases.items():
            rec.case(f"{case}:{n}", fn)
    return 0 if all("error" not in r for r in rec.rows) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="build the examples (CPU)").add_argument("outdir", type=Path)
    sub.add_parser("run", help="time on the GPU").add_argument("outdir", type=Path)
    a = ap.parse_args()
    if a.cmd == "prepare":
        return prepare(a.outdir)
    return run(a.outdir, Path(os.environ.get("OUT", "/tmp")))


if __name__ == "__main__":
    sys.exit(main())
