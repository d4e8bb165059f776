"""Issue "Say it any way, get the fast kernel" on the H200, in one process (anchors: FlexAttention
compiled with the same score_mod / mask_mod / block mask; torch.compile for the rows):

- soft-capping (30·tanh(s/30), causal) and prefix-LM (j <= i || j < 1024) attention, d128, 16 heads,
  16k tokens, seqlen 4k and 16k; FLOPs of the unmasked area (4·B·H·N²·D × its fraction);
- softmax / RMSNorm / LayerNorm with a dynamic row against the fixed-width kernel at 8192 x 8192;
- softmax over 8192 x 50257 (vocabulary width) and cross-entropy against torch.compile, as TB/s
  of the bytes the op must move (read X once, write Y once).

    python3 devtools/scores_rows_bench.py     # writes $OUT/scores_rows.json

A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
OUT = Path(os.environ.get("OUT", "/tmp"))
RES: list[dict] = []


def row(**k) -> None:
    RES.append(k)
    print(k, flush=True)
    (OUT / "scores_rows.json").write_text(json.dumps(RES, indent=1))


def _bench(fn) -> float:
    import triton.testing as tt

    return float(tt.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _load(example: str):
    import derivc
    from compiler.cli import build_to

    out = Path("/tmp/sr-bench") / example
    if not out.exists():
        build_to(ROOT / "examples" / f"{example}.yaml", out, proofs=False)
    return derivc.load(out)


def attention() -> None:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    fa = torch.compile(flex_attention)
    H, D, P = 16, 128, 1024
    for n in (4096, 16384):
        b = 16384 // n
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, H, n, D, generator=g, device="cuda", dtype=torch.float16) for _ in range(3))
        full = 4 * b * H * n * n * D
        prefix_area = (n * (n + 1) / 2 + P * (n - P) - P * (P - 1) / 2) / (n * n)

        def causal(bb, hh, i, j):
            return j <= i

        def prefix(bb, hh, i, j):
            return (j <= i) | (j < P)

        def softcap(score, bb, hh, i, j):
            return 30 * torch.tanh(score / 30)

        for name, example, mask, mod, area, given in (
                ("softcap causal", "attention_softcap", causal, softcap, 0.5, {}),
                ("prefix-LM 1024", "attention_prefix_lm", prefix, None, prefix_area, {"Prefix": P})):
            try:
                ours = _load(example)
                bm = create_block_mask(mask, None, None, n, n)
                o1 = ours(q, k, v, **given)
                o2 = fa(q, k, v, block_mask=bm, score_mod=mod)
                diff = (o1.float() - o2.float()).abs().max().item()
                ms_o = _bench(lambda: ours(q, k, v, **given))
                ms_f = _bench(lambda: fa(q, k, v, block_mask=bm, score_mod=mod))
                flops = full * area
                row(case=f"{name} N={n} B={b}", derivc_tflops=round(flops / ms_o / 1e9, 1),
                    flex_tflops=round(flops / ms_f / 1e9, 1), ratio_flex=round(ms_f / ms_o, 3), max_abs_diff=diff)
            except Exception:  # noqa: BLE001 - one case failing must not hide the others
                row(case=f"{name} N={n}", error=traceback.format_exc(limit=3)[-800:])


def rows() -> None:
    import torch

    r, c = 8192, 8192
    x = torch.randn(r, c, device="cuda", dtype=torch.float16)
    w = torch.randn(c, device="cuda", dtype=torch.float16)
    bias = torch.randn(c, device="cuda", dtype=torch.float16)
    nbytes = 2 * r * c * 2
    for fixed, dynamic, args in (("softmax_online", "softmax_dynamic", (x,)), ("rmsnorm", "rmsnorm_dynamic", (x, w)),
                                 ("layernorm", "layernorm_dynamic", (x, w, bias))):
        try:
            kf, kd = _load(fixed), _load(dynamic)
            n_in = len(kf.inputs)
            a = args[:n_in]
            ms_f, ms_d = _bench(lambda: kf(*a)), _bench(lambda: kd(*a))
            diff = (kf(*a).float() - kd(*a).float()).abs().max().item()
            row(case=f"{dynamic} vs {fixed} 8192x8192", fixed_tbs=round(nbytes / ms_f / 1e9, 3),
                dynamic_tbs=round(nbytes / ms_d / 1e9, 3), dynamic_vs_fixed=round(ms_f / ms_d, 3), max_abs_diff=diff)
        except Exception:  # noqa: BLE001
            row(case=f"{dynamic}", error=traceback.format_exc(limit=3)[-800:])
    copy = torch.empty_like(x)
    ms_copy = _bench(lambda: copy.copy_(x))
    row(case="copy 8192x8192 f16", tbs=round(nbytes / ms_copy / 1e9, 3))
    v = 50257
    xv = torch.randn(8192, v, device="cuda", dtype=torch.float16)
    t = torch.randint(0, v, (8192,), device="cuda")
    vbytes = 2 * 8192 * v * 2
    try:
        k = _load("softmax_vocab")
        ref = torch.compile(lambda z: torch.softmax(z.float(), dim=-1).half())
        ms_k, ms_c = _bench(lambda: k(xv)), _bench(lambda: ref(xv))
        diff = (k(xv).float() - ref(xv).float()).abs().max().item()
        row(case="softmax 8192x50257", derivc_tbs=round(vbytes / ms_k / 1e9, 3), compile_tbs=round(vbytes / ms_c / 1e9, 3),
            ratio_compile=round(ms_c / ms_k, 3), max_abs_diff=diff)
    except Exception:  # noqa: BLE001
        row(case="softmax_vocab", error=traceback.format_exc(limit=3)[-800:])
    try:
        k = _load("cross_entropy")
        tf = t.float()
        ref = torch.compile(lambda z, tt: torch.nn.functional.cross_entropy(z.float(), tt, reduction="none"))
        ms_k, ms_c = _bench(lambda: k(xv, tf)), _bench(lambda: ref(xv, t))
        diff = (k(xv, tf).float() - ref(xv, t).float()).abs().max().item()
        row(case="cross-entropy 8192x50257", derivc_tbs=round(vbytes / 2 / ms_k / 1e9, 3),
            compile_tbs=round(vbytes / 2 / ms_c / 1e9, 3), ratio_compile=round(ms_c / ms_k, 3), max_abs_diff=diff)
    except Exception:  # noqa: BLE001
        row(case="cross_entropy", error=traceback.format_exc(limit=3)[-800:])


def main() -> None:
    attention()
    rows()


if __name__ == "__main__":
    main()
