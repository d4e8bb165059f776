"""Derived backward kernels on the H200 against their anchors, in one process (issue "Backward at
tensor-core speed"; anchors: PERF_ANCHORS.md).

Attention: 16 heads, 16k tokens (B*N = 16384), fp16, [B, H, N, D]; the derived backward (every
kernel of grad.json, LSE from the forward) against SDPA's backward with the cuDNN and the FLASH
(FlashAttention-2) backends, and FlexAttention's compiled backward for the variants.  FLOPs of the
backward: 2.5 x the forward's 4*B*H*N^2*D (halved for causal), as the anchors count them.
Peak memory of the backward (torch.cuda.max_memory_allocated above the inputs) is reported too.

    python3 devtools/bwd_bench.py [example ...]     # writes $OUT/bwd_bench.json

    python3 devtools/bwd_bench.py                   # the default cases (ATTENTION): < 5 min on an H200

The default cases: the wgmma backward causal and not at d128 and d64 (against cuDNN), the variants
(sliding window 1024, ALiBi causal, strict causal) against FlexAttention compiled with the same
mask_mod / score_mod and a block mask, GQA (16 query / 4 K / V heads) against the MHA backward and
[B, N, H, D] against [B, H, N, D] (both measured in the same run).  Every spec is built first, in
parallel.  A case `example:variant` builds the example's text through a VARIANTS transform first
(the wgmma backward on blocks of two warpgroups, at head dim 64, with three-stage rings, or dQ on
key tiles of 128); MORE lists the cases run only by name.

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
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
OUT = Path(os.environ.get("OUT", "/tmp"))
RES: list[dict] = []
TOKENS, HEADS = 16384, 16
WINDOW = 1024


class Case(NamedTuple):
    """A benchmark case: the example (`example:variant` through a VARIANTS transform), its head dim,
    its mask (none, causal, strict, sliding: j <= i && i - j < 1024) and score term (alibi: a slope
    per head times j - i), its layout (bhnd, or bnhd: [B, N, H, D]), its query heads per K / V head
    (GQA: 16 query heads over 16 / groups K / V heads), and the case it is compared with in the same
    run (`like`: GQA against the MHA backward, BNHD against BHND)."""

    example: str
    d: int = 128
    mask: str = "causal"
    score: str = ""
    layout: str = "bhnd"
    groups: int = 1
    like: str = ""
    flex: bool = False  # FlexAttention compiled with the case's mask_mod / score_mod (a compile per case and size)


# one run of these (the default) stays under 5 minutes on an H200: the builds run in parallel first
ATTENTION = [
    Case("flash_attention_wgmma_grad", flex=True),  # dK and dV in one kernel (FUSE-SUMS), wgmma; the MHA reference
    Case("flash_attention_wgmma_noncausal_grad", mask="none"),
    Case("flash_attention_wgmma_grad:d64", 64),  # against cuDNN's d64 backward
    Case("flash_attention_wgmma_noncausal_grad:d64", 64, mask="none"),
    Case("attention_sliding_window_grad", mask="sliding", flex=True),  # the variants against FlexAttention
    Case("attention_alibi_grad", score="alibi", flex=True),
    Case("attention_strict_causal_grad", mask="strict", flex=True),
    Case("attention_gqa_grad", groups=4, like="flash_attention_wgmma_grad"),  # 16 query / 4 K / V heads
    Case("flash_attention_wgmma_bnhd_grad", layout="bnhd", like="flash_attention_wgmma_grad"),
]
# by name only (python3 devtools/bwd_bench.py CASE ...): the schedule variants of the wgmma backward
MORE = [
    Case("flash_attention_grad_mma_d128", flex=True),
    Case("flash_attention_wgmma_noncausal_grad:two_warpgroups", mask="none"),  # dV / dK on 128 key rows
    Case("flash_attention_wgmma_grad:two_warpgroups"),
    Case("flash_attention_wgmma_noncausal_grad:three_stages", mask="none"),  # last accumulation in flight
    Case("flash_attention_wgmma_grad:three_stages"),
    Case("flash_attention_wgmma_noncausal_grad:two_warpgroups_three_stages", mask="none"),
    Case("flash_attention_wgmma_noncausal_grad:wide_dq", mask="none"),  # dQ on key tiles of 128
    Case("flash_attention_wgmma_grad:wide_dq"),
    Case("flash_attention_grad_mma", 64),
    Case("flash_attention_grad_mma_noncausal", 64, mask="none"),
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


def build_dir(case: str) -> Path:
    spec = spec_of(case)
    return Path("/tmp/bwd-bench") / f"{spec.stem}-{hashlib.sha256(spec.read_bytes()).hexdigest()[:10]}"  # a changed spec rebuilds


def _build(case: str) -> str:
    """Build a case's spec (in a worker process); '' or the error."""
    from compiler.cli import build_to

    out = build_dir(case)
    try:
        if not out.exists():
            build_to(spec_of(case), out, proofs=False)
        return ""
    except Exception as exc:  # noqa: BLE001 - reported with the case
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"


