"""Rows of any width on the GPU against float64: the dynamic-width softmax / LayerNorm / RMSNorm
(one kernel for every width: tails, widths 1 and 7, the vector path at multiples of 8, the scalar
path at odd widths and at an unaligned base), the fixed widths 1000 and 50257 (not divided by
the thread count), softmax checked against torch.softmax in float64 as well; the fused
cross-entropy forward and its derived gradient dX against torch's F.cross_entropy in float64."""
from __future__ import annotations

import pytest

from test_rowwise_gpu import build, check, load_spec

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

DYNAMIC = ["softmax_dynamic", "layernorm_dynamic", "rmsnorm_dynamic"]
WIDTHS = [1, 7, 255, 256, 1000, 1001, 4097, 8192, 50257]


@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamic_width_rows(tmp_path, name):
    d, k, mapping = build(load_spec(name), tmp_path)
    assert mapping == "rowwise"
    for C in WIDTHS:
        for R in (1, 77):
            check(d, k, {"R": R, "C": C}, seed=C + R)


@pytest.mark.parametrize("name", ["softmax_c1000", "softmax_vocab"])
def test_fixed_widths_the_threads_do_not_divide(tmp_path, name):
    d, k, mapping = build(load_spec(name), tmp_path)
    assert mapping == "rowwise"
    for R in (1, 77):
        check(d, k, {"R": R}, seed=R)
    check(d, k, {"R": 33}, seed=5, scale=30.0)  # large logits: exp overflows without the max shift


@pytest.mark.parametrize("C", [7, 1000, 4096, 50257])
@pytest.mark.parametrize("offset", [0, 1])
def test_dynamic_softmax_against_torch_float64(tmp_path, C, offset):
    """offset 1: a base one element past a 16-byte boundary is refused by the runtime (every
    kernel's inputs must be 16-byte aligned); rows that start off a boundary inside an aligned
    tensor (C = 7, 50257) take the kernel's scalar path."""
    _, k, _ = build(load_spec("softmax_dynamic"), tmp_path)
    R = 64
    gen = torch.Generator(device="cuda").manual_seed(C)
    flat = torch.randn(R * C + offset, device="cuda", generator=gen, dtype=torch.float32) * 8
    x = flat.to(torch.float16)[offset:].view(R, C)
    if offset:
        with pytest.raises(ValueError, match="16-byte aligned"):
            k(x)
        return
    y = k(x)
    torch.cuda.synchronize()
    ref = torch.softmax(x.double(), dim=-1)
    err = (y.double() - ref).abs().max().item()
    assert err <= 2e-3, err  # fp16 output of values in [0, 1]
    assert torch.allclose(y.double().sum(-1), torch.ones(R, dtype=torch.float64, device="cuda"), atol=5e-3)


@pytest.mark.parametrize("C", [50257, 1, 7, 1000, 4097, 128256])
def test_cross_entropy_against_torch_float64(tmp_path, C):
    """The fused cross-entropy forward (examples/cross_entropy.yaml at C = 50257; `C: dynamic`
    for the other widths) with i32 targets (the ends 0 and C - 1, ignore_index -100: loss 0),
    logits x1 and x8."""
    spec = load_spec("cross_entropy")
    if C != 50257:
        spec["sizes"]["C"] = "dynamic"
        spec["check_sizes"] = {"R": 2, "C": 1001}
        spec["name"] = "cross_entropy_dynamic"
    _, k, mapping = build(spec, tmp_path)
    assert mapping == "rowwise"
    for R, scale in ((1, 1.0), (77, 1.0), (64, 8.0)):
        gen = torch.Generator(device="cuda").manual_seed(C + R)
        x = (torch.randn(R, C, device="cuda", generator=gen, dtype=torch.float32) * scale).to(torch.float16)
        t = torch.randint(0, C, (R,), device="cuda", generator=gen)
        t[: min(R, 3)] = torch.tensor([C - 1, -100, 0], device="cuda")[: min(R, 3)]  # the ends, ignore_index
        loss = k(x, t.to(torch.int32))
        torch.cuda.synchronize()
        ref = torch.nn.functional.cross_entropy(x.double(), t, reduction="none")  # ignore_index -100: 0
        err = (loss.double() - ref).abs().max().item()
        assert err <= 1e-4 * max(1.0, ref.abs().max().item()), (R, scale, err)


def _cross_entropy_rows(R: int, C: int, seed: int):
    """Logits x4 with an ignored row (-100), all-equal logits, logits ±1e4 with one winner (the
    target on a loser), targets at the ends 0 and C - 1."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(R, C, device="cuda", generator=gen, dtype=torch.float32) * 4).to(torch.float16)
    t = torch.randint(0, C, (R,), device="cuda", generator=gen)
    if R >= 5:
        x[2] = 3.0
        x[3] = torch.where(torch.rand(C, device="cuda", generator=gen) < 0.5, -1e4, 1e4).to(torch.float16)
        x[3, C // 2] = 1e4
        t[:5] = torch.tensor([C - 1, -100, 0, int(torch.argmin(x[3])), C - 1], device="cuda")
    return x, t


@pytest.mark.parametrize("C", [50257, 1, 7, 1000, 4097, 128256])
def test_cross_entropy_backward_against_torch_float64(tmp_path, C):
    """dX of examples/cross_entropy_grad.yaml (its one backward kernel, `C: dynamic` for the widths
    other than 50257) against torch.autograd of F.cross_entropy in float64: ignored rows give exact
    zeros, all-equal and ±1e4 logits no NaN."""
    import derivc
    import yaml

    from compiler.cli import build_to

    spec = load_spec("cross_entropy_grad")
    if C != 50257:
        spec["sizes"]["C"] = "dynamic"
        spec["check_sizes"] = {"R": 2, "C": 1001}
        spec["name"] = "cross_entropy_grad_dynamic"
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    build_to(path, tmp_path / "out", proofs=False, seed=1)
    dx_kernel = derivc.load(tmp_path / "out" / "grad" / "dX")
    for R in (1, 77):
        x, t = _cross_entropy_rows(R, C, seed=C + R)
        dloss = torch.randn(R, device="cuda", dtype=torch.float32)
        dx = dx_kernel(x, t.to(torch.int32), dloss)
        torch.cuda.synchronize()
        leaf = x.double().requires_grad_(True)
        torch.nn.functional.cross_entropy(leaf, t, reduction="none").backward(dloss.double())
        assert bool(torch.isfinite(dx).all()), (R, C)
        err = (dx.double() - leaf.grad).abs().max().item()
        assert err <= 2e-3 * dloss.abs().max().item(), (R, C, err)
        if R >= 5:
            assert bool((dx[1] == 0).all()), "an ignored row's gradient is not 0"
