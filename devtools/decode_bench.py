"""Issue 18's decode targets (and the prefill / GEMM regression rows) in one device call: build on
the CPU, tune and time on the GPU.

    python devtools/decode_bench.py prepare OUTDIR   # here, no GPU: builds the examples into OUTDIR
    python devtools/decode_bench.py run OUTDIR       # on the H200: tune, load, time (writes $OUT)

Rows, d = 128, fp16, device time (devtools/splitk_bench.py's time_ms: back-to-back calls behind a
sleep kernel, median), ratio = anchor ms / derivc ms (> 1: faster):
- MHA decode, Nq = 1 (examples/decode_splitkv_tuned.yaml: splits x K / V ring stages, tuned at
  these shapes): B / H / Nk = 1/32/32768, 4/32/32768, 8/32/4096, 64/8/2048;
- GQA decode, 32 query / 8 K-V heads, Nq = 1 (decode_splitkv_gqa_tuned.yaml: query tiling x
  splits, tuned): B = 1 and 4 at Nk = 32768;
- small Nq (speculative decoding's verification: decode_splitkv_nq.yaml, GQA 32/8, the new rows
  bottom-right causal; its two built tilings tuned at these shapes): Nq = 2, 4, 8, 16 at B = 1,
  Nk = 32768;
- prefill: flash_attention_wgmma(_noncausal).yaml at N = 4096 (B = 4, H = 16: `derivc bench`'s
  attention shapes and timer, so comparable with runs D / E) vs SDPA FLASH (FA2) and CUDNN;
- gemm_wgmma.yaml at 8192³ vs torch.matmul (cuBLAS), `derivc bench`'s timer.
The decode anchor is SDPA on the same tensors, each backend tried (FLASH_ATTENTION,
EFFICIENT_ATTENTION, CUDNN_ATTENTION, MATH) and the fastest that runs kept (its name is printed):
for Nq = 1 without a mask (none is needed), for GQA with enable_gqa=True; for small Nq the
headline anchor is SDPA *without* the causal mask (less work than ours: a lower bound on the
masked call's time, so the ratio is not flattered), and SDPA with torch's bottom-right causal
bias (torch.nn.attention.bias.causal_lower_right) is printed beside it.  Bandwidth counts K and V
read once (per K-V head for GQA) against a measured device copy (read + write of 2 GiB).
One line per row as it goes; $OUT/decode_bench.json is rewritten after every row.
A developer script: not part of the package.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "devtools")]
BUILDS = {"decode_mha": "decode_splitkv_tuned.yaml", "decode_gqa": "decode_splitkv_gqa_tuned.yaml",
          "decode_nq": "decode_splitkv_nq.yaml", "fa_wgmma": "flash_attention_wgmma.yaml",
          "fa_wgmma_noncausal": "flash_attention_wgmma_noncausal.yaml", "gemm_wgmma": "gemm_wgmma.yaml"}
MHA = [(1, 32, 32768), (4, 32, 32768), (8, 32, 4096), (64, 8, 2048)]  # (B, H, Nk)
GQA = [(1, 32768), (4, 32768)]                                         # (B, Nk), 32 / 8 heads
NQ = [2, 4, 8, 16]                                                      # at B = 1, Nk = 32768
HQ, HK, D = 32, 8, 128


def prepare(outdir: Path) -> None:
    from prebuild import prepare_named

    prepare_named(outdir, BUILDS)


class Run:
    """The run's record, written to $OUT after every row."""

    def __init__(self, out: Path):
        import torch

        self.out = out
        self.record: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                       "tuning": {}, "rows": []}

    def add(self, row: dict[str, Any], line: str) -> None:
        self.record["rows"].append(row)
        print(line, flush=True)
        self.write()

    def write(self) -> None:
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, indent=1))
        os.replace(tmp, self.out)


def tuned_build(outdir: Path, name: str, sizes: list[dict[str, int]], run: Run, budget_s: float) -> Any:
    """derivc tune on a writable copy of OUTDIR/name at `sizes`, then derivc.load."""
    import derivc
    from codegen import tune_cmd

    work = Path("/tmp/derivc-decode-bench") / name
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(outdir / name, work)
    t0 = time.monotonic()
    ns = argparse.Namespace(dir=str(work), output=None, no_proofs=True, seed=0, budget=budget_s, keep=None,
                            sizes=[",".join(f"{k}={v}" for k, v in s.items()) for s in sizes])
    assert tune_cmd.main(ns) == 0, f"derivc tune {name} failed"
    run.record["tuning"][name] = {"s": round(time.monotonic() - t0, 1),
                                  "table": json.loads((work / "tuning.json").read_text())}
    run.write()
    return derivc.load(work)


