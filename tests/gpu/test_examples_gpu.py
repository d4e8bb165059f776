"""Kernels derived from the example schedules, run on the GPU against the spec in float64.

Each example is built exactly as `derivc build` builds it (derivation, lowering, NVRTC), then
run on fresh random inputs with a NaN-poisoned output at sizes that are and are not multiples
of its tiles; the reference is the spec's IR₀ in the float64 interpreter.  At least two
schedules per kernel family, so a schedule change is shown to change the kernel and stay right.
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]

CASES = {
    "gemm.yaml": [{"M": 256, "N": 512, "K": 128}, {"M": 200, "N": 300, "K": 100}],
    "gemm_bf16.yaml": [{"M": 130, "N": 260, "K": 72}],
    "gemm_bf16_64x128.yaml": [{"M": 64, "N": 128, "K": 64}, {"M": 100, "N": 150, "K": 90}],
    "gemm_f32_simt.yaml": [{"M": 128, "N": 64, "K": 32}, {"M": 70, "N": 90, "K": 50}],
    "flash_attention.yaml": [{"B": 2, "H": 2, "N": 256}, {"B": 1, "H": 3, "N": 200}],
    "flash_attention_noncausal.yaml": [{"B": 2, "H": 2, "N": 128}, {"B": 2, "H": 1, "N": 190}],
    "flash_attention_d64.yaml": [{"B": 1, "H": 2, "N": 300}],
    "flash_attention_d64_noncausal.yaml": [{"B": 3, "H": 2, "N": 77}],
    "flash_attention_small_tiles.yaml": [{"B": 2, "H": 2, "N": 150}],
    "flash_attention_wgmma.yaml": [{"B": 2, "H": 2, "N": 256}, {"B": 1, "H": 3, "N": 200}],
    "flash_attention_wgmma_noncausal.yaml": [{"B": 2, "H": 1, "N": 190}],
    "flash_attention_wgmma_d64.yaml": [{"B": 1, "H": 2, "N": 300}],
    "flash_attention_wgmma_d64_noncausal.yaml": [{"B": 3, "H": 2, "N": 77}],
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import derivc
    from compiler.cli import build_to

    root = tmp_path_factory.mktemp("examples")
    cache = {}

    def get(name: str):
        if name not in cache:
            d = build_to(ROOT / "examples" / name, root / name.replace(".yaml", ""), proofs=False)
            cache[name] = (d, derivc.load(root / name.replace(".yaml", "")))
        return cache[name]

    return get


@pytest.mark.parametrize("name,sizes", [(n, s) for n, ss in CASES.items() for s in ss])
def test_example_kernel_matches_spec(built, name, sizes):
    from codegen.run_cmd import check_kernel

    derivation, kernel = built(name)
    for seed in (1, 2):
        r = check_kernel(kernel, derivation.programs[0], sizes, seed=seed)
        assert not r["nan"], f"{name} at {sizes}: NaN in output"
        assert r["passed"], f"{name} at {sizes}: rel error {r['rel_error']:.3e} > {r['tolerance']:.0e}"


def test_schedules_change_the_kernel(built):
    _, k1 = built("flash_attention.yaml")
    _, k2 = built("flash_attention_small_tiles.yaml")
    s1 = (k1.out_dir / "kernel.cu").read_text()
    s2 = (k2.out_dir / "kernel.cu").read_text()
    assert k1.plan.block_m != k2.plan.block_m and s1 != s2
    _, g1 = built("gemm.yaml")
    _, g2 = built("gemm_bf16_64x128.yaml")
    assert (g1.plan.block_m, g1.plan.stages) != (g2.plan.block_m, g2.plan.stages)


def test_attention_matches_torch_sdpa(built):
    import torch.nn.functional as F

    for name, causal in (("flash_attention.yaml", True), ("flash_attention_noncausal.yaml", False),
                         ("flash_attention_wgmma.yaml", True), ("flash_attention_wgmma_noncausal.yaml", False)):
        _, kernel = built(name)
        q, k, v = (torch.randn(2, 4, 333, 128, device="cuda", dtype=torch.float16) for _ in range(3))
        out = kernel(q, k, v)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        err = float((out.float() - ref).norm() / ref.norm())
        assert err < 2e-3, f"{name}: {err}"


@pytest.mark.parametrize("name", ["gemm.yaml", "gemm_bf16.yaml", "gemm_wgmma.yaml"])
@pytest.mark.parametrize("mnk", [(1000, 1100, 1000), (1024, 768, 2048), (257, 520, 1000)])
def test_gemm_interior_fast_path_and_tails(built, name, mnk):
    """Sizes large enough for full k-tiles (the unguarded interior loop) plus tails in M, N, K;
    float64 reference through torch (the interpreter would be slow at these sizes)."""
    _, kernel = built(name)
    m, n, k = mnk
    dt = torch.bfloat16 if kernel.plan.a.dtype == "bf16" else torch.float16
    a = torch.randn(m, k, device="cuda", dtype=dt)
    b = torch.randn(k, n, device="cuda", dtype=dt)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
    kernel(a, b, out=out)
    ref = a.double() @ b.double()
    err = float((out.double() - ref).norm() / ref.norm())
    assert not torch.isnan(out).any() and err < (1e-2 if dt == torch.bfloat16 else 2e-3), err
