"""The gradient GEMM layouts on the GPU: dA = dC·Bᵀ (NT) and dB = Aᵀ·dC (TN), mma.sync and wgmma,
f16 and bf16, against torch.

Each example (examples/gemm_grad_{a,b}[_wgmma].yaml, and its bf16 twin) is built as `derivc
build` builds it and run on a NaN-poisoned output at forward sizes M x N x K with tails
(77 x 129 x 200: odd rows, the cp.async kernel's scalar path; 1000 x 1024 x 1000: the TMA kernel
with partial tiles; 4096³); the reference is torch's float32 product of the same fp16 / bf16
inputs, the tolerance the kernel step's (codegen.run_cmd.TOLERANCE).  At 4096³ it prints the
time of the derived kernel and of torch.matmul on the same layout (transposed views, cuBLAS)
and their ratio:

    python -m pytest -q -s -p no:cacheprovider tests/gpu/test_gemm_grad_layouts_gpu.py
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
NAMES = ["gemm_grad_a", "gemm_grad_a_wgmma", "gemm_grad_b", "gemm_grad_b_wgmma"]
SIZES = [(77, 129, 200), (1000, 1024, 1000), (4096, 4096, 4096)]  # forward M x N x K
TORCH_DT = {"f16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import derivc
    from compiler.cli import build_to

    root = tmp_path_factory.mktemp("grad_layouts")
    cache = {}

    def get(name: str, dtype: str):
        if (name, dtype) not in cache:
            spec = root / f"{name}_{dtype}.yaml"
            spec.write_text((EX / f"{name}.yaml").read_text().replace("dtype: f16", f"dtype: {dtype}"))
            build_to(spec, root / f"{name}_{dtype}", proofs=False)
            cache[name, dtype] = derivc.load(root / f"{name}_{dtype}")
        return cache[name, dtype]

    return get


def operands(name: str, m: int, n: int, k: int, dt):
    """(kernel inputs in spec order, out -> the same product by torch.matmul into out, output shape)."""
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
    rand = lambda *s: torch.randn(*s, device="cuda", dtype=dt, generator=g)  # noqa: E731
    dc = rand(m, n)
    if name.startswith("gemm_grad_a"):  # dA[M, K] = dC[M, N] · B[K, N]ᵀ
        b = rand(k, n)
        return (dc, b), (lambda out: torch.matmul(dc, b.t(), out=out)), (m, k)
    a = rand(m, k)  # dB[K, N] = A[M, K]ᵀ · dC[M, N]
    return (a, dc), (lambda out: torch.matmul(a.t(), dc, out=out)), (k, n)


def reference(name: str, inputs) -> torch.Tensor:
    x, y = (t.float() for t in inputs)
    return x @ y.t() if name.startswith("gemm_grad_a") else x.t() @ y


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", NAMES)
def test_gradient_layout_matches_torch(built, name, size, dtype):
    from codegen.run_cmd import TOLERANCE

    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference is exact float32
    kernel = built(name, dtype)
    inputs, _, shape = operands(name, *size, TORCH_DT[dtype])
    out = torch.full(shape, float("nan"), device="cuda", dtype=TORCH_DT[dtype])
    kernel(*inputs, out=out)
    torch.cuda.synchronize()
    ref = reference(name, inputs)
    assert not torch.isnan(out).any(), f"{name} {dtype} at {size}: NaN left in the output"
    err = float((out.float() - ref).norm() / ref.norm())
    assert err <= TOLERANCE[dtype], f"{name} {dtype} at {size}: rel error {err:.3e} > {TOLERANCE[dtype]:.0e}"


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("name", NAMES)
def test_gradient_layout_timing_against_torch(built, name, dtype):
    """Prints ms of the derived kernel and of torch.matmul (same layout) at 4096³, and the ratio."""
    from codegen.bench import _sets, _timer

    m = n = k = 4096
    kernel = built(name, dtype)
    sets = [operands(name, m, n, k, TORCH_DT[dtype]) for _ in range(_sets(3 * m * k * 2))]
    outs = [torch.empty(shape, device="cuda", dtype=TORCH_DT[dtype]) for _, _, shape in sets]
    ours = _timer([lambda x=x, o=o: kernel(*x, out=o) for (x, _, _), o in zip(sets, outs)])
    theirs = _timer([lambda mm=mm, o=o: mm(o) for (_, mm, _), o in zip(sets, outs)])
    tflops = 2.0 * m * n * k / 1e9
    print(f"\n{name} {dtype} {m}x{n}x{k}: derived {ours:.3f} ms ({tflops / ours:.0f} TFLOP/s), "
          f"torch.matmul {theirs:.3f} ms ({tflops / theirs:.0f} TFLOP/s), ratio torch/derived {theirs / ours:.2f}")
    assert ours > 0 and theirs > 0
