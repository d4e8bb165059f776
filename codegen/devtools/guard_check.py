"""Guarded kernels on the GPU: interior tiles run the unguarded code, boundary tiles the guarded one.

    python -m codegen.devtools.guard_check            # correctness sweep (~20 s)
    python -m codegen.devtools.guard_check --ab DIR   # + same-process timing: the templates in
                                                      #   DIR/templates (an older copy) vs these
    --plans FILE: derived plans as JSON (written here, read on the device: no derivation there)

The sweep picks sizes so that every path of the split runs: blocks that are interior in m / n
with many full k-tiles and a k tail (the unguarded main loop, then the guarded one), blocks that
are all full (unguarded loop only), boundary blocks, rows that are not 16 bytes (scalar path), and
for attention full key tiles followed by a partial one, partial query blocks, Nq != Nk, causal.
The timing part renders the derived plans (examples/*.yaml, guards as the lowering sets them) with
both template sets and with the guard flags off (the old 'unguarded' numbers), in one process.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

GEMM_SIZES = {  # plan name or example -> (batch or None, M, N, K)
    "gemm.yaml": [(None, 300, 520, 200), (None, 256, 512, 512), (None, 384, 768, 1000),
                  (None, 257, 513, 999), (None, 1000, 300, 64)],
    "gemm_bf16.yaml": [(None, 260, 600, 328)],
    "g_f16_guard": [(None, 512, 384, 1000), (None, 300, 200, 200)],
    "g_bf16_guard_bt": [(None, 300, 260, 512)],
    "g_bf16_64x64_s2_batch": [(3, 200, 130, 136)],
    "g_f16_noswz_s1": [(None, 200, 300, 200)],
    "g_f16_mixed": [(None, 300, 200, 136)],
    "g_f32_simt": [(None, 200, 150, 200)],
    "g_f32_simt_128": [(2, 300, 260, 100)],
}
ATTN_SIZES = {  # -> (B, H, Nq, Nk)
    "flash_attention.yaml": [(1, 2, 1000, 1000), (1, 2, 512, 512)],
    "flash_attention_noncausal.yaml": [(1, 2, 1000, 1000), (1, 2, 700, 700)],  # q, k share N
    "flash_attention_d64.yaml": [(1, 2, 777, 777)],
    "flash_attention_d64_noncausal.yaml": [(1, 2, 640, 640)],
    "a_bf16_d64_guard_c": [(1, 2, 700, 700), (1, 2, 300, 650)],
    "a_bf16_d128_guard_c": [(1, 2, 1000, 1000)],
    "a_f16_d128_qs_psmem": [(1, 2, 333, 333)],
    "a_f16_d128_s1": [(1, 2, 500, 500)],
}
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}
_TD = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}


_PLANS: dict = {}
_KERNELS: dict = {}


def plan_of(name: str):
    """Hand-built plan (codegen/devtools/plans.py) or the plan derived from an example schedule
    (cached; --plans FILE keeps derived plans as JSON so a device run need not derive them)."""
    if name not in _PLANS:
        if name.endswith(".yaml"):
            from codegen.devtools.sass_loops import plan_of as derive_plan

            _PLANS[name] = derive_plan(ROOT / "examples" / name)
        else:
            from codegen.devtools import plans

            _PLANS[name] = plans.variants()[name]
    return _PLANS[name]


def kernel(name: str, plan):
    from codegen.runtime import CompiledKernel

    if name not in _KERNELS:
        _KERNELS[name] = CompiledKernel(plan)
    return _KERNELS[name]


def load_plans(path: Path) -> None:
    import json

    from codegen.build import plan_from_json, plan_json

    if path.exists():
        _PLANS.update({k: plan_from_json(v) for k, v in json.loads(path.read_text()).items()})
        return
    names = [n for n in list(GEMM_SIZES) + list(ATTN_SIZES) if n.endswith(".yaml")] + [
        "flash_attention_d64_noncausal.yaml"]
    path.write_text(json.dumps({n: plan_json(plan_of(n)) for n in dict.fromkeys(names)}, indent=1))


def _rand(shape, dtype):
    import torch

    return torch.randn(shape, device="cuda", dtype=torch.float32).to(getattr(torch, _TD[dtype]))


def _err(out, ref) -> float:
    import torch

    o = out.double()
    if bool(torch.isnan(o).any()):
        return float("nan")
    den = float(ref.norm())
    return float((o - ref).norm()) / (den if den > 0 else 1.0)


def check_gemm(name: str, plan, shape) -> float:
    import torch

    bsz, m, n, k = shape
    pre = (bsz,) if bsz else ()
    a = _rand(pre + (m, k), plan.a.dtype)
    b = _rand(pre + ((n, k) if plan.b_transposed else (k, n)), plan.b.dtype)
    out = torch.full(pre + (m, n), float("nan"), device="cuda", dtype=getattr(torch, _TD[plan.c.dtype]))
    kernel(name, plan)(a, b, out=out)
    bb = b.double().transpose(-1, -2) if plan.b_transposed else b.double()
    return _err(out, a.double() @ bb)


def check_attention(name: str, plan, shape) -> float:
    import torch

    bsz, h, nq, nk = shape
    if plan.seq_q == plan.seq_k and nq != nk:
        raise ValueError(f"{name}: q and k share the length {plan.seq_q}, got {nq} != {nk}")
    d = plan.head_dim
    q, k, v = _rand((bsz, h, nq, d), plan.q.dtype), _rand((bsz, h, nk, d), plan.q.dtype), _rand((bsz, h, nk, d), plan.q.dtype)
    out = torch.full((bsz, h, nq, d), float("nan"), device="cuda", dtype=q.dtype)
    kernel(name, plan)(q, k, v, out=out)
    s = (q.double() @ k.double().transpose(-1, -2)) * plan.scale
    if plan.causal:
        i = torch.arange(nq, device="cuda")[:, None]
        j = torch.arange(nk, device="cuda")[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return _err(out, p @ v.double())


def correctness() -> int:
    bad = 0
    for table, fn in ((GEMM_SIZES, check_gemm), (ATTN_SIZES, check_attention)):
        for name, shapes in table.items():
            plan = plan_of(name)
            dt = plan.a.dtype if fn is check_gemm else plan.q.dtype
            for shape in shapes:
                err = fn(name, plan, shape)
                ok = err <= TOL[dt]
                bad += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name:36s} {str(shape):26s} rel err {err:.2e}", flush=True)
    print(f"guard_check: {bad} failures")
    return bad


# ------------------------------------------------------------------ same-process A/B timing
def _source(plan, tdir: Path | None):
    """KernelSource of plan rendered with the templates in tdir (None: the current ones)."""
    import re

    import jinja2

    from codegen import render as R
    from codegen.plan import ContractionPlan

    if tdir is None:
        return R.render(plan)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(tdir)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    if isinstance(plan, ContractionPlan):
        ctx, tmpl = R._contraction_ctx(plan), "contraction.cu.j2"
    else:
        ctx, tmpl = R._attention_ctx(plan), "online_fold.cu.j2"
    src = re.sub(r"\n[ \t]*\n(?:[ \t]*\n)+", "\n\n", env.get_template(tmpl).render(**ctx))
    return R.KernelSource(source=src, entry=ctx["kname"], arg_names=ctx["_arg_names"], threads=ctx["threads"],
                          smem_bytes=ctx["smem_bytes"], options=R.DEFAULT_OPTIONS)


def unguarded(plan):
    from codegen.devtools.sass_loops import unguarded as ug

    return ug(plan)


def ab(old: Path) -> None:
    import torch

    from codegen.bench import _sets, _timer
    from codegen.runtime import CompiledKernel

    cases = [("gemm.yaml", (8192,)), ("flash_attention_noncausal.yaml", (4, 16, 4096, 128)),
             ("flash_attention.yaml", (4, 16, 4096, 128)), ("flash_attention_d64_noncausal.yaml", (4, 32, 4096, 64))]
    print(f"{'case':40s} {'old guarded':>12s} {'new guarded':>12s} {'no guards':>10s}  TFLOP/s")
    for yaml_name, shape in cases:
        plan = plan_of(yaml_name)
        kerns = [CompiledKernel(plan, source=_source(plan, old / "templates")), kernel(yaml_name, plan),
                 CompiledKernel(unguarded(plan))]
        if len(shape) == 1:
            n = shape[0]
            sets = _sets(3 * n * n * 2)
            xs = [(_rand((n, n), "f16"), _rand((n, n), "f16"), torch.empty(n, n, device="cuda", dtype=torch.float16))
                  for _ in range(sets)]
            flops, label = 2.0 * n ** 3, f"{yaml_name} {n}^3"
        else:
            b, h, s, d = shape
            sets = _sets(4 * b * h * s * d * 2)
            xs = [tuple(_rand((b, h, s, d), "f16") for _ in range(4)) for _ in range(sets)]
            flops = 4.0 * b * h * s * s * d / (2 if plan.causal else 1)
            label = f"{yaml_name} b{b} h{h} s{s}"
        tf = []
        for kern in kerns:
            t = _timer([lambda x=x: kern(*x[:-1], out=x[-1]) for x in xs])
            tf.append(flops / t / 1e9)
        print(f"{label:40s} {tf[0]:12.1f} {tf[1]:12.1f} {tf[2]:10.1f}", flush=True)
        del xs, kerns


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ab", type=Path, help="directory holding an older templates/ for A/B timing")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--plans", type=Path, help="JSON of the derived plans: read if it exists, else written")
    a = ap.parse_args(argv)
    if a.plans:
        load_plans(a.plans)
    if a.ab:  # timing first: the sweep is the part a tight time limit may cut
        ab(a.ab)
    bad = 0 if a.no_check else correctness()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
