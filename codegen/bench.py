"""`derivc bench`: derived kernels against their anchors, in one process on the GPU.

Every derived kernel is built from an example schedule (`examples/*.yaml`), so what is timed is
what the derivation produced.  Anchors run in the same process: cuBLAS (`torch.matmul`) for
GEMM, torch SDPA with the FLASH backend (FlashAttention-2) and the CUDNN backend for attention.
Timing: `triton.testing.do_bench` medians after warm-up, rotating among input sets that
together exceed the L2 cache.  Output: a table (case, derived TFLOP/s, anchor TFLOP/s,
ratio), `bench.json` and `bench.png` (TFLOP/s by sequence length) in --out.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
L2_BYTES = 60 * 2**20

GEMM_CASES = [("gemm.yaml", "f16"), ("gemm_bf16.yaml", "bf16"), ("gemm_wgmma.yaml", "f16"),
              ("gemm_wgmma_bf16.yaml", "bf16")]
ATTN_CASES = [  # (schedule, head dim, causal)
    ("flash_attention.yaml", 128, True),
    ("flash_attention_noncausal.yaml", 128, False),
    ("flash_attention_d64.yaml", 64, True),
    ("flash_attention_d64_noncausal.yaml", 64, False),
    ("flash_attention_wgmma.yaml", 128, True),
    ("flash_attention_wgmma_noncausal.yaml", 128, False),
    ("flash_attention_wgmma_d64.yaml", 64, True),
    ("flash_attention_wgmma_d64_noncausal.yaml", 64, False),
]
SEQLENS = (1024, 2048, 4096, 8192, 16384)
TOKENS, HIDDEN = 16384, 2048


def _build(yaml_name: str, root: Path) -> Any:
    import derivc
    from compiler.cli import build_to

    out = root / yaml_name.replace(".yaml", "")
    build_to(EXAMPLES / yaml_name, out, proofs=False)
    return derivc.load(out)


def _timer(fn_sets: list[Callable[[], Any]]) -> float:
    """Median ms of one call, rotating among the prepared input sets."""
    import triton.testing

    state = {"k": 0}

    def step() -> None:
        fn_sets[state["k"] % len(fn_sets)]()
        state["k"] += 1

    return float(triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median"))


def _sets(nbytes: int) -> int:
    return max(2, min(6, -(-2 * L2_BYTES // max(nbytes, 1))))


def bench_gemm(root: Path, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    import torch

    rows = []
    for yaml_name, dtype in GEMM_CASES:
        if not (EXAMPLES / yaml_name).exists():
            continue
        try:
            kern = _build(yaml_name, root)
        except Exception as exc:  # a schedule without a kernel (yet) is reported, not fatal
            rows.append({"case": yaml_name, "error": str(exc).splitlines()[0]})
            continue
        tdt = torch.float16 if dtype == "f16" else torch.bfloat16
        for n in sizes:
            k_sets = _sets(3 * n * n * 2)
            xs = [(torch.randn(n, n, device="cuda", dtype=tdt), torch.randn(n, n, device="cuda", dtype=tdt))
                  for _ in range(k_sets)]
            outs = [torch.empty(n, n, device="cuda", dtype=tdt) for _ in range(k_sets)]
            got = kern(*xs[0], out=outs[0])
            ref = xs[0][0].float() @ xs[0][1].float()
            err = float((got.float() - ref).norm() / ref.norm())
            flops = 2.0 * n ** 3
            t_d = _timer([lambda a=a, b=b, o=o: kern(a, b, out=o) for (a, b), o in zip(xs, outs)])
            t_a = _timer([lambda a=a, b=b, o=o: torch.matmul(a, b, out=o) for (a, b), o in zip(xs, outs)])
            rows.append({"family": "gemm", "case": f"{yaml_name} {dtype} {n}^3", "n": n, "dtype": dtype,
                         "derived_tflops": flops / t_d / 1e9, "anchor": "cuBLAS",
                         "anchor_tflops": flops / t_a / 1e9, "ratio": t_a / t_d, "rel_error": err})
            del xs, outs
    return rows


def bench_attention(root: Path, seqlens: tuple[int, ...]) -> list[dict[str, Any]]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for yaml_name, d, causal in ATTN_CASES:
        try:
            kern = _build(yaml_name, root)
        except Exception as exc:
            rows.append({"case": yaml_name, "error": str(exc).splitlines()[0]})
            continue
        heads = HIDDEN // d
        for n in seqlens:
            b = max(1, TOKENS // n)
            shape = (b, heads, n, d)
            k_sets = _sets(4 * b * heads * n * d * 2)
            qkv = [tuple(torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
                   for _ in range(k_sets)]
            outs = [torch.empty(shape, device="cuda", dtype=torch.float16) for _ in range(k_sets)]
            got = kern(*qkv[0], out=outs[0])
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ref = F.scaled_dot_product_attention(*qkv[0], is_causal=causal)
            err = float((got.float() - ref.float()).norm() / ref.float().norm())
            flops = 4.0 * b * heads * n * n * d / (2 if causal else 1)
            t_d = _timer([lambda x=x, o=o: kern(*x, out=o) for x, o in zip(qkv, outs)])
            anchors = {}
            for name, backend in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        anchors[name] = _timer([lambda x=x: F.scaled_dot_product_attention(*x, is_causal=causal)
                                                for x in qkv])
                except RuntimeError:
                    anchors[name] = float("nan")
            mma = kern.plan.mma
            rows.append({"family": "attention", "case": f"{mma} d{d} {'causal' if causal else 'full'} b{b} s{n}",
                         "mma": mma, "d": d, "causal": causal, "seqlen": n, "batch": b, "heads": heads,
                         "derived_tflops": flops / t_d / 1e9, "anchor": "FA2",
                         "anchor_tflops": flops / anchors["FA2"] / 1e9, "ratio": anchors["FA2"] / t_d,
                         "cudnn_tflops": flops / anchors["cuDNN"] / 1e9, "ratio_cudnn": anchors["cuDNN"] / t_d,
                         "rel_error_vs_fa2": err})
            del qkv, outs
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'case':44s} {'derived':>9s} {'anchor':>15s} {'ratio':>6s} {'cuDNN':>7s} {'ratio':>6s}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:44s} not built: {r['error'][:70]}")
            continue
        extra = f" {r['cudnn_tflops']:7.1f} {r['ratio_cudnn']:6.2f}" if "cudnn_tflops" in r else ""
        anchor = f"{r['anchor_tflops']:7.1f} {r['anchor']:>7s}"
        print(f"{r['case']:44s} {r['derived_tflops']:9.1f} {anchor} {r['ratio']:6.2f}{extra}")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["d"], r["causal"]) for r in rows if r.get("family") == "attention"})
    if not groups:
        return
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 4), squeeze=False)
    for ax, (d, causal) in zip(axes[0], groups):
        group = [r for r in rows if r.get("d") == d and r.get("causal") == causal]
        for mma in sorted({r["mma"] for r in group}):
            rs = sorted((r for r in group if r["mma"] == mma), key=lambda r: r["seqlen"])
            ax.plot([r["seqlen"] for r in rs], [r["derived_tflops"] for r in rs], "o-", label=f"derivc ({mma})")
        rs = sorted((r for r in group if r["mma"] == group[0]["mma"]), key=lambda r: r["seqlen"])
        xs = [r["seqlen"] for r in rs]
        ax.plot(xs, [r["anchor_tflops"] for r in rs], "s--", label="FA2 (SDPA flash)")
        ax.plot(xs, [r["cudnn_tflops"] for r in rs], "^:", label="cuDNN (SDPA)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"d={d} {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = {x.strip() for x in (args.only or "").split(",") if x.strip()}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="derivc-bench-") as tmp:
        root = Path(tmp)
        if not only or "gemm" in only:
            rows += bench_gemm(root, (8192,) if args.quick else (4096, 8192))
        if not only or "attn" in only:
            rows += bench_attention(root, (1024, 4096) if args.quick else SEQLENS)
    import torch

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    plot(rows, out / "bench.png")
    print_table(rows)
    return 0
