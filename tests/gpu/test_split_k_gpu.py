"""SPLIT-K GEMM on the GPU: examples/gemm_splitk.yaml (split factor S patched to 1, 2, 3, 4, 8)
built by `derivc build` into a chain of kernels (OUT/kernels/C_part/: the f32 partial sums on
wgmma, split ks adding the k tiles S·kt + ks; OUT/kernels/C/: the combine, Σ_ks in split order,
SIMT), loaded by `derivc.load` and run one after the other.

Against float64 torch on the fp16 inputs: tails (M, N, K not multiples of 128, 256, 64; N not a
multiple of 8: the cp.async kernel, else the TMA kernel), empty splits (K smaller than S tiles,
K = 1: a split with no tile writes zeros), the issue's skinny / deep shapes; determinism (two runs
give the same bits: no atomics, each split its own slot, the combine adds in split order);
`derivc tune` on examples/gemm_splitk_tuned.yaml (a chain per variant) and the tuned chain's
dispatch.

    python -m pytest -q -m gpu tests/gpu/test_split_k_gpu.py -s
    python devtools/splitk_bench.py            # timings vs torch.matmul (cuBLAS)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.gpu
GEMM = ROOT / "examples" / "gemm_splitk.yaml"
TUNED = ROOT / "examples" / "gemm_splitk_tuned.yaml"
SPLITS = (1, 2, 3, 4, 8)


@lru_cache(maxsize=None)
def load_splitk(splits: int):
    """examples/gemm_splitk.yaml with `splits` splits, built (codegen, NVRTC, no proofs) and loaded:
    a KernelChain of the partial kernel and the combine kernel."""
    import derivc
    from compiler.cli import build_to

    tmp = Path(tempfile.mkdtemp(prefix="derivc-splitk-"))
    spec = tmp / f"gemm_splitk_{splits}.yaml"
    spec.write_text(GEMM.read_text().replace("index: ko, splits: 4}", f"index: ko, splits: {splits}}}"))
    build_to(spec, tmp / "out", seed=0, proofs=False)
    chain = derivc.load(tmp / "out")
    assert [k.name for k in chain.kernels] == ["C_part", "C"]
    return chain


def inputs(torch, m: int, n: int, k: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).half()
    b = torch.randn(k, n, device="cuda", generator=g).half()
    return a, b


SHAPES = [  # (M, N, K)
    (150, 270, 300),    # tails everywhere; N % 8 != 0: the cp.async kernel
    (130, 264, 100),    # 2 k tiles: splits 2.. of 3, 4, 8 are empty (TMA kernel)
    (64, 256, 1),       # K = 1: one partial tile, every split but 0 empty
    (257, 520, 1000),   # 16 k tiles, the last partial
    (128, 4096, 4096),  # the skinny shape
    (1000, 1024, 1000),
]


@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_split_k_against_float64(torch, splits, m, n, k):
    chain = load_splitk(splits)
    a, b = inputs(torch, m, n, k, seed=m + n + k)
    t = chain.tensors(a, b)
    c, part = t["C"], t["C_part"]
    torch.cuda.synchronize()
    want = a.double() @ b.double()
    assert c.dtype == torch.float16 and part.dtype == torch.float32 and tuple(part.shape) == (splits, m, n)
    err = (c.double() - want).norm() / want.norm()
    assert err < 2e-3, f"relative error {err:.3g} at S={splits} M={m} N={n} K={k}"
    worst = (c.double() - want).abs().max() / want.abs().max()
    assert worst < 16 * 2e-3, f"an element off by {worst:.3g} of max |C| at S={splits} M={m} N={n} K={k}"
    tiles = -(-k // 64)
    if tiles < splits:  # splits past the last tile add nothing: zeros
        assert (part[tiles:] == 0).all()
    perr = (part.double().sum(0) - want).norm() / want.norm()
    assert perr < 1e-4, f"the partial sums add to the product within {perr:.3g}"


@pytest.mark.parametrize("splits", [3, 8])
def test_two_runs_same_bits(torch, splits):
    chain = load_splitk(splits)
    a, b = inputs(torch, 128, 4096, 4096, seed=5)
    t1, t2 = chain.tensors(a, b), chain.tensors(a, b)
    torch.cuda.synchronize()
    assert torch.equal(t1["C"], t2["C"]) and torch.equal(t1["C_part"], t2["C_part"])


def test_tune_a_chain_and_dispatch(torch, tmp_path):
    """`derivc tune` on the split-K variants (a chain each): the table names built variants, and
    the loaded tuned chain runs the recorded one per shape, correctly and deterministically."""
    import derivc
    from codegen import tune_cmd
    from codegen.tuned import TunedChain
    from compiler.cli import build_to
    from compiler.tuning_table import bucket

    out = tmp_path / "tuned"
    build_to(TUNED, out, proofs=False)
    shapes = [(128, 4096, 4096), (1000, 1024, 1000), (4096, 4096, 512)]
    args = argparse.Namespace(dir=str(out), output=None, no_proofs=True, seed=0,
                              sizes=[f"M={m},N={n},K={k}" for m, n, k in shapes])
    assert tune_cmd.main(args) == 0
    table = json.loads((out / "tuning.json").read_text())
    chain = derivc.load(out)
    assert isinstance(chain, TunedChain)
    for m, n, k in shapes:
        row = table["buckets"][bucket({"M": m, "N": n, "K": k}, ("M", "N", "K"))]
        print(f"M={m} N={n} K={k}: {row['variant']}  {row['ms']}")
        a, b = inputs(torch, m, n, k, seed=1)
        assert chain.variant_at((tuple(a.shape), tuple(b.shape))) == row["variant"]
        c1, c2 = chain(a, b), chain(a, b)
        torch.cuda.synchronize()
        want = a.double() @ b.double()
        assert (c1.double() - want).norm() / want.norm() < 2e-3 and torch.equal(c1, c2)
