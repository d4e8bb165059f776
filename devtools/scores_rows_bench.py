"""Issue "Say it any way, get the fast kernel" on the H200, in one process (anchors: FlexAttention
compiled with the same score_mod / mask_mod / block mask; torch.compile for the rows):

- soft-capping (30·tanh(s/30), causal) and prefix-LM (j <= i || j < 1024) attention, d128, 16 heads,
  16k tokens, seqlen 4k and 16k; FLOPs of the unmasked area (4·B·H·N²·D × its fraction);
- softmax / RMSNorm / LayerNorm with a dynamic row against the fixed-width kernel at 8192 x 8192;
- softmax, cross-entropy and the cross-entropy backward (dX) over 8192 x 50257 and 8192 x 128256
  against torch.compile and the copy of X, as TB/s of the bytes the op must move (softmax: X read,
  Y written; cross-entropy: X read; its backward: X read, dX written); vs_copy is the copy's time
  per byte over ours.

    python3 devtools/scores_rows_bench.py          # writes $OUT/scores_rows.json
    python3 devtools/scores_rows_bench.py --rows   # the rows part only (< 3 min)

A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
OUT = Path(os.environ.get("OUT", "/tmp"))
RES: list[dict] = []
VOCABS = (50257, 128256)  # GPT-2's vocabulary, Llama 3's


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


def _build(spec: dict) -> Path:
    """Build a spec (a dict) without proofs into /tmp/sr-bench/<name> (kept between runs)."""
    from compiler.cli import build_to

    out = Path("/tmp/sr-bench") / spec["name"]
    if not (out / "kernel.cu").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        path = out.parent / f"{spec['name']}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        build_to(path, out, proofs=False, seed=1)
    return out


def _spec(example: str, name: str | None = None, **sizes) -> dict:
    path = ROOT / "examples" / f"{example}.yaml"
    spec = yaml.safe_load((path if path.exists() else ROOT / "examples" / "pending" / f"{example}.yaml").read_text())
    spec["sizes"].update(sizes)
    spec["name"] = name or example
    return spec


def _threads(spec: dict, kernel: str, count: int) -> dict:
    """spec with the backward kernel's PARALLEL-to-thread count set (at 128256 columns the dX
    kernel takes 1024 threads: with 256 ptxas spills its partly unrolled sweeps)."""
    for k in spec["grad"]["kernels"]:
        for st in k["schedule"] if k["output"] == kernel else ():
            if st["rule"] == "parallel" and st.get("to") == "thread":
                st["count"] = count
    return spec


def _forward_threads(spec: dict, count: int) -> dict:
    """spec with its column loop over `count` threads (the dynamic softmax / RMSNorm take 128)."""
    for st in spec["schedule"]:
        if st["rule"] == "parallel" and st.get("to") == "thread":
            st["count"] = count
    spec["name"] += f"_t{count}"
    return spec


ROW_SPECS = [_spec(e) for e in ("softmax_online", "softmax_dynamic", "rmsnorm", "rmsnorm_dynamic", "layernorm",
                                "layernorm_dynamic")] + [
    _forward_threads(_spec(e), 256) for e in ("softmax_dynamic", "rmsnorm_dynamic")] + [
    _spec(e, f"{e}_{c}", C=c) for e in ("softmax_vocab", "softmax_vocab_online", "cross_entropy") for c in VOCABS] + [
    _spec("cross_entropy_grad", "cross_entropy_grad_50257", C=50257),
    _threads(_spec("cross_entropy_grad", "cross_entropy_grad_128256", C=128256), "dX", 1024)]


def build_all() -> None:
    """Every build of the rows part, in parallel processes (a build is CPU-bound)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(12, os.cpu_count() or 1)) as pool:
        for spec, res in zip(ROW_SPECS, pool.map(_try_build, ROW_SPECS)):
            if res:
                row(case=f"build {spec['name']}", error=res)


def _try_build(spec: dict) -> str:
    try:
        _build(spec)
        return ""
    except Exception:  # noqa: BLE001 - reported per build
        return traceback.format_exc(limit=3)[-800:]


