"""The attention backward on Hopper warpgroup tensor cores (codegen.mappings.score_sum_wgmma) on the
GPU: the wgmma examples' dV / dK (one kernel) and dQ through derivc.load_training against float64
torch.autograd, causal and not, at N = 1, 77, 129, 1000; a head dim of 64 and blocks of two
warpgroups (the dV / dK kernel on 128 key rows) as spec variants of the same text; deterministic
(the same bits run to run); then each backward kernel's time against SDPA's backward (printed).
The variant examples (sliding window, ALiBi, strict causal, GQA, [B, N, H, D], bottom-right causal,
prefix-LM, bias), their backward on wgmma too: each built once, its tile sums checked to be wgmma
builds, then every case of test_grad_examples_gpu's REFERENCES (and GQA at 16 query / 4 K / V heads)
against float64 autograd, and two backward runs bit for bit equal."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "tests", Path(__file__).resolve().parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from test_attention_bwd_mma_gpu import _inputs, _reference, _rel, _time_ms  # noqa: E402
from test_grad_examples_gpu import REFERENCES, Case, check_gradients  # noqa: E402
from test_attention_bwd_wgmma import head_dim, three_stages, two_warpgroups, wide_dq  # noqa: E402

NONCAUSAL = ROOT / "examples" / "flash_attention_wgmma_noncausal_grad.yaml"
CAUSAL = ROOT / "examples" / "flash_attention_wgmma_grad.yaml"
# case: (spec, causal, head dim, transform of the spec's text)
CASES = {
    "noncausal_d128": (NONCAUSAL, False, 128, None),
    "causal_d128": (CAUSAL, True, 128, None),
    "noncausal_d64": (NONCAUSAL, False, 64, lambda t: head_dim(t, 64)),
    "causal_d64": (CAUSAL, True, 64, lambda t: head_dim(t, 64)),
    "noncausal_d128_two_warpgroups": (NONCAUSAL, False, 128, two_warpgroups),
    "causal_d128_two_warpgroups": (CAUSAL, True, 128, two_warpgroups),
    # three-stage rings: each tile's last accumulation in flight across the next tile's barrier
    "noncausal_d128_three_stages": (NONCAUSAL, False, 128, three_stages),
    "causal_d128_three_stages": (CAUSAL, True, 128, three_stages),
    "causal_d128_two_warpgroups_three_stages": (CAUSAL, True, 128, lambda t: three_stages(two_warpgroups(t))),
    # dQ on key tiles of 128 (m64n128 score wgmmas)
    "noncausal_d128_wide_dq": (NONCAUSAL, False, 128, wide_dq),
    "causal_d128_wide_dq": (CAUSAL, True, 128, wide_dq),
}
SIZES = (1, 77, 129, 1000)
TOL = 1e-2  # f16 inputs and outputs, f32 accumulation: the norm-wise error of the forward's checks


@pytest.fixture(scope="module", params=sorted(CASES))
def built(request, tmp_path_factory) -> tuple[str, Path, bool, int]:
    import derivc

    spec, causal, d, transform = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    if transform is not None:
        path = root / spec.name
        path.write_text(transform(spec.read_text()))
        spec = path
    out = root / "build"
    derivc.build(spec, out)
    return request.param, out, causal, d


def test_backward_kernels_are_wgmma_builds(built):
    name, out, _, _ = built
    manifest = json.loads((out / "grad.json").read_text())
    writes = {k["name"]: [k["output"], *(a["name"] for a in k.get("also", []))] for k in manifest["kernels"]}
    assert writes["dV"] == ["dV", "dK"] and writes["dQ"] == ["dQ"], (name, writes)
    for k in ("dV", "dQ"):
        plan = json.loads((out / "grad" / k / "plan.json").read_text())
        assert plan["mapping"] == "score_sum_wgmma", (name, k)


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


def test_backward_time_vs_sdpa(built, torch):
    """Each backward kernel's time and their sum against SDPA's backward: printed, not asserted."""
    import derivc
    import torch.nn.functional as F

    name, out, causal, d = built
    n, b, h = 4096, 4, 16
    t = derivc.load_training(out)
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", generator=g, dtype=torch.float16) for _ in range(4))
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
    flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
    parts = ", ".join(f"{k} {ms:.3f} ms" for k, ms in times.items())
    print(f"\n[{name}] B={b} H={h} N={n} D={d}: {parts}; total {total:.3f} ms ({flops / total / 1e9:.0f} TFLOP/s); "
          f"SDPA backward {sdpa:.3f} ms ({flops / sdpa / 1e9:.0f} TFLOP/s); ratio SDPA / derived {sdpa / total:.2f}")


# -- the variant examples -------------------------------------------------------------------------

VARIANTS = ("attention_sliding_window_grad", "attention_alibi_grad", "attention_strict_causal_grad",
            "attention_gqa_grad", "flash_attention_wgmma_bnhd_grad", "attention_bottom_right_causal_grad",
            "attention_prefix_lm_grad", "attention_bias_grad")
GQA_16_4 = Case({"B": 1, "HK": 4, "G": 4, "N": 1000, "D": 128})


@pytest.fixture(scope="module")
def variant(tmp_path_factory):
    import derivc
    from compiler.cli import build_to

    root = tmp_path_factory.mktemp("variants")
    cache: dict = {}

    def get(example: str):
        if example not in cache:
            build_to(ROOT / "examples" / f"{example}.yaml", root / example, seed=0, proofs=False)
            cache[example] = (root / example, derivc.load_training(root / example))
        return cache[example]

    return get


@pytest.mark.parametrize("example", VARIANTS)
def test_variant_backward_is_wgmma_and_matches_float64_autograd(torch, variant, example):
    out, t = variant(example)
    manifest = json.loads((out / "grad.json").read_text())
    sums = [k["name"] for k in manifest["kernels"] if k["name"] not in ("Dsum", "dBias")]
    assert sums == ["dV", "dQ"], sums  # GQA too: dK beside dV, both summed over the group in one kernel
    for k in sums:
        plan = json.loads((out / "grad" / k / "plan.json").read_text())
        assert plan["mapping"] == "score_sum_wgmma", (example, k)
    ref = REFERENCES[example]
    cases = ref.cases + ((GQA_16_4,) if example == "attention_gqa_grad" else ())
    for i, case in enumerate(cases):
        check_gradients(torch, t, ref, case, seed=31 + i, where=example)


@pytest.mark.parametrize("example", VARIANTS)
def test_variant_backward_is_deterministic(torch, variant, example):
    """Two backward runs on the same inputs give the same bits (no atomics)."""
    from test_grad_examples_gpu import _inputs as example_inputs

    _, t = variant(example)
    ref = REFERENCES[example]
    case = GQA_16_4 if example == "attention_gqa_grad" else ref.cases[-1]
    xs, dy = example_inputs(torch, t, case, seed=5, ref=ref)
    named = {n: case.sizes[n] for n in case.by_name}
    _, saved = t.forward_with_saved(**xs, **named)
    first = t.backward(saved, dy, **named)
    second = t.backward(saved, dy, **named)
    torch.cuda.synchronize()
    for x in t.manifest.wrt:
        assert torch.equal(first[x], second[x]), (example, f"d{x}")