def build_all(cases: list[Case]) -> dict[str, str]:
    """Every case's build, in parallel (a build is mostly single-threaded CPU work)."""
    from concurrent.futures import ProcessPoolExecutor

    t = time.time()
    names = sorted({c.example for c in cases})
    with ProcessPoolExecutor(max_workers=max(1, min(len(names), (os.cpu_count() or 2) - 1))) as pool:
        errors = dict(zip(names, pool.map(_build, names)))
    print(f"built {len(names)} spec(s) in {time.time() - t:.0f} s", flush=True)
    return errors


def row(**k) -> None:
    RES.append(k)
    print(k, flush=True)
    (OUT / "bwd_bench.json").write_text(json.dumps(RES, indent=1))


def _bench(fn) -> float:
    import triton.testing as tt

    return float(tt.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def _area(c: Case, n: int) -> float:
    """The fraction of the N x N scores the mask keeps (the FLOPs' factor)."""
    if c.mask == "sliding":
        w = min(n, WINDOW)
        return (n * w - w * (w - 1) / 2) / (n * n)
    return {"none": 1.0, "causal": 0.5, "strict": 0.5}[c.mask]


def _inputs(torch, c: Case, b: int, n: int) -> tuple[dict, object, tuple]:
    """The derived kernels' inputs by name, dO in their layout, and (q, k, v, do, slope) as SDPA and
    FlexAttention read them ([B, H, N, D], K / V with H / groups heads)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    hk = HEADS // c.groups
    q, do = (torch.randn(b, HEADS, n, c.d, generator=g, device="cuda", dtype=torch.float16) for _ in range(2))
    k, v = (torch.randn(b, hk, n, c.d, generator=g, device="cuda", dtype=torch.float16) for _ in range(2))
    slope = (2.0 ** (-8.0 * torch.arange(1, HEADS + 1, device="cuda") / HEADS)).float()
    named = {"Q": q, "K": k, "V": v}
    dO = do
    if c.layout == "bnhd":  # the same values in [B, N, H, D] memory
        named = {x: t.transpose(1, 2).contiguous() for x, t in named.items()}
        dO = do.transpose(1, 2).contiguous()
    if c.groups > 1:  # Q, dO as [B, HK, G, N, D]: query head h = hk * G + g
        named["Q"] = q.view(b, hk, c.groups, n, c.d)
        dO = do.view(b, hk, c.groups, n, c.d)
    if c.score == "alibi":
        named["Slope"] = slope
    return named, dO, (q, k, v, do, slope)


def _keep(c: Case):
    """The mask as FlexAttention's mask_mod."""
    return {"causal": lambda bb, hh, i, j: j <= i, "strict": lambda bb, hh, i, j: j < i,
            "sliding": lambda bb, hh, i, j: (j <= i) & (i - j < WINDOW)}[c.mask]


def anchors(c: Case, n: int, q, k, v, do, slope) -> dict:
    """SDPA's cuDNN and FlashAttention-2 backward (masks none / causal, GQA through enable_gqa), and
    FlexAttention's compiled backward with the case's mask_mod / score_mod and a block mask."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out: dict = {}
    qs, ks, vs = (x.clone().requires_grad_(True) for x in (q, k, v))
    gqa = {"enable_gqa": True} if c.groups > 1 else {}
    if c.mask in ("none", "causal") and not c.score:
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=c.mask == "causal", **gqa)
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    torch.autograd.grad(o, (qs, ks, vs), do, retain_graph=True)
                    torch.cuda.synchronize()
                    out[name + "_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
                    out[name] = _bench(lambda: torch.autograd.grad(o, (qs, ks, vs), do, retain_graph=True))
            except Exception as exc:  # noqa: BLE001 - a backend that refuses the shape
                out[name] = f"refused: {str(exc).splitlines()[0][:120]}"
    if c.flex:
        import torch._functorch.config as functorch_config
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        functorch_config.donated_buffer = False  # the timing loop runs the backward of one graph again
        bm = create_block_mask(_keep(c), None, None, n, n, device="cuda")
        kw = {}
        if c.score == "alibi":
            kw["score_mod"] = lambda s, bb, hh, i, j: s + slope[hh] * (j - i)
        try:
            o = torch.compile(flex_attention)(qs, ks, vs, block_mask=bm, **kw)
            out["flex"] = _bench(lambda: torch.autograd.grad(o, (qs, ks, vs), do, retain_graph=True))
        except Exception as exc:  # noqa: BLE001 - reported, the derived numbers still count
            out["flex"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return out


def attention(c: Case, n: int) -> None:
    import torch

    import derivc

    t = derivc.load_training(build_dir(c.example))
    b = TOKENS // n
    named, dO, ref = _inputs(torch, c, b, n)
    given = {"W": WINDOW} if c.mask == "sliding" else {}
    _, saved = t.forward_with_saved(**named, **given)
    env = {**saved, t.manifest.seed: dO}
    parts = {}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = t.backward(saved, dO, **given)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    for entry, build, run, by_name in zip(t.manifest.kernels, t.backward_builds, t._backward, t._by_name):
        args = [env[x] for x in build.inputs]
        res = run(*args, **{nm: given[nm] for nm in by_name})
        env.update(zip((o for o, _, _ in entry.outputs), res if entry.also else (res,)))
        out = None if entry.also else res  # a kernel with further outputs (dK beside dV) allocates them
        parts["+".join(o for o, _, _ in entry.outputs)] = _bench(lambda: run(*args, out=out, **{nm: given[nm] for nm in by_name}))
    total = _bench(lambda: t.backward(saved, dO, **given))
    flops = 2.5 * 4 * b * HEADS * n * n * c.d * _area(c, n)
    anc = anchors(c, n, *ref)
    tf = lambda ms: round(flops / ms / 1e9, 1)  # noqa: E731
    extra = {}
    like = next((r for r in RES if r.get("case") == c.like and r.get("n") == n and "derived_ms" in r), None)
    if like is not None:  # GQA's TFLOP/s against the MHA backward's; BNHD's time against BHND's
        extra = {"like": c.like, "ratio_tflops_vs_like": round(tf(total) / like["derived_tflops"], 3),
                 "ratio_time_like_vs_this": round(like["derived_ms"] / total, 3)}
    row(case=c.example, n=n, b=b, d=c.d, mask=c.mask, score=c.score, layout=c.layout, groups=c.groups,
        derived_ms=round(total, 4), derived_tflops=tf(total),
        parts_ms={k: round(x, 4) for k, x in parts.items()}, derived_peak_mib=round(peak / 2**20, 1),
        **{k: (round(x, 4) if isinstance(x, float) else x) for k, x in anc.items()},
        **{f"{k}_tflops": tf(x) for k, x in anc.items() if isinstance(x, float) and not k.endswith("mib")},
        **{f"ratio_vs_{k}": round(x / total, 3) for k, x in anc.items() if isinstance(x, float) and not k.endswith("mib")},
        **extra)
    del grads


def main() -> None:
    only = sys.argv[1:]
    known = {c.example: c for c in ATTENTION + MORE}
    unknown = [x for x in only if x not in known]
    if unknown:
        sys.exit(f"bwd_bench: unknown case(s) {', '.join(unknown)}; known: {', '.join(known)}")
    cases = [known[x] for x in only] if only else ATTENTION
    # a case compared with another runs after it (the reference is measured in the same run)
    cases = sorted(cases, key=lambda c: bool(c.like))
    start = time.time()
    errors = build_all(cases)
    for c in cases:
        for n in (4096, 16384):
            t = time.time()
            try:
                if errors[c.example]:
                    raise RuntimeError(f"build: {errors[c.example]}")
                attention(c, n)
            except Exception as exc:  # noqa: BLE001 - one case failing must not hide the others
                row(case=c.example, n=n, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                    trace=traceback.format_exc()[-1500:])
            print(f"  ({time.time() - t:.0f} s)", flush=True)
    print(f"all cases: {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
