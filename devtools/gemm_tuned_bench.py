"""The tuned GEMM (examples/gemm_splitk_tiles_tuned.yaml: output tiles x split-K factors, S = 1 the
one-kernel GEMM) on the H200 over issue 18's target shapes, vs torch.matmul (cuBLAS), fp16, in one
process.  Builds the example (no proofs), runs `derivc tune` over the shapes (writes
DIR/tuning.json: the winner per shape bucket, do_bench medians), loads the tuned build with
`derivc.load` (one dictionary lookup per call) and times the tuned call against cuBLAS with CUDA
events (devtools/splitk_bench.py's time_ms: back-to-back calls behind a sleep kernel, device
time, median); ratio = cuBLAS ms / derivc ms (> 1: faster), and the geometric mean.

    python devtools/gemm_tuned_bench.py                 # build into $OUT/gemm_tuned, tune, time
    python devtools/gemm_tuned_bench.py --build DIR     # reuse a build (tuned again)
    python devtools/gemm_tuned_bench.py --shapes 128x4096x4096,2048x2048x2048

Writes $OUT/gemm_tuned_bench.json (per shape: the winner, its ms, cuBLAS ms, ratio, every
variant's tune time).  A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "devtools")]
OUT = Path(os.environ.get("OUT", "/tmp"))
TARGETS = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048), (1000, 1024, 1000), (4096, 4096, 512),
           (8192, 8192, 1024), (16384, 1024, 4096), (128, 4096, 4096), (4096, 14336, 4096)]


def _shapes(text: str | None) -> list[tuple[int, int, int]]:
    if not text:
        return TARGETS
    return [tuple(int(x) for x in s.split("x")) for s in text.split(",")]  # type: ignore[misc]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", help="an existing build of the example (else built into $OUT/gemm_tuned)")
    ap.add_argument("--shapes", help="MxNxK,MxNxK,... (default: the issue's targets)")
    args = ap.parse_args()
    import torch

    import derivc
    from codegen import tune_cmd
    from compiler.cli import build_to
    from compiler.tuning_table import bucket
    from splitk_bench import time_ms

    out = Path(args.build) if args.build else OUT / "gemm_tuned"
    if not args.build:
        build_to(ROOT / "examples" / "gemm_splitk_tiles_tuned.yaml", out, seed=0, proofs=False)
    shapes = _shapes(args.shapes)
    ns = argparse.Namespace(dir=str(out), output=None, no_proofs=True, seed=0,
                            sizes=[f"M={m},N={n},K={k}" for m, n, k in shapes])
    assert tune_cmd.main(ns) == 0, "derivc tune failed"
    table = json.loads((out / "tuning.json").read_text())
    gemm = derivc.load(out)
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda").half()
        b = torch.randn(k, n, device="cuda").half()
        want = a.double() @ b.double()
        c = gemm(a, b)
        torch.cuda.synchronize()
        err = float((c.double() - want).norm() / want.norm())
        ours = time_ms(torch, lambda: gemm(a, b))
        cublas = time_ms(torch, lambda: torch.matmul(a, b))
        row = table["buckets"][bucket({"M": m, "N": n, "K": k}, ("M", "N", "K"))]
        rec = {"M": m, "N": n, "K": k, "variant": row["variant"], "ms": round(ours, 5), "cublas_ms": round(cublas, 5),
               "ratio": round(cublas / ours, 3), "tflops": round(2 * m * n * k / ours / 1e9, 1), "rel_err": err,
               "tune_ms": row["ms"]}
        rows.append(rec)
        print(f"M={m:>5} N={n:>5} K={k:>5}: {row['variant']:<32} {ours:.4f} ms  cuBLAS {cublas:.4f} ms  "
              f"{cublas / ours:5.2f} x cuBLAS  ({rec['tflops']:.0f} TFLOP/s, rel. err {err:.1e})", flush=True)
    geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    low = [f"{r['M']}x{r['N']}x{r['K']} ({r['ratio']:.2f})" for r in rows if r["ratio"] < 0.95]
    print(f"geometric mean {geo:.3f} x cuBLAS; below 0.95: {', '.join(low) or 'none'}")
    (OUT / "gemm_tuned_bench.json").write_text(json.dumps({"rows": rows, "geomean": round(geo, 4),
                                                           "device": torch.cuda.get_device_name()}, indent=1))
    print(f"wrote {OUT / 'gemm_tuned_bench.json'}")


if __name__ == "__main__":
    main()
