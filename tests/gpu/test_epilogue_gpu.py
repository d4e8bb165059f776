"""GEMM epilogues on the GPU against the spec in float64 (the interpreter on IR₀).

Each example (bias + ReLU, bias + GELU, bias + residual) is built as `derivc build` builds it and
run at sizes with tails in M, N and K, NaN-poisoned outputs, two input seeds; sizes whose K and N
are multiples of 8 take the TMA kernel, the others the cp.async one.  The mma.sync mapping's
epilogue and a spec declaring B before A (kernel arguments in the kernel IR's order) run too.
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
SIZES = [
    {"M": 150, "N": 270, "K": 72},     # one tile plus tails in M, N; K a partial second tile (TMA)
    {"M": 257, "N": 130, "K": 100},    # K % 8 != 0: the cp.async kernel
    {"M": 300, "N": 517, "K": 136},    # N % 8 != 0: cp.async, scalar tail stores
    {"M": 384, "N": 768, "K": 264},    # interior blocks (the unguarded predicate) and a K tail, TMA
]


def _mma_sync_spec(tmp: Path) -> Path:
    text = (EX / "gemm.yaml").read_text()
    text = text.replace("C[i, j] = sum(k: A[i, k] * B[k, j])",
                        "C[i, j] = max(sum(k: A[i, k] * B[k, j]) + bias[j], 0) - 0.5 * C0[i, j]")
    text = text.replace("  B: {shape: [K, N], dtype: f16}\n",
                        "  B: {shape: [K, N], dtype: f16}\n  bias: {shape: [N], dtype: f16}\n"
                        "  C0: {shape: [M, N], dtype: f16}\n")
    path = tmp / "gemm_epi_mma_sync.yaml"
    path.write_text(text)
    return path


def _swapped_spec(tmp: Path) -> Path:
    text = (EX / "gemm_residual.yaml").read_text().replace(
        "  A: {shape: [M, K], dtype: f16}\n  B: {shape: [K, N], dtype: f16}\n",
        "  B: {shape: [K, N], dtype: f16}\n  A: {shape: [M, K], dtype: f16}\n")
    path = tmp / "gemm_residual_swapped.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import derivc
    from compiler.cli import build_to

    root = tmp_path_factory.mktemp("epilogue")
    cache = {}

    def get(name: str):
        if name not in cache:
            src = {"mma_sync": lambda: _mma_sync_spec(root), "swapped": lambda: _swapped_spec(root)}.get(
                name, lambda: EX / f"{name}.yaml")()
            d = build_to(src, root / name, proofs=False)
            cache[name] = (d, derivc.load(root / name))
        return cache[name]

    return get


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "x".join(str(v) for v in s.values()))
@pytest.mark.parametrize("name", ["gemm_bias_relu", "gemm_bias_gelu", "gemm_residual", "mma_sync", "swapped"])
def test_epilogue_matches_spec(built, name, sizes):
    from codegen.run_cmd import check_kernel

    derivation, kernel = built(name)
    for seed in (1, 2):
        r = check_kernel(kernel, derivation.programs[0], sizes, seed=seed)
        assert not r["nan"], f"{name} at {sizes}: NaN in output"
        assert r["passed"], f"{name} at {sizes}: rel error {r['rel_error']:.3e} > {r['tolerance']:.0e}"


def test_epilogue_against_torch_at_size(built):
    """1000 x 1100 x 1000 (interior blocks, tails, TMA) against torch in float64."""
    import torch.nn.functional as F

    m, n, k = 1000, 1104, 1000
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    c0 = torch.randn(m, n, device="cuda", dtype=torch.float16)
    x = a.double() @ b.double() + bias.double()
    refs = {"gemm_bias_relu": (x.clamp_min(0), (a, b, bias)),
            "gemm_bias_gelu": (F.gelu(x, approximate="tanh"), (a, b, bias)),
            "gemm_residual": (x + c0.double(), (a, b, bias, c0))}
    for name, (ref, args) in refs.items():
        _, kernel = built(name)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        kernel(*args, out=out)
        err = float((out.double() - ref).norm() / ref.norm())
        assert not torch.isnan(out).any() and err < 2e-3, (name, err)
