"""Attention layouts and GQA on the H200, one process (issue 11): d = 128, causal, 16k tokens.

    python3 devtools/bench_layouts.py [OUT_DIR]

- [B, N, H, D] (flash_attention_wgmma_bnhd.yaml) against [B, H, N, D] (flash_attention_wgmma.yaml),
  same shape, H = 16, seqlen 4k (B = 4) and 16k (B = 1);
- the same pair on mma.sync (flash_attention.yaml and the [B, N, H, D] twin);
- GQA (attention_gqa.yaml, G = 4 and 8, H = 16 query heads) against the MHA kernel at the same
  shape, and against SDPA with enable_gqa (each backend that accepts it) and SDPA MHA.
Timing: codegen.bench's do_bench median, rotating input sets larger than L2; the derived kernels
in ROUNDS interleaved rounds (median), so a clock drift does not favour the first one timed.
A developer script.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codegen.bench import EXAMPLES as EXAMPLES_DIR  # noqa: E402
from codegen.bench import _build, _sets, _timer  # noqa: E402

H, D, TOKENS = 16, 128, 16384
ROUNDS = 3  # interleaved rounds, order rotated: clock drift (a cold GPU boosts) hits every kernel alike


def interleaved(cases: dict) -> dict:
    """Median ms per case over ROUNDS rounds, each round timing every case once, rotating the order."""
    import statistics

    names = list(cases)
    times: dict = {n: [] for n in names}
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(_timer(cases[n]))
    return {n: statistics.median(ts) for n, ts in times.items()} | {f"{n}_rounds": ts for n, ts in times.items()}


def main() -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/out")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        kern = {"bhnd": _build("flash_attention_wgmma.yaml", root), "bnhd": _build("flash_attention_wgmma_bnhd.yaml", root),
                "gqa": _build("attention_gqa.yaml", root), "mma_bhnd": _build("flash_attention.yaml", root)}
        twin = (EXAMPLES_DIR / "flash_attention_wgmma_bnhd.yaml").read_text()
        for old, new in (("instr: wgmma", "instr: mma_sync"), ("index: j, size: 128", "index: j, size: 64"),
                         ("index: j_, size: 128", "index: j_, size: 64"), ("stages: 3", "stages: 2"),
                         ("name: flash_attention_wgmma_bnhd", "name: flash_attention_bnhd_mma_sync")):
            twin = twin.replace(old, new)
        (root / "bnhd_mma.yaml").write_text(twin)
        from compiler.cli import build_to
        import derivc
        build_to(root / "bnhd_mma.yaml", root / "bnhd_mma", proofs=False)
        kern["mma_bnhd"] = derivc.load(root / "bnhd_mma")
        f16 = dict(device="cuda", dtype=torch.float16)
        for n in (4096, 16384):
            b = TOKENS // n
            flops = 4.0 * b * H * n * n * D / 2
            k_sets = _sets(4 * b * H * n * D * 2)
            qkv = [tuple(torch.randn(b, H, n, D, **f16) for _ in range(3)) for _ in range(k_sets)]
            qkv_t = [tuple(t.transpose(1, 2).contiguous() for t in x) for x in qkv]  # the same data, [B, N, H, D]
            outs = [torch.empty(b, H, n, D, **f16) for _ in qkv]
            cases = {"bhnd": [lambda x=x, o=o: kern["bhnd"](*x, out=o) for x, o in zip(qkv, outs)],
                     # the same kernel again: the spread between the two is the measurement noise
                     "bhnd_again": [lambda x=x, o=o: kern["bhnd"](*x, out=o) for x, o in zip(qkv, outs)],
                     "bnhd": [lambda x=x, o=o: kern["bnhd"](*x, out=o.view(b, n, H, D)) for x, o in zip(qkv_t, outs)],
                     "mma_bhnd": [lambda x=x, o=o: kern["mma_bhnd"](*x, out=o) for x, o in zip(qkv, outs)],
                     "mma_bnhd": [lambda x=x, o=o: kern["mma_bnhd"](*x, out=o.view(b, n, H, D))
                                  for x, o in zip(qkv_t, outs)]}
            ref = kern["bhnd"](*qkv[0])
            errs = {}
            for name in ("bnhd", "mma_bnhd"):
                got = kern[name](*qkv_t[0]).transpose(1, 2)
                errs[name] = float((got.float() - ref.float()).norm() / ref.float().norm())
            gsets = {}
            for g in (4, 8):
                hk = H // g
                gsets[g] = [(x[0].view(b, hk, g, n, D), x[1][:, :hk].contiguous(), x[2][:, :hk].contiguous()) for x in qkv]
                cases[f"gqa{g}"] = [lambda x=x, o=o, hk=hk, g=g: kern["gqa"](*x, out=o.view(b, hk, g, n, D))
                                    for x, o in zip(gsets[g], outs)]
                o = kern["gqa"](*gsets[g][0]).view(b, H, n, D)
                kk, vv = (t.repeat_interleave(g, dim=1) for t in gsets[g][0][1:])
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    r = F.scaled_dot_product_attention(qkv[0][0], kk, vv, is_causal=True)
                errs[f"gqa{g}"] = float((o.float() - r.float()).norm() / r.float().norm())
            ms = interleaved(cases)
            tf = {k: flops / v / 1e9 for k, v in ms.items() if not k.endswith("_rounds")}
            anchors = {}
            for name, backend in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        anchors[f"sdpa_mha_{name}"] = flops / _timer(
                            [lambda x=x: F.scaled_dot_product_attention(*x, is_causal=True) for x in qkv]) / 1e9
                except RuntimeError as exc:
                    anchors[f"sdpa_mha_{name}"] = f"unsupported: {str(exc).splitlines()[0][:80]}"
                for g in (4, 8):
                    try:
                        with sdpa_kernel(backend):
                            anchors[f"sdpa_gqa{g}_{name}"] = flops / _timer([lambda x=x: F.scaled_dot_product_attention(
                                x[0].reshape(b, H, n, D), x[1], x[2], is_causal=True, enable_gqa=True)
                                for x in gsets[g]]) / 1e9
                    except (RuntimeError, TypeError) as exc:
                        anchors[f"sdpa_gqa{g}_{name}"] = f"unsupported: {str(exc).splitlines()[0][:80]}"
            row = {"seqlen": n, "batch": b, "heads": H, "tflops": tf, "ms_rounds": {k: v for k, v in ms.items()
                                                                                  if k.endswith("_rounds")},
                   "ratio_bnhd_over_bhnd": tf["bnhd"] / tf["bhnd"],
                   "ratio_mma_bnhd_over_bhnd": tf["mma_bnhd"] / tf["mma_bhnd"],
                   "ratio_gqa4_over_mha": tf["gqa4"] / tf["bhnd"], "ratio_gqa8_over_mha": tf["gqa8"] / tf["bhnd"],
                   "anchors": anchors, "rel_errors": errs}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del qkv, qkv_t, outs, gsets, cases
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": ROUNDS}
    (out_dir / "bench_layouts.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
