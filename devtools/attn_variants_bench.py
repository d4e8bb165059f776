"""Attention variants on the H200: derivc's wgmma kernels vs FlexAttention (compiled, same mask /
score_mod) and SDPA cuDNN where it takes the variant, in one process (anchors: PERF_ANCHORS.md,
anchors2_bench.py: 16 heads, 16k tokens, d = 128, fp16; FLOPs of the unmasked area as the anchors
count them: 4·B·H·N²·D, halved for causal, times W/N for the window).

    python3 devtools/attn_variants_bench.py     # writes $OUT/attn_variants.json

A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

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


def row(**k) -> None:
    RES.append(k)
    print(k, flush=True)
    (OUT / "attn_variants.json").write_text(json.dumps(RES, indent=1))


def main() -> None:
    import torch
    import torch.nn.functional as F
    import triton.testing as tt
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import derivc
    from compiler.cli import build_to

    def bench(fn) -> float:
        return tt.do_bench(fn, warmup=25, rep=100, return_mode="median")

    from codegen.mappings import online_fold

    real = online_fold.render_attn_wgmma
    kernels, other = {}, {}
    for case, ex in (("causal", "flash_attention_wgmma"), ("sliding1024", "attention_sliding_window"),
                     ("alibi-causal", "attention_alibi")):
        t = time.time()
        build_to(ROOT / "examples" / f"{ex}.yaml", Path("/tmp/attn-bench") / ex, proofs=False)
        kernels[case] = derivc.load(Path("/tmp/attn-bench") / ex)
        if case != "alibi-causal":  # the other schedule of the printer: no S / P.V overlap
            online_fold.render_attn_wgmma = lambda p, c, o, overlap=True: real(p, c, o, overlap=False)
            try:
                build_to(ROOT / "examples" / f"{ex}.yaml", Path("/tmp/attn-bench") / (ex + "_no"), proofs=False)
                other[case] = derivc.load(Path("/tmp/attn-bench") / (ex + "_no"))
            finally:
                online_fold.render_attn_wgmma = real
        row(case=f"build {ex}", s=round(time.time() - t, 1))
    H, D, W = 16, 128, 1024
    fa = torch.compile(flex_attention)
    for N in (4096, 16384):
        B = 16384 // N
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
        slope = torch.randn(H, device="cuda", dtype=torch.float32)

        def causal(b, h, qi, ki):
            return qi >= ki

        def window(b, h, qi, ki):
            return (qi >= ki) & (qi - ki < W)

        def alibi(score, b, h, qi, ki):
            return score + slope[h] * (ki - qi)

        full = 4 * B * H * N * N * D
        cases = [("causal", (q, k, v), causal, None, full * 0.5),
                 ("sliding1024", (q, k, v), window, None, full * W / N),
                 ("alibi-causal", (q, k, v, slope), causal, alibi, full * 0.5)]
        for name, args, mm, sm, flops in cases:
            try:
                bm = create_block_mask(mm, None, None, N, N)
                ours = kernels[name]
                o1 = ours(*args)
                o2 = fa(q, k, v, block_mask=bm, score_mod=sm)
                diff = (o1.float() - o2.float()).abs().max().item()
                ms_o = bench(lambda: ours(*args))
                ms_f = bench(lambda: fa(q, k, v, block_mask=bm, score_mod=sm))
                r = dict(case=f"{name} N={N} B={B}", derivc=round(flops / ms_o / 1e9, 1),
                         flex=round(flops / ms_f / 1e9, 1), ratio_flex=round(ms_f / ms_o, 3), max_abs_diff=diff)
                if name in other:
                    o3 = other[name](*args)
                    ms_n = bench(lambda: other[name](*args))
                    r.update(derivc_no_overlap=round(flops / ms_n / 1e9, 1), ratio_flex_no_overlap=round(ms_f / ms_n, 3),
                             max_abs_diff_no_overlap=(o3.float() - o2.float()).abs().max().item())
            except Exception:  # noqa: BLE001
                r = dict(case=f"{name} N={N}", err=traceback.format_exc(limit=2)[-600:])
            try:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    if name == "causal":
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                    else:  # an additive float mask: the window / causal as -inf, ALiBi as the bias
                        i = torch.arange(N, device="cuda")
                        rel = (i[None, :] - i[:, None]).float()  # j - i
                        keep = (rel <= 0) & ((-rel < W) if name == "sliding1024" else True)
                        bias = (slope[:, None, None] * rel) if name == "alibi-causal" else torch.zeros(1, 1, 1, device="cuda")
                        mask = torch.where(keep, bias, torch.tensor(float("-inf"), device="cuda")).to(torch.float16)
                        mask = mask.expand(H, N, N)[None]
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
                    ms_c = bench(fn)
                r["cudnn"] = round(flops / ms_c / 1e9, 1)
                r["ratio_cudnn"] = round(ms_c / ms_o, 3)
            except Exception as exc:  # noqa: BLE001
                r["cudnn"] = f"not supported: {type(exc).__name__}: {str(exc)[:160]}"
            row(**r)


if __name__ == "__main__":
    main()
