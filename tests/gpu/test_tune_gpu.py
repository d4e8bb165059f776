"""`derivc tune` on the H200: every variant of examples/gemm_wgmma_tuned.yaml timed per shape, the
table written, `derivc.load` dispatching to the recorded variant, results correct and
deterministic, `derivc verify`'s file check passing on the tuned directory.

Prints one line per shape (tuned, default and cuBLAS ms) for PERF.md:
    python -m pytest -q -s -m gpu tests/gpu/test_tune_gpu.py
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [  # (M, N, K): the shapes where one schedule is not the best
    (128, 4096, 4096), (1000, 1024, 1000), (4096, 4096, 512), (8192, 8192, 1024), (2048, 2048, 2048),
    (4096, 4096, 4096),
]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    from codegen import tune_cmd
    from compiler.cli import build_to

    out = tmp_path_factory.mktemp("tune") / "gemm"
    # built here, not carried (tests/gpu/prebuilt.py): `derivc verify` below rebuilds it with this
    # machine's NVRTC and compares the cubins byte for byte
    build_to(ROOT / "examples" / "gemm_wgmma_tuned.yaml", out, proofs=False)
    args = argparse.Namespace(dir=str(out), output=None, no_proofs=True, seed=0,
                              sizes=[f"M={m},N={n},K={k}" for m, n, k in SHAPES])
    assert tune_cmd.main(args) == 0
    return out


def test_table_names_built_variants(tuned):
    from compiler.tuning_table import read_tuning
    from compiler.variant_build import built_dirs

    table = read_tuning(tuned, set(built_dirs(tuned)))  # re-applies the pruning rule to every row
    assert len(table["buckets"]) == len(SHAPES) and not table["unmeasured"]
    for row in table["buckets"].values():
        assert set(row["ms"]) <= set(row["screen_ms"]) and not row["skipped"]  # no split variants here


def test_budget_leaves_shapes_unmeasured(tuned, tmp_path):
    import shutil

    from codegen import tune_cmd

    copy = tmp_path / "gemm"
    shutil.copytree(tuned, copy)
    (copy / "tuning.json").unlink()
    args = argparse.Namespace(dir=str(copy), output=None, no_proofs=True, seed=0, budget=0.0, keep=None,
                              sizes=[f"M={m},N={n},K={k}" for m, n, k in SHAPES[:3]])
    assert tune_cmd.main(args) == 0
    table = json.loads((copy / "tuning.json").read_text())
    # the first shape is measured (the budget is checked before each shape), the others are not
    assert len(table["buckets"]) == 1 and len(table["unmeasured"]) == 2


def test_dispatch_runs_the_recorded_variant_correctly_and_deterministically(tuned):
    import torch

    import derivc
    from compiler.tuning_table import bucket

    table = json.loads((tuned / "tuning.json").read_text())
    k = derivc.load(tuned)
    for m, n, kk in SHAPES:
        a = torch.randn(m, kk, device="cuda", dtype=torch.float16)
        b = torch.randn(kk, n, device="cuda", dtype=torch.float16)
        want = table["buckets"][bucket({"M": m, "N": n, "K": kk}, ("M", "N", "K"))]["variant"]
        assert k._kernel.variant_at((tuple(a.shape), tuple(b.shape))) == want
        c1, c2 = k(a, b), k(a, b)
        torch.cuda.synchronize()
        assert torch.equal(c1, c2)  # same bits run to run
        ref = a.double() @ b.double()
        err = ((c1.double() - ref).norm() / ref.norm()).item()
        assert err < 2e-3, (m, n, kk, want, err)


def test_timings_against_cublas(tuned):
    import torch
    import triton.testing

    table = json.loads((tuned / "tuning.json").read_text())
    default = json.loads((tuned / "variants.json").read_text())["default"]
    for row in table["buckets"].values():
        s = row["sizes"]
        a = torch.randn(s["M"], s["K"], device="cuda", dtype=torch.float16)
        b = torch.randn(s["K"], s["N"], device="cuda", dtype=torch.float16)
        cublas = triton.testing.do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")
        best = row["ms"][row["variant"]]
        # the default is timed in full only when it is a finalist; else its screen time (fewer repetitions)
        dflt = row["ms"].get(default, row["screen_ms"].get(default, float("nan")))
        print(f"TUNE {s['M']}x{s['N']}x{s['K']}: {row['variant']} {best:.4f} ms, default {dflt:.4f} ms, "
              f"cuBLAS {cublas:.4f} ms; tuned/cuBLAS {cublas / best:.3f}, default/cuBLAS {cublas / dflt:.3f}")


def test_verify_file_check_passes_on_the_tuned_build(tuned):
    from compiler.verify import check_files

    mismatches, _ = check_files(tuned)
    assert mismatches == []
