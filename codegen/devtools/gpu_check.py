"""One-call GPU check (run on the device machine from the repo root):

    python3 -m codegen.devtools.gpu_check            # everything
    python3 -m codegen.devtools.gpu_check --small    # one small launch of each kernel (sanitizers)

Steps: compile every plan variant (nvcc -cubin sm_90a, ptxas -v: registers / spills; cuobjdump
SASS counts: HMMA, LDGSTS, LDSM, local memory), pytest tests/gpu, compute-sanitizer memcheck and
racecheck on --small, timings vs torch.matmul / SDPA with triton.testing.do_bench. Prints a
compact table last; logs under $OUT when set.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from codegen.devtools import plans  # noqa: E402
from codegen.plan import ContractionPlan  # noqa: E402
from codegen.render import render  # noqa: E402
from codegen.devtools.nvcc import compile_nvcc  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/derivc_out"))
OUT.mkdir(parents=True, exist_ok=True)
SASS_KEYS = ("HMMA", "LDGSTS", "LDSM", "LDL", "STL")


def log(msg: str) -> None:
    print(msg, flush=True)
    with open(OUT / "gpu_check.log", "a") as f:
        f.write(msg + "\n")


def cuobjdump() -> str | None:
    for c in (shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if c and os.path.exists(c):
            return c
    try:
        import nvidia.cu13  # type: ignore
        p = Path(list(nvidia.cu13.__path__)[0]) / "bin" / "cuobjdump"
        return str(p) if p.exists() else None
    except Exception:
        return None


def compile_all() -> dict[str, dict]:
    res: dict[str, dict] = {}
    cod = cuobjdump()

    def one(item):
        name, plan = item
        ks = render(plan)
        t0 = time.time()
        r = compile_nvcc(ks.source, ks.options, name)
        info = dict(regs=int((re.findall(r"Used (\d+) registers", r.log) or [-1])[0]),
                    spill=sum(int(x) for x in re.findall(r"(\d+) bytes spill", r.log)),
                    stack=int((re.findall(r"(\d+) bytes stack frame", r.log) or [0])[0]),
                    smem=ks.smem_bytes, secs=round(time.time() - t0, 1), tc=plan.mma is not None)
        if cod:
            path = Path("/tmp") / f"{name}.cubin"
            path.write_bytes(r.cubin)
            sass = subprocess.run([cod, "-sass", str(path)], capture_output=True, text=True).stdout
            for k in SASS_KEYS:
                info[k] = len(re.findall(r"\b" + k + r"\b", sass))
        return name, info

    items = list(plans.variants().items())
    with ThreadPoolExecutor(min(16, os.cpu_count() or 4)) as ex:
        for name, info in ex.map(one, items):
            res[name] = info
    return res


# ------------------------------------------------------------------ small launches (sanitizers)
def _small_sizes(plan) -> dict[str, int]:
    if isinstance(plan, ContractionPlan):
        s = {"M": plan.block_m + (3 if plan.guard_m else 0), "N": plan.block_n + (6 if plan.guard_n else 0),
             "K": plan.block_k * 3 + (8 if plan.guard_k else 0), "B": 2}
    else:
        s = {"B": 1, "H": 2, "N": plan.block_m + (5 if plan.guard_q else 0),
             "Nk": 2 * plan.block_n + (7 if plan.guard_kv else 0), "D": plan.head_dim}
    return s


def small_all() -> int:
    import cupy
    import numpy as np
    from codegen.launch import launch_config
    from codegen.plan import inputs, output
    from codegen.runtime import CompiledKernel

    bad = 0
    for name, plan in plans.variants().items():
        kern = CompiledKernel(plan)
        sizes = _small_sizes(plan)
        bufs = []
        for op in inputs(plan) + (output(plan),):
            shape = tuple(sizes[d] for d in op.dims)
            x = cupy.random.standard_normal(shape, dtype=cupy.float32)
            if op.dtype == "f16":
                x = x.astype(cupy.float16)
            elif op.dtype == "bf16":
                x = (x.view(cupy.uint32) >> 16).astype(cupy.uint16)
            bufs.append(x)
        grid, block, smem = launch_config(plan, sizes)
        args = tuple(bufs) + tuple(np.int32(sizes[d]) for d in plan.dynamic)
        kern.fn(grid, block, args, shared_mem=smem)
        cupy.cuda.runtime.deviceSynchronize()
        o = bufs[-1].astype(cupy.float32) if plan_dtype(plan) != "bf16" else None
        ok = o is None or not bool(cupy.isnan(o).any())
        bad += not ok
        print(f"small {name}: grid {grid} ok={ok}", flush=True)
    return bad


def plan_dtype(plan) -> str:
    return plan.a.dtype if isinstance(plan, ContractionPlan) else plan.q.dtype


def sanitize() -> dict[str, str]:
    res = {}
    cands = [shutil.which("compute-sanitizer"), "/usr/local/cuda/bin/compute-sanitizer",
             "/usr/local/cuda/compute-sanitizer/compute-sanitizer"]
    cs = next((c for c in cands if c and os.path.exists(c)), None)
    if cs is None:
        return {"memcheck": "no compute-sanitizer", "racecheck": "no compute-sanitizer"}
    for tool in ("memcheck", "racecheck"):
        cmd = [cs, "--tool", tool, "--error-exitcode", "3", sys.executable, "-m",
               "codegen.devtools.gpu_check", "--small"]
        t0 = time.time()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT)
            (OUT / f"{tool}.log").write_text(r.stdout + r.stderr)
            summ = re.findall(r"ERROR SUMMARY: .*|RACECHECK SUMMARY: .*", r.stdout + r.stderr)
            res[tool] = f"rc={r.returncode} {'; '.join(summ[-2:])} ({time.time() - t0:.0f}s)"
        except subprocess.TimeoutExpired:
            res[tool] = "timeout"
    return res


def run_pytest() -> str:
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "--tb=short", "--confcutdir=tests/gpu",
                            "-p", "no:cacheprovider", "tests/gpu"],
                           capture_output=True, text=True, cwd=ROOT, timeout=240)
    except subprocess.TimeoutExpired as e:
        (OUT / "pytest.log").write_text(str(e.stdout or "") + str(e.stderr or ""))
        return "pytest TIMEOUT"
    (OUT / "pytest.log").write_text(r.stdout + r.stderr)
    tail = (r.stdout + r.stderr).strip().splitlines()
    fails = [l for l in tail if l.startswith("FAILED") or "Error" in l][:15]
    return "\n".join(fails + tail[-1:])


# ------------------------------------------------------------------ timings
GEMM_BENCH = ["g_f16_128x128x32_w4_s3", "g_f16_128x128x32_w4_s4", "g_f16_128x128x64_w4_s3",
              "g_f16_128x128x64_w4_s2", "g_f16_128x128x32_s3", "g_f16_128x128x64_s3",
              "g_f16_128x256x32_s3", "g_f16_128x256x64_s3", "g_f16_256x128x32_s3"]
ATTN_BENCH = [
    (128, ["a_f16_d128_nc", "a_f16_d128_nc_s3", "a_f16_d128_nc_qs"], ((8, 4096),)),
    (128, ["a_f16_d128_nc", "a_f16_d128_c", "a_f16_d128_c_w4"], ((32, 1024), (8, 4096), (2, 16384))),
    (64, ["a_f16_d64_nc", "a_f16_d64_w4"], ((8, 4096), (32, 1024))),
]
def bench() -> list[tuple[str, float, float, float]]:
    import torch
    from triton.testing import do_bench
    from codegen.runtime import CompiledKernel

    rows = []
    v = plans.variants()

    def tflops(flop, ms):
        return flop / (ms * 1e-3) / 1e12

    for n in (8192, 4096):
        a = torch.randn(n, n, device="cuda", dtype=torch.float16)
        b = torch.randn(n, n, device="cuda", dtype=torch.float16)
        c = torch.empty(n, n, device="cuda", dtype=torch.float16)
        ref_ms = do_bench(lambda: torch.matmul(a, b), warmup=50, rep=200, return_mode="median")
        names = GEMM_BENCH if n == 8192 else [max(rows, key=lambda r: r[1])[0].split()[0]]
        for name in names:
            k = CompiledKernel(v[name])
            k(a, b, out=c)
            err = float((c.float() - (a.float() @ b.float())).norm() / (a.float() @ b.float()).norm())
            ms = do_bench(lambda: k(a, b, out=c), warmup=50, rep=200, return_mode="median")
            rows.append((f"{name} {n}^3 (err {err:.1e})", tflops(2 * n**3, ms), tflops(2 * n**3, ref_ms),
                         ms))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for d, names, shapes in ATTN_BENCH:
        for bsz, s in shapes:
            h = 16
            q, k_, vv = (torch.randn(bsz, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
            o = torch.empty_like(q)
            for name in names:
                p = v[name]
                kern = CompiledKernel(p)
                flop = 4 * bsz * h * s * s * d / (2 if p.causal else 1)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    ref_ms = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                        q, k_, vv, is_causal=p.causal), warmup=25, rep=100, return_mode="median")
                    ref = torch.nn.functional.scaled_dot_product_attention(q, k_, vv, is_causal=p.causal)
                kern(q, k_, vv, out=o)
                err = float((o.float() - ref.float()).norm() / ref.float().norm())
                ms = do_bench(lambda: kern(q, k_, vv, out=o), warmup=25, rep=100, return_mode="median")
                rows.append((f"{name} b{bsz} s{s} (vsFA2 {err:.1e})", tflops(flop, ms), tflops(flop, ref_ms), ms))
    return rows


def main() -> int:
    if "--small" in sys.argv:
        return 1 if small_all() else 0
    t0 = time.time()
    steps = sys.argv[1:] or ["compile", "pytest", "bench", "sanitize"]
    comp, pyt, san, rows = {}, "", {}, []
    if "compile" in steps:
        comp = compile_all()
        log(f"compiled {len(comp)} variants in {time.time() - t0:.0f}s")
    if "pytest" in steps:
        pyt = run_pytest()
        log(f"pytest ({time.time() - t0:.0f}s): {pyt}")
    if "bench" in steps:
        try:
            rows = bench()
        except Exception:  # keep the rest of the report
            import traceback
            log("bench failed: " + traceback.format_exc()[-1500:])
    if "sanitize" in steps:
        san = sanitize()
        log(f"sanitizers ({time.time() - t0:.0f}s): {san}")
    log("\n=== compile (regs / spill bytes / stack / smem / SASS counts) ===")
    for n, i in comp.items():
        flag = " <-- SPILL" if i["tc"] and (i["spill"] or i.get("LDL", 0)) else ""
        sass = " ".join(f"{k}={i.get(k, '?')}" for k in SASS_KEYS)
        log(f"{n:24s} regs={i['regs']:3d} spill={i['spill']:4d} stack={i['stack']:4d} "
            f"smem={i['smem']:6d} {sass}{flag}")
    log("\n=== pytest ===\n" + pyt)
    log("=== sanitizers ===\n" + "\n".join(f"{k}: {s}" for k, s in san.items()))
    log("=== timings (median, TFLOP/s; anchor = torch.matmul / SDPA FLASH, same process) ===")
    log(f"{'case':48s} {'ours':>7s} {'anchor':>7s} {'ratio':>6s} {'ms':>8s}")
    for name, ours, ref, ms in rows:
        log(f"{name:48s} {ours:7.1f} {ref:7.1f} {ours / ref:6.2f} {ms:8.3f}")
    log(f"total {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
