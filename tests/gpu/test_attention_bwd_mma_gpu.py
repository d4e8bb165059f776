"""The attention backward on mma.sync tensor cores (codegen.mappings.score_sum) on the GPU: the
built examples' dV, dK, dQ through derivc.load_training against float64 torch.autograd, causal
and not, head dims 64 and 128, at N = 1, 77, 129, 1000; then the time of each backward kernel
against torch SDPA's backward (printed, informative only).  The d128 examples compute dK and dV
in one kernel (FUSE-SUMS: the dV kernel writes dK too); their backward is deterministic (the same
bits run to run: no atomics anywhere)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EXAMPLES = {"causal_d64": ("flash_attention_grad_mma.yaml", True),
            "noncausal_d64": ("flash_attention_grad_mma_noncausal.yaml", False),
            "causal_d128": ("flash_attention_grad_mma_d128.yaml", True)}
# (the wgmma examples' dV / dK kernel is score_sum wgmma: tests/gpu/test_attention_bwd_wgmma_gpu.py)
FUSED = {"causal_d128"}  # dK written by the dV kernel
SIZES = (1, 77, 129, 1000)
B, H = 2, 3
TOL = 1e-2  # f16 inputs and outputs, f32 accumulation: the norm-wise error of the forward's checks


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def built(request, tmp_path_factory) -> tuple[str, Path, bool, int]:
    import derivc
    import yaml

    name, causal = EXAMPLES[request.param]
    path = ROOT / "examples" / name
    out = tmp_path_factory.mktemp(request.param) / "build"
    derivc.build(path, out)
    d = int(yaml.safe_load(path.read_text())["sizes"]["D"])
    return request.param, out, causal, d


def _inputs(torch, n: int, d: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, n, d, device="cuda", generator=g, dtype=torch.float32).half() for _ in range(4))
    return q, k, v, do


def _reference(torch, q, k, v, do, causal: bool):
    q64, k64, v64 = (x.double().requires_grad_(True) for x in (q, k, v))
    n, d = q.shape[-2], q.shape[-1]
    s = (q64 @ k64.transpose(-1, -2)) / d ** 0.5
    if causal:
        keep = torch.ones(n, n, dtype=torch.bool, device="cuda").tril()
        s = s.masked_fill(~keep, float("-inf"))
    o = torch.softmax(s, dim=-1) @ v64
    o.backward(do.double())
    return o.detach(), {"Q": q64.grad, "K": k64.grad, "V": v64.grad}


def _rel(torch, got, want) -> float:
    den = torch.linalg.norm(want).item()
    return torch.linalg.norm(got.double() - want).item() / (den if den > 0 else 1.0)


def test_backward_kernels_are_tensor_core_builds(built):
    import json

    name, out, _, _ = built
    manifest = json.loads((out / "grad.json").read_text())
    writes = {k["name"]: [k["output"], *(a["name"] for a in k.get("also", []))] for k in manifest["kernels"]}
    want = {"dV": ["dV", "dK"], "dQ": ["dQ"]} if name in FUSED else {"dV": ["dV"], "dK": ["dK"], "dQ": ["dQ"]}
    for k, outs in want.items():
        assert writes[k] == outs, (name, writes)
        plan = json.loads((out / "grad" / k / "plan.json").read_text())
        assert plan["mapping"] == "score_sum_mma_sync", k


def test_backward_is_deterministic(built, torch):
    """Two backward runs on the same inputs give the same bits (dQ separate, no atomics)."""
    import derivc

    name, out, _, d = built
    t = derivc.load_training(out)
    q, k, v, do = _inputs(torch, 1000, d, 3)
    _, saved = t.forward_with_saved(Q=q, K=k, V=v)
    first = t.backward(saved, do)
    second = t.backward(saved, do)
    torch.cuda.synchronize()
    for x in ("Q", "K", "V"):
        assert torch.equal(first[x], second[x]), (name, f"d{x}")


@pytest.mark.parametrize("n", SIZES)
def test_backward_matches_float64_autograd(built, torch, n):
    import derivc

    name, out, causal, d = built
    t = derivc.load_training(out)
    q, k, v, do = _inputs(torch, n, d, n)
    o, saved = t.forward_with_saved(Q=q, K=k, V=v)
    grads = t.backward(saved, do)
    torch.cuda.synchronize()
    o_ref, g_ref = _reference(torch, q, k, v, do, causal)
    assert _rel(torch, o, o_ref) < TOL, (name, n, "O")
    for x in ("Q", "K", "V"):
        err = _rel(torch, grads[x], g_ref[x])
        assert grads[x].dtype == torch.float16 and err < TOL, (name, n, f"d{x}", err)
        assert torch.isfinite(grads[x]).all(), (name, n, f"d{x}")


def _time_ms(torch, fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps


def test_backward_time_vs_sdpa(built, torch):
    """Each backward kernel's time and their sum against SDPA's backward: printed, not asserted."""
    import derivc
    import torch.nn.functional as F

    name, out, causal, d = built
    n = 4096
    t = derivc.load_training(out)
    q, k, v, do = _inputs(torch, n, d, 7)
    _, saved = t.forward_with_saved(Q=q, K=k, V=v)
    env = {**saved, t.manifest.seed: do}
    times = {}
    for entry, build, run in zip(t.manifest.kernels, t.backward_builds, t._backward):
        args = [env[x] for x in build.inputs]
        res = run(*args)
        env.update(zip((o for o, _, _ in entry.outputs), res if entry.also else (res,)))
        out_ = None if entry.also else res  # a kernel with further outputs allocates them
        times["+".join(o for o, _, _ in entry.outputs)] = _time_ms(torch, lambda: run(*args, out=out_))
    qs, ks, vs = (x.clone().requires_grad_(True) for x in (q, k, v))
    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
    sdpa = _time_ms(torch, lambda: torch.autograd.grad(o, (qs, ks, vs), do, retain_graph=True))
    total = sum(times.values())
    parts = ", ".join(f"{k} {ms:.3f} ms" for k, ms in times.items())
    print(f"\n[{name}] B={B} H={H} N={n} D={d}: {parts}; total {total:.3f} ms; "
          f"SDPA backward {sdpa:.3f} ms; ratio {total / sdpa:.2f}x")
