"""Split-K GEMM on the H200: the derived chain (partial sums on wgmma + the combine) for each
split factor of examples/gemm_splitk_tuned.yaml, and the one-kernel wgmma GEMM
(examples/gemm_wgmma.yaml, no split), vs torch.matmul (cuBLAS), fp16, in one process.
CUDA events, warmup, median of repeated timings; ratio = cuBLAS ms / derivc ms (> 1: faster).

    python devtools/splitk_bench.py            # writes $OUT/splitk_bench.json

A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
OUT = Path(os.environ.get("OUT", "/tmp"))
SHAPES = [(128, 4096, 4096), (4096, 4096, 512), (1000, 1024, 1000), (8192, 8192, 1024)]
WARMUP, REPS, INNER = 10, 30, 10
SLEEP_CYCLES = 20_000_000  # ~10 ms at 1.98 GHz: longer than enqueuing INNER calls


def host_ms(torch, fn) -> float:
    """Wall time per call with the GPU synchronised once per INNER calls (Python overhead included)."""
    import time
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(INNER * 3):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / (INNER * 3)


def time_ms(torch, fn) -> float:
    """Median over REPS of the mean device time of INNER back-to-back calls (CUDA events).

    A sleep kernel is queued first so that the host enqueues all INNER calls while the GPU waits:
    the events then time the kernels back to back, not Python's per-call overhead (which is
    reported separately by `host_ms`)."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        for _ in range(INNER):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / INNER)
    return statistics.median(times)


def main() -> None:
    import torch

    import derivc
    from compiler.cli import build_to
    from compiler.variant_build import built_dirs

    tmp = Path(tempfile.mkdtemp(prefix="derivc-splitk-bench-"))
    build_to(ROOT / "examples" / "gemm_splitk_tuned.yaml", tmp / "splitk", proofs=False)
    build_to(ROOT / "examples" / "gemm_wgmma.yaml", tmp / "wgmma", proofs=False)
    chains = {name: derivc.load(d) for name, d in built_dirs(tmp / "splitk").items()}
    chains["no-split (gemm_wgmma)"] = derivc.load(tmp / "wgmma")
    rows = []
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda").half()
        b = torch.randn(k, n, device="cuda").half()
        want = a.double() @ b.double()
        cublas = time_ms(torch, lambda: torch.matmul(a, b))
        flop = 2 * m * n * k
        print(f"M={m} N={n} K={k}: cuBLAS {cublas:.4f} ms ({flop / cublas / 1e9:.0f} TFLOP/s)", flush=True)
        for name, fn in chains.items():
            c = fn(a, b)
            torch.cuda.synchronize()
            err = float((c.double() - want).norm() / want.norm())
            ms = time_ms(torch, lambda: fn(a, b))
            wall = host_ms(torch, lambda: fn(a, b))
            row = {"M": m, "N": n, "K": k, "kernel": name, "ms": round(ms, 5), "wall_ms": round(wall, 5),
                   "cublas_ms": round(cublas, 5),
                   "ratio": round(cublas / ms, 3), "tflops": round(flop / ms / 1e9, 1), "rel_err": err}
            rows.append(row)
            print(f"    {name:<24} {ms:.4f} ms  {cublas / ms:5.2f} x cuBLAS  ({flop / ms / 1e9:.0f} TFLOP/s, "
                  f"rel. err {err:.1e}; wall per call {wall:.4f} ms)", flush=True)
        best = min((r for r in rows if (r["M"], r["N"], r["K"]) == (m, n, k)), key=lambda r: r["ms"])
        print(f"  best: {best['kernel']}  {best['ratio']:.2f} x cuBLAS", flush=True)
    (OUT / "splitk_bench.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {OUT / 'splitk_bench.json'}")


if __name__ == "__main__":
    main()
