"""The tuned GEMM (examples/gemm_splitk_tiles_tuned.yaml) on the GPU: every built variant — the
one-kernel GEMM (S = 1) and the split-K chains (partial sums on wgmma, the vectorised combine) on
each output tile — against float64 torch at tails (M, N, K not multiples of the tiles, N not a
multiple of 8: the cp.async kernel and the combine's per-column path; K smaller than S tiles:
empty splits; K = 1); determinism (two runs, same bits); `derivc tune` over issue 18's target
shapes, and the tuned build's dispatch: the recorded variant per bucket, correct, same bits twice.

    python -m pytest -q -m gpu tests/gpu/test_gemm_tuned_gpu.py -s
    python devtools/gemm_tuned_bench.py          # ratio vs torch.matmul (cuBLAS) per target shape
"""
from __future__ import annotations

import argparse
import json
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.gpu
TUNED = ROOT / "examples" / "gemm_splitk_tiles_tuned.yaml"
TARGETS = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048), (1000, 1024, 1000), (4096, 4096, 512),
           (8192, 8192, 1024), (16384, 1024, 4096), (128, 4096, 4096), (4096, 14336, 4096)]
TAILS = [(150, 270, 300), (130, 264, 100), (64, 256, 1), (257, 520, 1000), (5, 8, 70)]


@lru_cache(maxsize=None)
def build_dir() -> Path:
    import tempfile

    from prebuilt import build_or_prebuilt

    out = Path(tempfile.mkdtemp(prefix="derivc-gemm-tuned-")) / "out"
    build_or_prebuilt(TUNED, out, seed=0)
    return out


@lru_cache(maxsize=None)
def variants() -> dict:
    from codegen.tuned import open_variant
    from compiler.variant_build import built_dirs

    return {name: open_variant(d) for name, d in built_dirs(build_dir()).items()}


def inputs(torch, m: int, n: int, k: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(m, k, device="cuda", generator=g).half(), torch.randn(k, n, device="cuda", generator=g).half())


@pytest.mark.parametrize("m,n,k", TAILS + [(128, 4096, 4096)])
def test_every_variant_against_float64(torch, m, n, k):
    a, b = inputs(torch, m, n, k, seed=m + n + k)
    want = a.double() @ b.double()
    for name, fn in variants().items():
        c = fn(a, b)
        torch.cuda.synchronize()
        assert c.dtype == torch.float16 and tuple(c.shape) == (m, n)
        err = (c.double() - want).norm() / want.norm()
        assert err < 2e-3, f"{name}: relative error {err:.3g} at M={m} N={n} K={k}"
        worst = (c.double() - want).abs().max() / want.abs().max()
        assert worst < 16 * 2e-3, f"{name}: an element off by {worst:.3g} of max |C| at M={m} N={n} K={k}"


@pytest.mark.parametrize("m,n,k", [(128, 4096, 4096), (150, 270, 300)])
def test_every_variant_two_runs_same_bits(torch, m, n, k):
    a, b = inputs(torch, m, n, k, seed=5)
    for name, fn in variants().items():
        c1, c2 = fn(a, b), fn(a, b)
        torch.cuda.synchronize()
        assert torch.equal(c1, c2), f"{name}: two runs differ"


def test_tune_the_targets_and_dispatch(torch):
    """`derivc tune` over the target shapes: the table names built variants; the loaded tuned build
    runs the recorded one per shape (one kernel or a chain), within tolerance, same bits twice."""
    import derivc
    from codegen import tune_cmd
    from codegen.tuned import TunedChain
    from compiler.tuning_table import bucket

    out = build_dir()
    args = argparse.Namespace(dir=str(out), output=None, no_proofs=True, seed=0,
                              sizes=[f"M={m},N={n},K={k}" for m, n, k in TARGETS])
    assert tune_cmd.main(args) == 0
    table = json.loads((out / "tuning.json").read_text())
    gemm = derivc.load(out)
    assert isinstance(gemm, TunedChain)
    for m, n, k in TARGETS:
        row = table["buckets"][bucket({"M": m, "N": n, "K": k}, ("M", "N", "K"))]
        print(f"M={m} N={n} K={k}: {row['variant']}  {row['ms'][row['variant']]:.4f} ms")
        a, b = inputs(torch, m, n, k, seed=1)
        assert gemm.variant_at((tuple(a.shape), tuple(b.shape))) == row["variant"]
        c1, c2 = gemm(a, b), gemm(a, b)
        torch.cuda.synchronize()
        want = a.double() @ b.double()
        assert (c1.double() - want).norm() / want.norm() < 2e-3 and torch.equal(c1, c2)
