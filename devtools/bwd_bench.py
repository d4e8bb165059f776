"""Derived backward kernels on the H200 against their anchors, in one process (issue "Backward at
tensor-core speed"; anchors: PERF_ANCHORS.md).

Attention: 16 heads, 16k tokens (B*N = 16384), fp16, [B, H, N, D]; the derived backward (every
kernel of grad.json, LSE from the forward) against SDPA's backward with the cuDNN and the FLASH
(FlashAttention-2) backends, and FlexAttention's compiled backward for the variants.  FLOPs of the
backward: 2.5 x the forward's 4*B*H*N^2*D (halved for causal), as the anchors count them.
Peak memory of the backward (torch.cuda.max_memory_allocated above the inputs) is reported too.

    python3 devtools/bwd_bench.py [example ...]     # writes $OUT/bwd_bench.json

A case `example:variant` builds the example's text through a VARIANTS transform first (the wgmma
backward on blocks of two warpgroups, at head dim 64, with three-stage rings, or dQ on key tiles of 128).

A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
OUT = Path(os.environ.get("OUT", "/tmp"))
RES: list[dict] = []
TOKENS, HEADS = 16384, 16
# (example, head dim, causal, flex mask: None | "causal" | "sliding1024")
ATTENTION = [
    ("flash_attention_grad_mma_d128", 128, True, "causal"),
    ("flash_attention_wgmma_noncausal_grad", 128, False, None),  # dK and dV in one kernel (FUSE-SUMS), wgmma
    ("flash_attention_wgmma_grad", 128, True, "causal"),  # the same, causal
    ("flash_attention_wgmma_noncausal_grad:two_warpgroups", 128, False, None),  # dV / dK on 128 key rows
    ("flash_attention_wgmma_grad:two_warpgroups", 128, True, "causal"),
    ("flash_attention_wgmma_noncausal_grad:three_stages", 128, False, None),  # last accumulation in flight
    ("flash_attention_wgmma_grad:three_stages", 128, True, "causal"),
    ("flash_attention_wgmma_noncausal_grad:two_warpgroups_three_stages", 128, False, None),
    ("flash_attention_wgmma_noncausal_grad:wide_dq", 128, False, None),  # dQ on key tiles of 128
    ("flash_attention_wgmma_grad:wide_dq", 128, True, "causal"),
    ("flash_attention_wgmma_noncausal_grad:d64", 64, False, None),
    ("flash_attention_wgmma_grad:d64", 64, True, "causal"),
    ("flash_attention_grad_mma", 64, True, "causal"),
    ("flash_attention_grad_mma_noncausal", 64, False, None),
    ("attention_sliding_window_grad", 128, True, "sliding1024"),
]




def _variants() -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_attention_bwd_wgmma import head_dim, three_stages, two_warpgroups, wide_dq

    return {"two_warpgroups": two_warpgroups, "d64": lambda t: head_dim(t, 64), "three_stages": three_stages,
            "wide_dq": wide_dq, "two_warpgroups_three_stages": lambda t: three_stages(two_warpgroups(t))}


def spec_of(case: str) -> Path:
    """The spec of a case: examples/<example>.yaml, through its variant's transform if it names one."""
    example, _, variant = case.partition(":")
    spec = ROOT / "examples" / f"{example}.yaml"
    if not variant:
        return spec
    out = Path("/tmp/bwd-bench/specs") / f"{example}-{variant}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_variants()[variant](spec.read_text()))
    return out


def row(**k) -> None:
    RES.append(k)
    print(k, flush=True)
    (OUT / "bwd_bench.json").write_text(json.dumps(RES, indent=1))


