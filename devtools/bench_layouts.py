"""Attention layouts and GQA on the H200, one process (issue 11): d = 128, causal, 16k tokens.

    python3 devtools/bench_layouts.py [OUT_DIR]

- [B, N, H, D] (flash_attention_wgmma_bnhd.yaml) against [B, H, N, D] (flash_attention_wgmma.yaml),
  same shape, H = 16, seqlen 4k (B = 4) and 16k (B = 1);
- GQA (attention_gqa.yaml, G = 4 and 8, H = 16 query heads) against the MHA kernel at the same
  shape, and against SDPA with enable_gqa (each backend that accepts it) and SDPA MHA.
Timing: codegen.bench's do_bench median, rotating input sets larger than L2.  A developer script.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codegen.bench import _build, _sets, _timer  # noqa: E402

H, D, TOKENS = 16, 128, 16384


def main() -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/out")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        mha = _build("flash_attention_wgmma.yaml", root)
        bnhd = _build("flash_attention_wgmma_bnhd.yaml", root)
        gqa = _build("attention_gqa.yaml", root)
        f16 = dict(device="cuda", dtype=torch.float16)
        for n in (4096, 16384):
            b = TOKENS // n
            flops = 4.0 * b * H * n * n * D / 2
            k_sets = _sets(4 * b * H * n * D * 2)
            qkv = [tuple(torch.randn(b, H, n, D, **f16) for _ in range(3)) for _ in range(k_sets)]
            outs = [torch.empty(b, H, n, D, **f16) for _ in qkv]
            t_mha = _timer([lambda x=x, o=o: mha(*x, out=o) for x, o in zip(qkv, outs)])
            # the same data in [B, N, H, D] (contiguous copies: the kernel reads the strided layout)
            qkv_t = [tuple(t.transpose(1, 2).contiguous() for t in x) for x in qkv]
            o_b = bnhd(*qkv_t[0])
            ref = mha(*qkv[0])
            err_b = float((o_b.transpose(1, 2).float() - ref.float()).norm() / ref.float().norm())
            outs_t = [o.view(b, n, H, D) for o in outs]
            t_bnhd = _timer([lambda x=x, o=o: bnhd(*x, out=o) for x, o in zip(qkv_t, outs_t)])
            rows.append({"case": f"bnhd vs bhnd s{n} b{b} h{H}", "seqlen": n, "batch": b,
                         "bhnd_tflops": flops / t_mha / 1e9, "bnhd_tflops": flops / t_bnhd / 1e9,
                         "ratio_bnhd_over_bhnd": t_mha / t_bnhd, "rel_error_vs_bhnd": err_b})
            print(rows[-1], flush=True)
            del qkv_t
            anchors = {}
            for name, backend in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        anchors[name] = flops / _timer([lambda x=x: F.scaled_dot_product_attention(*x, is_causal=True)
                                                        for x in qkv]) / 1e9
                except RuntimeError as exc:
                    anchors[name] = f"unsupported: {str(exc).splitlines()[0][:80]}"
            for g in (4, 8):
                hk = H // g
                sets = [(x[0].view(b, hk, g, n, D), x[1][:, :hk].contiguous(), x[2][:, :hk].contiguous()) for x in qkv]
                o = gqa(*sets[0]).view(b, H, n, D)
                kk, vv = (t.repeat_interleave(g, dim=1) for t in sets[0][1:])
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    ref = F.scaled_dot_product_attention(qkv[0][0], kk, vv, is_causal=True)
                err = float((o.float() - ref.float()).norm() / ref.float().norm())
                outs_g = [o.view(b, hk, g, n, D) for o in outs]
                t_g = _timer([lambda x=x, o=o: gqa(*x, out=o) for x, o in zip(sets, outs_g)])
                row = {"case": f"gqa G={g} s{n} b{b} h{H} hk{hk}", "seqlen": n, "G": g,
                       "gqa_tflops": flops / t_g / 1e9, "mha_tflops": flops / t_mha / 1e9,
                       "ratio_gqa_over_mha": t_mha / t_g, "rel_error_vs_sdpa": err,
                       "sdpa_mha": anchors}
                for name, backend in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION),
                                      ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
                    try:
                        with sdpa_kernel(backend):
                            t = _timer([lambda x=x: F.scaled_dot_product_attention(
                                x[0].view(b, H, n, D), x[1], x[2], is_causal=True, enable_gqa=True) for x in sets])
                        row[f"sdpa_gqa_{name}"] = flops / t / 1e9
                    except (RuntimeError, TypeError) as exc:
                        row[f"sdpa_gqa_{name}"] = f"unsupported: {str(exc).splitlines()[0][:80]}"
                rows.append(row)
                print(row, flush=True)
                del sets
            del qkv
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    (out_dir / "bench_layouts.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