def variant_of(fn: Any, *xs: Any) -> str:
    inner = getattr(fn, "_kernel", fn)
    at = getattr(inner, "variant_at", None)
    return at(tuple(tuple(x.shape) for x in xs)) if at else "default"


def fastest_sdpa(torch: Any, time_ms: Callable, call: Callable[[], Any]) -> tuple[float, str]:
    """(ms, backend) of the fastest SDPA backend that runs `call`."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    best = (float("inf"), "none")
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel(backend):
                ms = time_ms(torch, call)
        except (RuntimeError, TypeError, ValueError):
            continue
        best = min(best, (ms, backend.name))
    return best


def copy_gbs(torch: Any, time_ms: Callable) -> float:
    """Device copy bandwidth (read + write), GB/s: the decode kernels' ceiling."""
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = time_ms(torch, lambda: y.copy_(x))
    return 2 * 2**30 / (ms * 1e-3) / 1e9


def rel_err(torch: Any, got: Any, want: Any) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def decode_rows(outdir: Path, run: Run, budget_s: float, copy: float) -> None:
    import torch
    import torch.nn.functional as F
    from splitk_bench import time_ms

    mha = tuned_build(outdir, "decode_mha", [{"B": b, "H": h, "Nq": 1, "Nk": nk} for b, h, nk in MHA], run, budget_s)
    for b, h, nk in MHA:
        q, k, v = (torch.randn(b, h, n, D, device="cuda").half() for n in (1, nk, nk))
        err = rel_err(torch, mha(q, k, v), F.scaled_dot_product_attention(q.float(), k.float(), v.float()))
        ours = time_ms(torch, lambda: mha(q, k, v))
        sdpa, backend = fastest_sdpa(torch, time_ms, lambda: F.scaled_dot_product_attention(q, k, v))
        gbs = 2 * b * h * nk * D * 2 / (ours * 1e-3) / 1e9
        name = variant_of(mha, q, k, v)
        run.add({"case": "mha", "B": b, "H": h, "Nq": 1, "Nk": nk, "variant": name, "ms": round(ours, 5),
                 "sdpa_ms": round(sdpa, 5), "sdpa_backend": backend, "ratio": round(sdpa / ours, 3),
                 "kv_gbs": round(gbs), "bw_frac": round(gbs / copy, 3), "rel_err": err},
                f"MHA B={b:>2} H={h:>2} Nk={nk:>5}: {name:<22} {ours:.4f} ms  SDPA {sdpa:.4f} ({backend})  "
                f"{sdpa / ours:5.2f} x  K+V {gbs:5.0f} GB/s = {gbs / copy:.2f} x copy  (err {err:.1e})")
    gqa = tuned_build(outdir, "decode_gqa", [{"B": b, "HK": HK, "Nq": 1, "Nk": nk} for b, nk in GQA], run, budget_s)
    nqb = tuned_build(outdir, "decode_nq", [{"B": 1, "HK": HK, "Nq": nq, "Nk": 32768} for nq in NQ], run, budget_s)
    rows = [(b, nk, 1, gqa) for b, nk in GQA] + [(1, 32768, nq, nqb) for nq in NQ]
    for b, nk, nq, fn in rows:
        q = torch.randn(b, HQ, nq, D, device="cuda").half()
        k, v = (torch.randn(b, HK, nk, D, device="cuda").half() for _ in range(2))
        qv = q.view(b, HK, HQ // HK, nq, D)
        kr, vr = (x.repeat_interleave(HQ // HK, dim=1).float() for x in (k, v))
        keep = torch.arange(nk, device="cuda")[None, :] <= torch.arange(nq, device="cuda")[:, None] + nk - nq
        want = F.scaled_dot_product_attention(q.float(), kr, vr, attn_mask=keep)
        err = rel_err(torch, fn(qv, k, v).view(b, HQ, nq, D), want)
        del kr, vr, want
        ours = time_ms(torch, lambda: fn(qv, k, v))
        sdpa, backend = fastest_sdpa(torch, time_ms, lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        rec = {"case": "gqa" if nq == 1 else "small_nq", "B": b, "HQ": HQ, "HK": HK, "Nq": nq, "Nk": nk,
               "variant": variant_of(fn, qv, k, v), "ms": round(ours, 5), "sdpa_ms": round(sdpa, 5),
               "sdpa_backend": backend, "sdpa_mask": "none", "ratio": round(sdpa / ours, 3), "rel_err": err}
        extra = ""
        if nq > 1:
            from torch.nn.attention.bias import causal_lower_right

            bias = causal_lower_right(nq, nk)
            kr, vr = (x.repeat_interleave(HQ // HK, dim=1) for x in (k, v))  # outside the timed call
            masked, mb = fastest_sdpa(torch, time_ms, lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=bias))
            del kr, vr
            rec.update(sdpa_causal_ms=round(masked, 5), sdpa_causal_backend=mb, ratio_causal=round(masked / ours, 3))
            extra = f"; SDPA bottom-right causal (K / V repeated) {masked:.4f} ({mb}) {masked / ours:5.2f} x"
        gbs = 2 * b * HK * nk * D * 2 / (ours * 1e-3) / 1e9
        rec.update(kv_gbs=round(gbs), bw_frac=round(gbs / copy, 3))
        run.add(rec, f"{rec['case'].upper():<8} B={b} Nq={nq:>2} Nk={nk}: {rec['variant']:<26} {ours:.4f} ms  SDPA "
                     f"{sdpa:.4f} ({backend}, no mask)  {sdpa / ours:5.2f} x  K+V {gbs:5.0f} GB/s = {gbs / copy:.2f} x "
                     f"copy{extra}  (err {err:.1e})")


def regression_rows(outdir: Path, run: Run) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import derivc
    from codegen.bench import _sets, _timer

    for name, causal in (("fa_wgmma", True), ("fa_wgmma_noncausal", False)):
        kern = derivc.load(outdir / name)
        b, h, n = 4, 16, 4096
        shape = (b, h, n, D)
        qkv = [tuple(torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
               for _ in range(_sets(4 * b * h * n * D * 2))]
        outs = [torch.empty(shape, device="cuda", dtype=torch.float16) for _ in qkv]
        err = rel_err(torch, kern(*qkv[0], out=outs[0]), F.scaled_dot_product_attention(*qkv[0], is_causal=causal))
        ours = _timer([lambda x=x, o=o: kern(*x, out=o) for x, o in zip(qkv, outs)])
        anchors = {}
        for an, backend in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(backend):
                anchors[an] = _timer([lambda x=x: F.scaled_dot_product_attention(*x, is_causal=causal) for x in qkv])
        flops = 4.0 * b * h * n * n * D / (2 if causal else 1)
        run.add({"case": f"prefill {name}", "B": b, "H": h, "N": n, "ms": round(ours, 5),
                 "tflops": round(flops / ours / 1e9, 1), "fa2_ms": round(anchors["FA2"], 5),
                 "cudnn_ms": round(anchors["cuDNN"], 5), "ratio_fa2": round(anchors["FA2"] / ours, 3),
                 "ratio_cudnn": round(anchors["cuDNN"] / ours, 3), "rel_err": err},
                f"prefill {name:<19} B={b} H={h} N={n}: {ours:.4f} ms ({flops / ours / 1e9:.0f} TFLOP/s)  "
                f"{anchors['FA2'] / ours:.3f} x FA2  {anchors['cuDNN'] / ours:.3f} x cuDNN  (err {err:.1e})")
    gemm = derivc.load(outdir / "gemm_wgmma")
    m = 8192
    ab = [(torch.randn(m, m, device="cuda").half(), torch.randn(m, m, device="cuda").half()) for _ in range(2)]
    err = rel_err(torch, gemm(*ab[0]), ab[0][0].float() @ ab[0][1].float())
    ours = _timer([lambda x=x: gemm(*x) for x in ab])
    cublas = _timer([lambda x=x: torch.matmul(*x) for x in ab])
    run.add({"case": "gemm_wgmma 8192^3", "ms": round(ours, 5), "cublas_ms": round(cublas, 5),
             "ratio": round(cublas / ours, 3), "tflops": round(2 * m**3 / ours / 1e9, 1), "rel_err": err},
            f"gemm_wgmma 8192^3: {ours:.4f} ms ({2 * m**3 / ours / 1e9:.0f} TFLOP/s)  cuBLAS {cublas:.4f}  "
            f"{cublas / ours:.3f} x  (err {err:.1e})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=["prepare", "run"])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--budget", type=float, default=40.0, help="seconds each `derivc tune` may spend (default 40)")
    ap.add_argument("--skip", default="", help="comma-separated: decode, regression")
    args = ap.parse_args()
    if args.step == "prepare":
        prepare(args.outdir)
        return
    import torch
    from splitk_bench import time_ms

    t0 = time.monotonic()
    run = Run(Path(os.environ.get("OUT", "/tmp")) / "decode_bench.json")
    copy = copy_gbs(torch, time_ms)
    run.record["copy_gbs"] = round(copy)
    print(f"device copy (read + write): {copy:.0f} GB/s", flush=True)
    skip = set(filter(None, args.skip.split(",")))
    if "decode" not in skip:
        decode_rows(args.outdir, run, args.budget, copy)
    if "regression" not in skip:
        regression_rows(args.outdir, run)
    run.record["wall_s"] = round(time.monotonic() - t0, 1)
    run.write()
    print(f"{run.record['wall_s']} s; wrote {run.out}", flush=True)


if __name__ == "__main__":
    main()