def _bench(fn) -> float:
    import triton.testing as tt

    return float(tt.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def attention(example: str, d: int, causal: bool, flex: str | None, n: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import derivc
    from compiler.cli import build_to

    spec = spec_of(example)
    out = Path("/tmp/bwd-bench") / f"{spec.stem}-{hashlib.sha256(spec.read_bytes()).hexdigest()[:10]}"  # a changed spec rebuilds
    if not out.exists():
        build_to(spec, out, proofs=False)
    t = derivc.load_training(out)
    b, h = TOKENS // n, HEADS
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.float16) for _ in range(4))
    given = {"W": 1024} if flex == "sliding1024" else {}
    _, saved = t.forward_with_saved(Q=q, K=k, V=v, **given)
    env = {**saved, t.manifest.seed: do}
    parts = {}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = t.backward(saved, do, **given)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    for entry, build, run, by_name in zip(t.manifest.kernels, t.backward_builds, t._backward, t._by_name):
        args = [env[x] for x in build.inputs]
        res = run(*args, **{nm: given[nm] for nm in by_name})
        env.update(zip((o for o, _, _ in entry.outputs), res if entry.also else (res,)))
        out = None if entry.also else res  # a kernel with further outputs (dK beside dV) allocates them
        parts["+".join(o for o, _, _ in entry.outputs)] = _bench(lambda: run(*args, out=out, **{nm: given[nm] for nm in by_name}))
    total = _bench(lambda: t.backward(saved, do, **given))
    area = (n * min(n, 1024) - 1024 * 1023 / 2) / (n * n) if flex == "sliding1024" else (0.5 if causal else 1.0)
    flops = 2.5 * 4 * b * h * n * n * d * area
    anchors = {}
    qs, ks, vs = (x.clone().requires_grad_(True) for x in (q, k, v))
    if flex != "sliding1024":
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base2 = torch.cuda.memory_allocated()
                    torch.autograd.grad(o, (qs, ks, vs), do, retain_graph=True)
                    torch.cuda.synchronize()
                    anchors[name + "_peak_mib"] = (torch.cuda.max_memory_allocated() - base2) / 2**20
                    anchors[name] = _bench(lambda: torch.autograd.grad(o, (qs, ks, vs), do, retain_graph=True))
            except Exception as exc:  # noqa: BLE001 - a backend that refuses the shape
                anchors[name] = f"refused: {str(exc).splitlines()[0][:120]}"
    if flex is not None:
        import torch._functorch.config as functorch_config
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        functorch_config.donated_buffer = False  # the timing loop runs the backward of one graph again

        if flex == "causal":
            mask = lambda bb, hh, i, j: j <= i  # noqa: E731
        else:
            mask = lambda bb, hh, i, j: (j <= i) & (i - j < 1024)  # noqa: E731
        bm = create_block_mask(mask, None, None, n, n, device="cuda")
        fa = torch.compile(flex_attention)
        o = fa(qs, ks, vs, block_mask=bm)
        anchors["flex"] = _bench(lambda: torch.autograd.grad(o, (qs, ks, vs), do, retain_graph=True))
    tf = lambda ms: round(flops / ms / 1e9, 1)  # noqa: E731
    row(case=example, n=n, b=b, d=d, causal=causal, derived_ms=round(total, 4), derived_tflops=tf(total),
        parts_ms={k: round(x, 4) for k, x in parts.items()}, derived_peak_mib=round(peak / 2**20, 1),
        **{k: (round(x, 4) if isinstance(x, float) else x) for k, x in anchors.items()},
        **{f"{k}_tflops": tf(x) for k, x in anchors.items() if isinstance(x, float) and not k.endswith("mib")},
        **{f"ratio_vs_{k}": round(x / total, 3) for k, x in anchors.items() if isinstance(x, float) and not k.endswith("mib")})
    del grads


def main() -> None:
    only = set(sys.argv[1:])
    for example, d, causal, flex in ATTENTION:
        if only and example not in only:
            continue
        for n in (4096, 16384):
            t = time.time()
            try:
                attention(example, d, causal, flex, n)
            except Exception as exc:  # noqa: BLE001 - one case failing must not hide the others
                row(case=example, n=n, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                    trace=traceback.format_exc()[-1500:])
            print(f"  ({time.time() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
