"""Derived softmax / LayerNorm / RMSNorm backwards on the H200 against torch.compile and a copy, in
one process (issue "Backward at tensor-core speed": ≥ torch.compile's backward, ≥ 0.9 × copy
bandwidth over the bytes the kernel must move).

R = C = 8192, fp16.  For each example: the derived backward (every kernel of grad.json, as
load_training(...).backward runs them) and each of its kernels alone; torch.compile of the same
op's forward, its backward timed alone (torch.autograd.grad on the compiled forward's output),
once with only X requiring a gradient (dX alone) and once with every input the example
differentiates (dX and dW / dB); a device copy of the same bytes (the time to move them).
Bandwidth counts what a backward must move: X (softmax: Y) and dY read, dX written, plus W / B
read and dW / dB written where the op has them — the same bytes for the derived kernels, the
torch.compile backward and the copy.

    python3 devtools/norm_bwd_bench.py [example ...]     # writes $OUT/norm_bwd_bench.json

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
R = C = 8192
EPS = 1e-6  # the examples' eps
EXAMPLES = ("softmax_online_grad", "layernorm_grad", "rmsnorm_grad")


def row(**k) -> None:
    RES.append(k)
    print(k, flush=True)
    (OUT / "norm_bwd_bench.json").write_text(json.dumps(RES, indent=1))


def _bench(fn) -> float:
    import triton.testing as tt

    return float(tt.do_bench(fn, warmup=10, rep=100, return_mode="median"))


def _torch_op(example: str):
    """(the op in torch on the example's inputs, the names of its inputs in order)."""
    import torch
    import torch.nn.functional as F

    if example == "softmax_online_grad":
        return (lambda x: torch.softmax(x, dim=-1)), ("X",)
    if example == "layernorm_grad":
        return (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps=EPS)), ("X", "W", "Bb")
    if example == "rmsnorm_grad":
        def rmsnorm(x, w):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)
        return rmsnorm, ("X", "W")
    raise ValueError(example)


def case(example: str) -> None:
    import torch
    import torch._functorch.config as functorch_config

    import derivc
    from compiler.cli import build_to

    functorch_config.donated_buffer = False  # the timing loop runs the backward of one graph again
    out = Path("/tmp/norm-bwd-bench") / example
    if not out.exists():
        build_to(ROOT / "examples" / f"{example}.yaml", out, proofs=False)
    t = derivc.load_training(out)
    op, names = _torch_op(example)
    g = torch.Generator(device="cuda").manual_seed(0)
    inputs = {"X": torch.randn(R, C, generator=g, device="cuda", dtype=torch.float16)}
    for n in names[1:]:
        inputs[n] = (1 + 0.1 * torch.randn(C, generator=g, device="cuda")).to(torch.float16)
    dy = torch.randn(R, C, generator=g, device="cuda", dtype=torch.float16)
    _, saved = t.forward_with_saved(**inputs)
    grads = t.backward(saved, dy)
    env = {**saved, t.manifest.seed: dy}
    parts = {}
    for entry, build, run in zip(t.manifest.kernels, t.backward_builds, t._backward):
        args = [env[x] for x in build.inputs]
        res = env[entry.output] = run(*args)
        parts[entry.output] = _bench(lambda: run(*args, out=res))
    total = _bench(lambda: t.backward(saved, dy))

    # torch.compile: the compiled forward's backward, timed alone
    compiled = torch.compile(op)
    anchors, errors = {}, {}
    for label, wrt in (("dx_only", names[:1]), ("all", names)):
        leaves = {n: inputs[n].clone().requires_grad_(n in wrt) for n in names}
        y = compiled(*(leaves[n] for n in names))
        got = torch.autograd.grad(y, [leaves[n] for n in wrt], dy, retain_graph=True)
        anchors[label] = _bench(lambda: torch.autograd.grad(y, [leaves[n] for n in wrt], dy, retain_graph=True))
        if label == "all":  # the derived gradients against torch's (fp16 both; a sanity check, not the test)
            for n, ref in zip(wrt, got):
                mine = grads[n].float()
                errors[n] = float((mine - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))

    row_bytes = 2 * R * C  # one fp16 R x C tensor
    vec_bytes = 2 * C
    n_vec = len(names) - 1  # W (and B): read once, their gradients written once
    dx_bytes = 3 * row_bytes + n_vec * vec_bytes
    all_bytes = 3 * row_bytes + 2 * n_vec * vec_bytes
    src = torch.empty(all_bytes // 2 // 2, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    copy = _bench(lambda: dst.copy_(src))  # reads half the bytes, writes half: moves all_bytes
    tbs = lambda nbytes, ms: round(nbytes / ms / 1e9, 3)  # noqa: E731
    dx_ms = parts["dX"]
    row(case=example, R=R, C=C,
        derived_ms=round(total, 4), parts_ms={k: round(x, 4) for k, x in parts.items()},
        derived_dx_tbs=tbs(dx_bytes, dx_ms), derived_all_tbs=tbs(all_bytes, total),
        compile_dx_only_ms=round(anchors["dx_only"], 4), compile_dx_only_tbs=tbs(dx_bytes, anchors["dx_only"]),
        compile_all_ms=round(anchors["all"], 4), compile_all_tbs=tbs(all_bytes, anchors["all"]),
        copy_ms=round(copy, 4), copy_tbs=tbs(all_bytes, copy),
        ratio_dx_vs_compile=round(anchors["dx_only"] / dx_ms, 3),
        ratio_all_vs_compile=round(anchors["all"] / total, 3),
        ratio_dx_vs_copy=round(copy * dx_bytes / all_bytes / dx_ms, 3),
        ratio_all_vs_copy=round(copy / total, 3),
        rel_err_vs_torch={k: round(v, 6) for k, v in errors.items()})


def main() -> None:
    only = set(sys.argv[1:])
    for example in EXAMPLES:
        if only and example not in only:
            continue
        t = time.time()
        try:
            case(example)
        except Exception as exc:  # noqa: BLE001 - one case failing must not hide the others
            row(case=example, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                trace=traceback.format_exc()[-1500:])
        print(f"  ({time.time() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