def rows() -> None:
    """Dynamic-width vs fixed-width rows at 8192 x 8192 (the same bytes: X read, Y written)."""
    import derivc
    import torch

    r, c = 8192, 8192
    x = torch.randn(r, c, device="cuda", dtype=torch.float16)
    w = torch.randn(c, device="cuda", dtype=torch.float16)
    bias = torch.randn(c, device="cuda", dtype=torch.float16)
    nbytes = 2 * r * c * 2
    copy = torch.empty_like(x)
    ms_copy = _bench(lambda: copy.copy_(x))
    row(case="copy 8192x8192 f16", tbs=round(nbytes / ms_copy / 1e9, 3))
    for fixed, dynamic, args in (("softmax_online", "softmax_dynamic", (x,)), ("rmsnorm", "rmsnorm_dynamic", (x, w)),
                                 ("layernorm", "layernorm_dynamic", (x, w, bias))):
        try:
            kf, kd = derivc.load(_build(_spec(fixed))), derivc.load(_build(_spec(dynamic)))
            a = args[: len(kf.inputs)]
            ms_f, ms_d = _bench(lambda: kf(*a)), _bench(lambda: kd(*a))
            diff = (kf(*a).float() - kd(*a).float()).abs().max().item()
            row(case=f"{dynamic} vs {fixed} 8192x8192", fixed_tbs=round(nbytes / ms_f / 1e9, 3),
                dynamic_tbs=round(nbytes / ms_d / 1e9, 3), dynamic_vs_fixed=round(ms_f / ms_d, 3), max_abs_diff=diff)
            if dynamic != "layernorm_dynamic":  # the same kernel over 256 threads (the example: 128)
                k2 = derivc.load(_build(_forward_threads(_spec(dynamic), 256)))
                ms_2 = _bench(lambda: k2(*a))
                row(case=f"{dynamic} 256 threads vs {fixed} 8192x8192", dynamic_tbs=round(nbytes / ms_2 / 1e9, 3),
                    dynamic_vs_fixed=round(ms_f / ms_2, 3))
        except Exception:  # noqa: BLE001
            row(case=f"{dynamic}", error=traceback.format_exc(limit=3)[-800:])


def vocab() -> None:
    """Softmax, cross-entropy and its backward over vocabulary rows (8192 x 50257, 8192 x 128256)
    against torch.compile and a device copy of X, TB/s of the bytes each op must move: softmax X
    read + Y written, cross-entropy X read once, its backward X read + dX written."""
    import torch
    import torch.nn.functional as F

    soft = torch.compile(lambda z: torch.softmax(z.float(), dim=-1).half())
    xent = torch.compile(lambda z, t: F.cross_entropy(z.float(), t, reduction="none"))

    def xent_grad(z, t, g):  # dX = g (softmax(z) - onehot(t)), 0 on ignored rows (t = -100)
        p = torch.softmax(z.float(), dim=-1)
        hot = (torch.arange(z.shape[-1], device=z.device)[None, :] == t[:, None]).float()  # fused, not one_hot's int64
        return ((p - hot) * torch.where(t >= 0, g, torch.zeros_like(g))[:, None]).half()

    xent_grad_c = torch.compile(xent_grad)
    for v in VOCABS:
        _vocab_rows(v, soft, xent, xent_grad_c)
        torch.cuda.empty_cache()


def _vocab_rows(v: int, soft, xent, xent_grad) -> None:
    """The rows of one vocabulary width (its tensors freed on return)."""
    import derivc
    import torch

    try:
        xv = torch.randn(8192, v, device="cuda", dtype=torch.float16)
        t = torch.randint(0, v, (8192,), device="cuda")
        t[::97] = -100  # ignored rows
        t32 = t.to(torch.int32)
        g = torch.randn(8192, device="cuda", dtype=torch.float32)
        xbytes = 8192 * v * 2
        copy = torch.empty_like(xv)
        ms_copy = _bench(lambda: copy.copy_(xv))
        row(case=f"copy 8192x{v} f16", tbs=round(2 * xbytes / ms_copy / 1e9, 3))
    except Exception:  # noqa: BLE001
        row(case=f"vocab {v} inputs", error=traceback.format_exc(limit=3)[-800:])
        return
    cases = (
        ("softmax", f"softmax_vocab_{v}", lambda k: k(xv), lambda: soft(xv), 2 * xbytes),
        ("softmax one-pass max + sum", f"softmax_vocab_online_{v}", lambda k: k(xv), lambda: soft(xv), 2 * xbytes),
        ("cross-entropy", f"cross_entropy_{v}", lambda k: k(xv, t32), lambda: xent(xv, t), xbytes),
        ("cross-entropy backward dX", f"cross_entropy_grad_{v}/grad/dX", lambda k: k(xv, t32, g),
         lambda: xent_grad(xv, t, g), 2 * xbytes),
    )
    for what, build, ours, anchor, nb in cases:
        try:
            k = derivc.load(Path("/tmp/sr-bench") / build)
            diff = (ours(k).float() - anchor().float()).abs().max().item()
            ms_k, ms_c = _bench(lambda: ours(k)), _bench(anchor)
            row(case=f"{what} 8192x{v}", derivc_tbs=round(nb / ms_k / 1e9, 3), compile_tbs=round(nb / ms_c / 1e9, 3),
                ratio_compile=round(ms_c / ms_k, 3), vs_copy=round(ms_copy / ms_k * nb / (2 * xbytes), 3),
                max_abs_diff=diff)
        except Exception:  # noqa: BLE001
            row(case=f"{what} 8192x{v}", error=traceback.format_exc(limit=3)[-800:])


def main() -> None:
    """--rows: the rows part only (builds in parallel, < 3 min on an H200)."""
    only_rows = "--rows" in sys.argv[1:]
    if not only_rows:
        attention()
    build_all()
    rows()
    vocab()


if __name__ == "__main__":
    main()
