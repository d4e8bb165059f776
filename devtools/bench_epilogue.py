"""GEMM + epilogue on the H200: derived kernels against torch in the same process.

    python3 devtools/bench_epilogue.py [--sizes 4096,8192] [--no-compile]

For each size n (n³ fp16, fp32 accumulation) and activation (bias + ReLU, bias + GELU tanh form,
bias + residual C0): the derived kernel (examples/gemm_bias_*.yaml, gemm_residual.yaml), the
eager anchor (torch.addmm with the bias, cuBLASLt, then the activation / residual add), and
torch.compile of linear + activation; plus the plain derived GEMM (examples/gemm_wgmma.yaml) and
cuBLAS matmul, so the epilogue's own cost shows.  do_bench medians, two input sets rotating
(together beyond L2); each row's columns timed in ROUNDS interleaved rounds, order rotated, the
median taken.  Rows go to stdout and, one JSON line each, to $OUT/bench_epilogue.jsonl as they
are measured.  A developer script: no test imports it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("OUT", "/tmp/out"))


def _timer(fns) -> float:
    import triton.testing

    state = {"k": 0}

    def step() -> None:
        fns[state["k"] % len(fns)]()
        state["k"] += 1

    return float(triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median"))


ROUNDS = 5  # interleaved rounds, order rotated: a clock drift hits every column alike


def _rounds(columns: dict) -> dict:
    """Median time of each column (a list of callables) over ROUNDS interleaved rounds."""
    import statistics

    names, times = list(columns), {n: [] for n in columns}
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(_timer(columns[n]))
    return {n: statistics.median(t) for n, t in times.items()}


def main() -> int:
    import torch
    import torch.nn.functional as F

    import derivc
    from compiler.cli import build_to

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    log = open(OUT / "bench_epilogue.jsonl", "a")
    tmp = Path(tempfile.mkdtemp(prefix="bench-epi-"))
    kernels = {}
    for name in ("gemm_wgmma", "gemm_bias_relu", "gemm_bias_gelu", "gemm_residual"):
        build_to(ROOT / "examples" / f"{name}.yaml", tmp / name, proofs=False)
        kernels[name] = derivc.load(tmp / name)
    acts = {
        "relu": (lambda x: torch.relu(x), "gemm_bias_relu"),
        "gelu": (lambda x: F.gelu(x, approximate="tanh"), "gemm_bias_gelu"),
    }

    def row(**r) -> None:
        r["t"] = round(time.time(), 1)
        print(json.dumps(r), flush=True)
        log.write(json.dumps(r) + "\n")
        log.flush()

    sizes = [int(x) for x in args.sizes.split(",")]
    data = {}
    for n in sizes:
        data[n] = [dict(a=torch.randn(n, n, device="cuda", dtype=torch.float16),
                        b=torch.randn(n, n, device="cuda", dtype=torch.float16),
                        bias=torch.randn(n, device="cuda", dtype=torch.float16),
                        c0=torch.randn(n, n, device="cuda", dtype=torch.float16),
                        out=torch.empty(n, n, device="cuda", dtype=torch.float16)) for _ in range(2)]
    t_gemm = {}
    for n in sizes:
        sets, flops = data[n], 2.0 * n ** 3
        g = kernels["gemm_wgmma"]
        t = _rounds({"cublas": [lambda s=s: torch.matmul(s["a"], s["b"], out=s["out"]) for s in sets],
                     "derived": [lambda s=s: g(s["a"], s["b"], out=s["out"]) for s in sets]})
        t_gemm[n] = t_g = t["derived"]
        row(case=f"gemm {n}^3", derived_tflops=round(flops / t_g / 1e9, 1),
            cublas_tflops=round(flops / t["cublas"] / 1e9, 1), ratio=round(t["cublas"] / t_g, 3))
    # the targets first (bias + ReLU / GELU at every size), the residual last
    for act, (fn, ex) in list(acts.items()) + [("residual", (None, "gemm_residual"))]:
        for n in sizes:
            sets, flops = data[n], 2.0 * n ** 3
            tf = lambda ms: round(flops / ms / 1e9, 1)  # noqa: E731
            k = kernels[ex]
            s0 = sets[0]
            if act == "residual":
                derived = [lambda s=s: k(s["a"], s["b"], s["bias"], s["c0"], out=s["out"]) for s in sets]
                eager_fn = lambda a, b, bias, c0: torch.addmm(bias, a, b).add_(c0)  # noqa: E731
                comp_src = lambda a, b, bias, c0: F.linear(a, b.t(), bias) + c0  # noqa: E731
                ref = (s0["a"].float() @ s0["b"].float() + s0["bias"].float() + s0["c0"].float())
                got = k(s0["a"], s0["b"], s0["bias"], s0["c0"], out=s0["out"])
            else:
                derived = [lambda s=s: k(s["a"], s["b"], s["bias"], out=s["out"]) for s in sets]
                eager_fn = lambda a, b, bias, c0, fn=fn: fn(torch.addmm(bias, a, b))  # noqa: E731
                comp_src = lambda a, b, bias, c0, fn=fn: fn(F.linear(a, b.t(), bias))  # noqa: E731
                ref = fn(s0["a"].float() @ s0["b"].float() + s0["bias"].float())
                got = k(s0["a"], s0["b"], s0["bias"], out=s0["out"])
            err = float((got.float() - ref).norm() / ref.norm())
            del ref
            columns = {"derived": derived,
                       "eager": [lambda s=s: eager_fn(s["a"], s["b"], s["bias"], s["c0"]) for s in sets]}
            if not args.no_compile:
                comp = torch.compile(comp_src)
                for s in sets:
                    comp(s["a"], s["b"], s["bias"], s["c0"])
                columns["compiled"] = [lambda s=s: comp(s["a"], s["b"], s["bias"], s["c0"]) for s in sets]
            t = _rounds(columns)
            t_d, t_e = t["derived"], t["eager"]
            r = dict(case=f"gemm+{act} {n}^3", derived_tflops=tf(t_d), eager_tflops=tf(t_e),
                     ratio_eager=round(t_e / t_d, 3), epilogue_cost=round(t_d / t_gemm[n] - 1, 4), rel_error=err)
            if "compiled" in t:
                r.update(compiled_tflops=tf(t["compiled"]), ratio_compiled=round(t["compiled"] / t_d, 3))
            row(**r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
