"""Issue 18's GEMM targets in one device call: build on the CPU, tune and time on the GPU.

    python devtools/gemm_tuned_bench.py prepare OUTDIR   # here, no GPU: builds the examples into OUTDIR
    python devtools/gemm_tuned_bench.py run OUTDIR       # on the H200: tune, load, time (writes $OUT)

`prepare` builds examples/gemm_splitk_tiles_tuned.yaml (output tiles x split-K factors, S = 1 the
one-kernel wgmma GEMM; no proofs, every variant checked through the CPU emulation) into
OUTDIR/gemm_tuned and examples/gemm_wgmma_bf16.yaml into OUTDIR/gemm_bf16 (NVRTC compiles the
cubins here; `derivc.load` on the GPU re-derives and compares the sources, it compiles nothing).
`run` runs `derivc tune` over the nine fp16 target shapes (the pruning rule of
compiler/tuning_table.py: over-split variants skipped, a screen, the finalists timed in full;
--budget bounds it), loads the tuned build with `derivc.load` (one dictionary lookup per call)
and times the tuned call against torch.matmul (cuBLAS) with CUDA events (devtools/splitk_bench.py's
time_ms: back-to-back calls behind a sleep kernel, device time, median), then bf16 4096³ / 8192³
on the one-kernel bf16 build.  ratio = cuBLAS ms / derivc ms (> 1: faster), and the geometric
mean.  One line per row as it goes; $OUT/gemm_tuned_bench.json is rewritten after every row, so
a run cut short keeps what it measured.  A developer script: not part of the package.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "devtools")]
TARGETS = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048), (1000, 1024, 1000), (4096, 4096, 512),
           (8192, 8192, 1024), (16384, 1024, 4096), (128, 4096, 4096), (4096, 14336, 4096)]
BF16 = [(4096, 4096, 4096), (8192, 8192, 8192)]
BUILDS = {"gemm_tuned": "gemm_splitk_tiles_tuned.yaml", "gemm_bf16": "gemm_wgmma_bf16.yaml"}


def prepare(outdir: Path) -> None:
    from prebuild import prepare_named

    prepare_named(outdir, BUILDS)


def _write(out: Path, record: dict) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, out)


def run(outdir: Path, shapes: list[tuple[int, int, int]], budget_s: float) -> None:
    import torch

    import derivc
    from codegen import tune_cmd
    from compiler.tuning_table import bucket
    from splitk_bench import time_ms

    out = Path(os.environ.get("OUT", "/tmp")) / "gemm_tuned_bench.json"
    t0 = time.monotonic()
    tuned = Path("/tmp/derivc-gemm-tuned")  # a writable copy (the carried OUTDIR may be read-only)
    shutil.rmtree(tuned, ignore_errors=True)
    shutil.copytree(outdir / "gemm_tuned", tuned)
    record: dict = {"device": torch.cuda.get_device_name(), "rows": [], "tune_s": None}
    ns = argparse.Namespace(dir=str(tuned), output=None, no_proofs=True, seed=0, budget=budget_s, keep=None,
                            sizes=[f"M={m},N={n},K={k}" for m, n, k in shapes])
    assert tune_cmd.main(ns) == 0, "derivc tune failed"
    record["tune_s"] = round(time.monotonic() - t0, 1)
    table = json.loads((tuned / "tuning.json").read_text())
    record["tuning"] = table
    print(f"tuned in {record['tune_s']} s", flush=True)
    _write(out, record)
    gemm = derivc.load(tuned)
    bf16 = derivc.load(outdir / "gemm_bf16")
    rows = [(m, n, k, torch.float16, gemm) for m, n, k in shapes] + [(m, n, k, torch.bfloat16, bf16) for m, n, k in BF16]
    for m, n, k, dtype, fn in rows:
        a = torch.randn(m, k, device="cuda").to(dtype)
        b = torch.randn(k, n, device="cuda").to(dtype)
        want = a.double() @ b.double()
        c = fn(a, b)
        torch.cuda.synchronize()
        err = float((c.double() - want).norm() / want.norm())
        ours = time_ms(torch, lambda: fn(a, b))
        cublas = time_ms(torch, lambda: torch.matmul(a, b))
        key = bucket({"M": m, "N": n, "K": k}, ("M", "N", "K"))
        row = table["buckets"].get(key) if dtype == torch.float16 else None
        variant = row["variant"] if row else ("gemm_wgmma_bf16" if dtype == torch.bfloat16 else "default (unmeasured)")
        rec = {"M": m, "N": n, "K": k, "dtype": str(dtype).split(".")[-1], "variant": variant, "ms": round(ours, 5),
               "cublas_ms": round(cublas, 5), "ratio": round(cublas / ours, 3),
               "tflops": round(2 * m * n * k / ours / 1e9, 1), "rel_err": err}
        record["rows"].append(rec)
        print(f"{rec['dtype']:<8} M={m:>5} N={n:>5} K={k:>5}: {variant:<32} {ours:.4f} ms  cuBLAS {cublas:.4f} ms  "
              f"{cublas / ours:5.2f} x cuBLAS  ({rec['tflops']:.0f} TFLOP/s, rel. err {err:.1e})", flush=True)
        _write(out, record)
    ratios = [r["ratio"] for r in record["rows"]]
    record["geomean"] = round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4)
    low = [f"{r['dtype']} {r['M']}x{r['N']}x{r['K']} ({r['ratio']:.2f})" for r in record["rows"] if r["ratio"] < 0.95]
    record["wall_s"] = round(time.monotonic() - t0, 1)
    _write(out, record)
    print(f"geometric mean {record['geomean']:.3f} x cuBLAS; below 0.95: {', '.join(low) or 'none'}; "
          f"{record['wall_s']} s; wrote {out}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=["prepare", "run"])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--shapes", help="MxNxK,MxNxK,... (default: the issue's nine fp16 targets)")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds `derivc tune` may spend (default 120)")
    args = ap.parse_args()
    if args.step == "prepare":
        prepare(args.outdir)
        return
    shapes = ([tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")] if args.shapes else TARGETS)
    run(args.outdir, shapes, args.budget)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
