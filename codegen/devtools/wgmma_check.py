"""GPU check of the wgmma contraction kernels (run on the device machine from the repo root):

    python3 -m codegen.devtools.wgmma_check [--quick] [--no-time]

Imports nothing from compiler/ (no pydantic there): plans are built directly (devtools/plans.gemm).
Cubins: taken from $WG_CUBINS/<kernel>-<sha>.cubin when prebuilt there (``--build DIR`` here,
on a machine with NVRTC), else compiled with codegen.nvrtc.compile_cubin (sm_90a).
Steps: correctness vs a torch float64 reference with NaN-poisoned outputs over sizes that are and
are not multiples of the tile (tails in M, N, K, rows not 16-byte aligned, K = 0, batch), fp16 and
bf16, B stored [K, N] and [N, K]; then timing vs torch.matmul (cuBLAS) at 4096^3 and 8192^3 with
triton.testing.do_bench (median), rotating over several input sets. Prints a table last.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from codegen.devtools.plans import gemm  # noqa: E402
from codegen.devtools.cubins import cubin_name, load_prebuilt  # noqa: E402
from codegen.plan import ContractionPlan  # noqa: E402
from codegen.render_wgmma import (encode_tensor_maps, launch_config_wgmma, render_wgmma,  # noqa: E402
                                  tma_supported)

OUT = Path(os.environ.get("OUT", "/tmp/derivc_out"))


def wg_plan(name: str, dtype: str = "f16", *, block=(128, 256, 64), warps=(8, 1), stages: int = 4,
            b_transposed: bool = False, batch: bool = False, out_dtype: str | None = None,
            guards=(True, True, True)) -> ContractionPlan:
    return gemm(name, dtype, out_dtype, batch=batch, block=block, warps=warps, stages=stages,
                mma="wgmma", b_transposed=b_transposed, guards=guards)


def variants() -> dict[str, ContractionPlan]:
    v = {}
    # correctness + timing (the schedule of examples/gemm_wgmma.yaml and neighbours)
    v["wg_f16_128x256_s4"] = wg_plan("wg_f16_128x256_s4")
    v["wg_bf16_128x256_s4"] = wg_plan("wg_bf16_128x256_s4", "bf16")
    v["wg_f16_128x256_s4_bt"] = wg_plan("wg_f16_128x256_s4_bt", b_transposed=True)
    v["wg_bf16_128x256_s4_bt"] = wg_plan("wg_bf16_128x256_s4_bt", "bf16", b_transposed=True)
    v["wg_f16_128x128_s4"] = wg_plan("wg_f16_128x128_s4", block=(128, 128, 64))
    v["wg_f16_256x128_s4"] = wg_plan("wg_f16_256x128_s4", block=(256, 128, 64))
    v["wg_f16_128x256_s3"] = wg_plan("wg_f16_128x256_s3", stages=3)
    # TMA + mbarrier, warp-specialized producer (names start with 'wt_')
    v["wt_f16_128x256_s4"] = wg_plan("wt_f16_128x256_s4")
    v["wt_bf16_128x256_s4"] = wg_plan("wt_bf16_128x256_s4", "bf16")
    v["wt_f16_128x256_s4_bt"] = wg_plan("wt_f16_128x256_s4_bt", b_transposed=True)
    v["wt_f16_128x128_s6"] = wg_plan("wt_f16_128x128_s6", block=(128, 128, 64), stages=6)
    v["wt_f16_256x128_s4"] = wg_plan("wt_f16_256x128_s4", block=(256, 128, 64))
    v["wt_bf16_batch_bt_s3"] = wg_plan("wt_bf16_batch_bt_s3", "bf16", block=(128, 128, 64), stages=3,
                                       batch=True, b_transposed=True)
    # correctness only
    v["wg_bf16_batch_bt_s2"] = wg_plan("wg_bf16_batch_bt_s2", "bf16", block=(64, 128, 64), warps=(4, 1),
                                       stages=2, batch=True, b_transposed=True)
    v["wg_f16_64x128_wn2_f32out"] = wg_plan("wg_f16_64x128_wn2_f32out", block=(64, 128, 128),
                                            warps=(4, 2), stages=3, out_dtype="f32")
    return v


TIMED = ("wg_f16_128x256_s4", "wg_bf16_128x256_s4", "wt_f16_128x256_s4", "wt_f16_128x256_s4_bt",
         "wt_f16_128x128_s6", "wt_f16_256x128_s4", "wt_bf16_128x256_s4")


BIG_CHECKED = ("wg_f16_128x256_s4", "wg_bf16_128x256_s4", "wt_f16_128x256_s4", "wt_bf16_128x256_s4",
               "wt_f16_128x256_s4_bt", "wt_f16_256x128_s4")


def is_tma(name: str) -> bool:
    return name.startswith("wt_")


def build(dirpath: Path) -> None:
    """Compile every variant here (NVRTC, sm_90a) into dirpath; print resources and SASS counts."""
    from codegen import sass
    from codegen.nvrtc import compile_cubin
    dirpath.mkdir(parents=True, exist_ok=True)
    for name, plan in variants().items():
        ks = render_wgmma(plan, tma=is_tma(name))
        r = compile_cubin(ks.source, ks.entry, tuple(ks.options) + ("-Xptxas=-v",))
        (dirpath / cubin_name(ks)).write_bytes(r.cubin)
        rep = sass.disassemble(r.cubin, ptxas_log=r.log)
        res = rep.resources.get(ks.entry)
        warn = "C7515" in r.log or "C7508" in r.log
        print(f"{name:28s} regs {res.registers if res else '?':>3} smem {ks.smem_bytes:6d} "
              f"HGMMA {rep.count('HGMMA'):2d} LDGSTS {rep.count('LDGSTS'):3d} "
              f"UTMALDG {rep.count('UTMALDG'):2d} LDL/STL {rep.local_memory_ops} serialize-warning {warn}")


class Kernels:
    def __init__(self):
        self.fns: dict[str, tuple] = {}
        self.info: dict[str, str] = {}

    def get(self, name: str, plan: ContractionPlan):
        if name in self.fns:
            return self.fns[name]
        ks = render_wgmma(plan, tma=is_tma(name))
        mod, fn, how = load_prebuilt(ks, Path(os.environ.get("WG_CUBINS", ROOT / ".wgcubins")))
        self.fns[name] = (mod, fn, ks)
        self.info[name] = f"{how}, regs {fn.num_regs}, smem {ks.smem_bytes}"
        return self.fns[name]

    def launcher(self, name: str, plan: ContractionPlan, sizes: dict[str, int]):
        import numpy as np
        import torch
        _, fn, ks = self.get(name, plan)
        tma = is_tma(name)
        grid, block, smem = launch_config_wgmma(plan, sizes, tma=tma)
        assert block[0] == ks.threads and smem == ks.smem_bytes
        dyn = tuple(np.int32(sizes[d]) for d in plan.dynamic)
        maps: dict[tuple[int, int], object] = {}

        def run(a, b, c):
            extra = ()
            if tma:
                key = (a.data_ptr(), b.data_ptr())
                if key not in maps:  # encoded once per input pair (host), kept on the device
                    raw = encode_tensor_maps(plan, sizes, *key)
                    maps[key] = torch.frombuffer(bytearray(raw), dtype=torch.uint8).cuda()
                extra = (np.uint64(maps[key].data_ptr()),)
            fn(grid, block, (np.uint64(a.data_ptr()), np.uint64(b.data_ptr()), np.uint64(c.data_ptr()))
               + dyn + extra, shared_mem=smem)
        return run


def _tdt(torch, dt: str):
    return {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dt]


def _wait_or_die(torch, what: str, limit_s: float = 20.0) -> None:
    """A pipeline bug (an mbarrier never completing) hangs the kernel: fail loudly instead."""
    ev = torch.cuda.Event()
    ev.record()
    t0 = time.time()
    while not ev.query():
        if time.time() - t0 > limit_s:
            print(f"HANG: {what} did not finish in {limit_s} s", flush=True)
            os._exit(3)
        time.sleep(0.001)
    torch.cuda.synchronize()


def correctness(K: Kernels, quick: bool) -> list[tuple]:
    import torch
    rows = []
    shapes = [(256, 512, 128), (384, 768, 320), (128 * 3 + 17, 256 * 2 + 40, 64 * 3 + 24),
              (100, 70, 37), (1, 1, 1), (200, 136, 64 + 8), (33, 40, 0), (1000, 1000, 1000),
              (4096, 4096, 4096)]
    if quick:
        shapes = shapes[:4]
    for name, plan in variants().items():
        for (m, n, k) in shapes:
            if m > 1000 and name not in BIG_CHECKED:
                continue
            bsz = 3 if plan.batch else 1
            sizes = {"M": m, "N": n, "K": k}
            if plan.batch:
                sizes["B"] = bsz
            dt = _tdt(torch, plan.a.dtype)
            lead = (bsz,) if plan.batch else ()
            a = torch.randn(lead + (m, k), device="cuda").to(dt)
            bshape = lead + ((n, k) if plan.b_transposed else (k, n))
            b = torch.randn(bshape, device="cuda").to(dt)
            c = torch.full(lead + (m, n), float("nan"), device="cuda", dtype=_tdt(torch, plan.c.dtype))
            if is_tma(name) and not tma_supported(plan, sizes, (a.data_ptr(), b.data_ptr())):
                continue  # the cp.async kernel serves unaligned sizes
            try:
                K.launcher(name, plan, sizes)(a, b, c)
                _wait_or_die(torch, f"{name} {(m, n, k)}")
            except Exception as exc:  # noqa: BLE001
                rows.append((name, (m, n, k), "LAUNCH-ERR", str(exc)[:80]))
                continue
            bb = b.double().transpose(-1, -2) if plan.b_transposed else b.double()
            ref = a.double() @ bb
            out = c.double()
            nan = int(torch.isnan(out).sum())
            den = float(ref.norm()) or 1.0
            err = float((out.nan_to_num(0.0) - ref).norm()) / den
            tol = 1e-2 if plan.c.dtype == "bf16" else 3e-3
            ok = nan == 0 and (err < tol or (k == 0 and float(out.abs().max()) == 0.0))
            rows.append((name, (m, n, k), "ok" if ok else "FAIL", f"rel {err:.2e} nan {nan}"))
    return rows


def timing(K: Kernels, sizes_list=(4096, 8192), nrot: int = 4) -> list[tuple]:
    import torch
    from triton.testing import do_bench
    out = []
    v = variants()
    for s in sizes_list:
        flops = 2.0 * s * s * s
        for dt in ("f16", "bf16"):
            tdt = _tdt(torch, dt)
            As = [torch.randn(s, s, device="cuda").to(tdt) for _ in range(nrot)]
            Bs = [torch.randn(s, s, device="cuda").to(tdt) for _ in range(nrot)]
            C = torch.empty(s, s, device="cuda", dtype=tdt)
            it = [0]

            def cublas():
                i = it[0] = (it[0] + 1) % nrot
                torch.matmul(As[i], Bs[i], out=C)
            t_ref = do_bench(cublas, warmup=100, rep=400, return_mode="median")
            out.append((s, dt, "torch.matmul (cuBLAS)", flops / t_ref / 1e9, 1.0, ""))
            for name in TIMED:
                plan = v[name]
                if plan.a.dtype != dt:
                    continue
                run = K.launcher(name, plan, {"M": s, "N": s, "K": s})

                def ours(run=run, bt=plan.b_transposed):
                    i = it[0] = (it[0] + 1) % nrot
                    run(As[i], Bs[i], C)  # [N, K] view of the same bytes when bt: same work
                t = do_bench(ours, warmup=100, rep=400, return_mode="median")
                out.append((s, dt, name, flops / t / 1e9, t_ref / t, K.info.get(name, "")))
            # second cuBLAS timing: spread between two measurements of the same thing
            t_ref2 = do_bench(cublas, warmup=50, rep=300, return_mode="median")
            out.append((s, dt, "torch.matmul again", flops / t_ref2 / 1e9, t_ref / t_ref2, ""))
            As.clear()
            Bs.clear()
            torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, help="compile cubins into DIR (no GPU) and exit")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-time", action="store_true")
    args = ap.parse_args()
    if args.build:
        build(args.build)
        return 0
    import torch
    OUT.mkdir(parents=True, exist_ok=True)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    K = Kernels()
    t0 = time.time()
    rows = correctness(K, args.quick)
    bad = [r for r in rows if r[2] != "ok"]
    lines = [f"{r[0]:28s} {str(r[1]):20s} {r[2]:10s} {r[3]}" for r in rows]
    (OUT / "wgmma_correctness.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-8:] + [ln for ln, r in zip(lines, rows) if r[2] != "ok"][:30]), flush=True)
    print(f"correctness: {len(rows) - len(bad)}/{len(rows)} ok ({time.time() - t0:.1f} s)", flush=True)
    for n, i in K.info.items():
        print(f"  {n}: {i}")
    if not args.no_time:
        t1 = time.time()
        tab = timing(K)
        hdr = f"{'size':>5} {'dt':4} {'kernel':28} {'TFLOP/s':>8} {'vs cuBLAS':>9}"
        body = [f"{s:5d} {dt:4} {n:28} {tf:8.1f} {r:9.3f}" for s, dt, n, tf, r, _ in tab]
        (OUT / "wgmma_timing.txt").write_text("\n".join([hdr] + body) + "\n")
        print(f"timing ({time.time() - t1:.1f} s)\n" + "\n".join([hdr] + body))
    print(f"SUMMARY correctness {len(rows) - len(bad)}/{len(rows)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
