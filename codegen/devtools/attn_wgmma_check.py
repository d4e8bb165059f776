"""GPU check of the Hopper (wgmma + TMA) attention kernels (run on the device machine from the repo root):

    python3 -m codegen.devtools.attn_wgmma_check [--quick] [--no-time]
    python3 -m codegen.devtools.attn_wgmma_check --build DIR     # here: compile cubins, print resources

Imports nothing from compiler/ (no pydantic there): plans are built directly (devtools/plans.attention).
Cubins: taken from $AW_CUBINS (default .attncubins/) <kernel>-<sha>.cubin when prebuilt, else compiled
with codegen.nvrtc.compile_cubin (sm_90a).
Steps: correctness vs an fp32 torch reference (mask j <= i, a row without keys gives 0) with
NaN-poisoned outputs, d 64 / 128, f16 / bf16, causal and not, sequence lengths that are and are
not multiples of the tiles, Nq != Nk, Nk = 0; every launch is polled with a deadline (a broken
mbarrier pipeline hangs: os._exit). Then timing vs torch SDPA (FLASH = FlashAttention-2, CUDNN)
with triton.testing.do_bench medians over rotating inputs; a compact table is printed last.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from codegen.devtools.plans import attention  # noqa: E402
from codegen.devtools.cubins import cubin_name, load_prebuilt  # noqa: E402
from codegen.plan import AttentionPlan  # noqa: E402
from codegen.render_attn_wgmma import (encode_attn_tensor_maps, launch_config_attn_wgmma,  # noqa: E402
                                       render_attn_wgmma)

OUT = Path(os.environ.get("OUT", "/tmp/derivc_out"))


def aw_plan(name: str, dtype: str = "f16", d: int = 128, *, causal: bool = False, block=(128, 128),
            stages: int = 2, guards=(True, True)) -> AttentionPlan:
    return attention(name, dtype, d=d, causal=causal, block=block, warps=block[0] // 16, stages=stages,
                     mma="wgmma", q_level="shared", guards=guards)


def variants() -> dict[str, tuple[AttentionPlan, bool]]:
    """name -> (plan, overlap)."""
    v: dict[str, tuple[AttentionPlan, bool]] = {}
    for dt in ("f16", "bf16"):
        for c in (False, True):
            n = f"aw_{dt}_d128_{'c' if c else 'nc'}"
            v[n] = (aw_plan(n, dt, 128, causal=c), True)
            n = f"aw_{dt}_d64_{'c' if c else 'nc'}"
            v[n] = (aw_plan(n, dt, 64, causal=c, stages=3), True)
    for c in (False, True):
        n = f"awno_f16_d128_{'c' if c else 'nc'}"           # no intra-warpgroup overlap
        v[n] = (aw_plan(n, "f16", 128, causal=c), False)
        n = f"aw3_f16_d64_{'c' if c else 'nc'}"             # 3 consumer warpgroups (192 rows)
        v[n] = (aw_plan(n, "f16", 64, causal=c, block=(192, 128)), True)
        n = f"aw_f16_d128_s3_{'c' if c else 'nc'}"          # 3 stages (224 KB of tiles)
        v[n] = (aw_plan(n, "f16", 128, causal=c, stages=3), True)
        n = f"aw_f16_d128_bn64_{'c' if c else 'nc'}"        # block_n 64, 3 stages
        v[n] = (aw_plan(n, "f16", 128, causal=c, block=(128, 64), stages=3), True)
    return v


def build(dirpath: Path) -> int:
    """Compile every variant here (NVRTC, sm_90a) into dirpath; print resources and SASS counts."""
    from codegen import sass
    from codegen.nvrtc import compile_cubin
    dirpath.mkdir(parents=True, exist_ok=True)
    bad = 0
    for name, (plan, ov) in variants().items():
        ks = render_attn_wgmma(plan, overlap=ov)
        r = compile_cubin(ks.source, ks.entry, tuple(ks.options) + ("-Xptxas=-v",))
        (dirpath / cubin_name(ks)).write_bytes(r.cubin)
        rep = sass.disassemble(r.cubin, ptxas_log=r.log)
        res = rep.resources.get(ks.entry)
        warn = [w for w in ("C7513", "C7515", "C7508", "C7510") if w in r.log]
        ok = rep.local_memory_ops == 0 and rep.count("HGMMA") > 0 and not warn
        bad += not ok
        print(f"{name:24s} regs {res.registers if res else '?':>3} smem {ks.smem_bytes:6d} threads {ks.threads} "
              f"HGMMA {rep.count('HGMMA'):2d} UTMALDG {rep.count('UTMALDG'):2d} LDL/STL {rep.local_memory_ops} "
              f"warnings {warn or '-'}{'' if ok else '  <-- BAD'}")
    return bad


class Kernels:
    def __init__(self):
        self.fns: dict[str, tuple] = {}
        self.info: dict[str, str] = {}

    def get(self, name: str, plan: AttentionPlan, overlap: bool):
        if name in self.fns:
            return self.fns[name]
        ks = render_attn_wgmma(plan, overlap=overlap)
        mod, fn, how = load_prebuilt(ks, Path(os.environ.get("AW_CUBINS", ROOT / ".attncubins")))
        self.fns[name] = (mod, fn, ks)
        self.info[name] = f"{how}, regs {fn.num_regs}, smem {ks.smem_bytes}, threads {ks.threads}"
        return self.fns[name]

    def launcher(self, name: str, plan: AttentionPlan, overlap: bool, sizes: dict[str, int]):
        import numpy as np
        import torch
        _, fn, ks = self.get(name, plan, overlap)
        grid, block, smem = launch_config_attn_wgmma(plan, sizes)
        assert block[0] == ks.threads and smem == ks.smem_bytes
        dyn = tuple(np.int32(sizes[d]) for d in plan.dynamic)
        maps: dict[tuple[int, int, int], object] = {}

        def run(q, k, v, o):
            key = (q.data_ptr(), k.data_ptr(), v.data_ptr())
            if key not in maps:  # encoded once per input triple (host), kept on the device
                raw = encode_attn_tensor_maps(plan, sizes, *key)
                maps[key] = torch.frombuffer(bytearray(raw), dtype=torch.uint8).cuda()
            fn(grid, block, (np.uint64(q.data_ptr()), np.uint64(k.data_ptr()), np.uint64(v.data_ptr()),
                             np.uint64(o.data_ptr())) + dyn + (np.uint64(maps[key].data_ptr()),),
               shared_mem=smem)
        return run


def _tdt(torch, dt: str):
    return {"f16": torch.float16, "bf16": torch.bfloat16}[dt]


def _wait_or_die(torch, what: str, limit_s: float = 20.0) -> None:
    """A pipeline bug (an mbarrier never completing) hangs the kernel: fail loudly instead."""
    ev = torch.cuda.Event()
    ev.record()
    t0 = time.time()
    while not ev.query():
        if time.time() - t0 > limit_s:
            print(f"HANG: {what} did not finish in {limit_s} s", flush=True)
            os._exit(3)
        time.sleep(0.0005)
    torch.cuda.synchronize()


def reference(torch, q, k, v, scale: float, causal: bool):
    """fp32 reference; mask j <= i (top-left); a row that sees no key gives 0."""
    qf, kf, vf = q.float(), k.float(), v.float()
    nq, nk = q.shape[-2], k.shape[-2]
    if nk == 0:
        return torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    s = (qf @ kf.transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p @ vf


SHAPES = [  # (B, H, N, Nk)
    (2, 3, 256, 256), (1, 2, 200, 200), (1, 1, 1, 1), (2, 2, 130, 130), (1, 2, 300, 170),
    (1, 2, 64, 300), (1, 1, 100, 0), (1, 2, 1000, 1000), (1, 4, 2048, 2048), (3, 2, 577, 577),
]


def correctness(K: Kernels, quick: bool) -> list[tuple]:
    import torch
    rows = []
    shapes = SHAPES[:5] if quick else SHAPES
    torch.manual_seed(0)
    for name, (plan, ov) in variants().items():
        d = plan.head_dim
        for (b, h, n, nk) in shapes:
            sizes = {"B": b, "H": h, "N": n, "Nk": nk, "D": d}
            dt = _tdt(torch, plan.q.dtype)
            q = torch.randn(b, h, n, d, device="cuda").to(dt)
            k = torch.randn(b, h, max(nk, 0), d, device="cuda").to(dt)
            v = torch.randn(b, h, max(nk, 0), d, device="cuda").to(dt)
            if nk == 0:  # an empty tensor may have no storage: give K / V a real base
                k = torch.empty(b, h, 0, d, device="cuda", dtype=dt)
                v = torch.empty(b, h, 0, d, device="cuda", dtype=dt)
            o = torch.full((b, h, n, d), float("nan"), device="cuda", dtype=dt)
            try:
                K.launcher(name, plan, ov, sizes)(q, k, v, o)
                _wait_or_die(torch, f"{name} {(b, h, n, nk)}")
            except Exception as exc:  # noqa: BLE001
                rows.append((name, (b, h, n, nk), "LAUNCH-ERR", str(exc)[:100]))
                print(rows[-1], flush=True)
                continue
            ref = reference(torch, q, k, v, plan.scale, plan.causal)
            out = o.float()
            nan = int(torch.isnan(out).sum())
            den = float(ref.norm()) or 1.0
            diff = out.nan_to_num(0.0) - ref
            err = float(diff.norm()) / den
            mx = float(diff.abs().max())
            tol = 1.6e-2 if plan.q.dtype == "bf16" else 4e-3
            ok = nan == 0 and (err < tol or (den == 1.0 and mx == 0.0))
            rows.append((name, (b, h, n, nk), "ok" if ok else "FAIL", f"rel {err:.2e} maxabs {mx:.2e} nan {nan}"))
            if not ok:
                print(rows[-1], flush=True)
    return rows


TIMED_CASES = [  # (label, B, H, N, D, causal)
    ("d128 b4h16 s4k full", 4, 16, 4096, 128, False),
    ("d128 b4h16 s4k causal", 4, 16, 4096, 128, True),
    ("d128 b1h16 s16k full", 1, 16, 16384, 128, False),
    ("d128 b1h16 s16k causal", 1, 16, 16384, 128, True),
    ("d64 b4h32 s4k full", 4, 32, 4096, 64, False),
    ("d64 b4h32 s4k causal", 4, 32, 4096, 64, True),
]


def timing(K: Kernels, nrot: int = 3) -> list[tuple]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench
    v_all = variants()
    out = []
    for label, b, h, n, d, causal in TIMED_CASES:
        flops = 4.0 * b * h * n * n * d / (2 if causal else 1)
        Qs = [torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(nrot)]
        Ks = [torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(nrot)]
        Vs = [torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(nrot)]
        O = torch.empty(b, h, n, d, device="cuda", dtype=torch.float16)
        it = [0]
        base = {}
        for bname, be in (("FA2 (SDPA FLASH)", SDPBackend.FLASH_ATTENTION), ("cuDNN (SDPA CUDNN)", SDPBackend.CUDNN_ATTENTION)):
            def sdpa(be=be):
                i = it[0] = (it[0] + 1) % nrot
                with sdpa_kernel([be]):
                    F.scaled_dot_product_attention(Qs[i], Ks[i], Vs[i], is_causal=causal)
            try:
                t = do_bench(sdpa, warmup=50, rep=250, return_mode="median")
                base[bname] = t
                out.append((label, bname, flops / t / 1e9, None, None))
            except Exception as exc:  # noqa: BLE001
                out.append((label, bname + " ERR " + str(exc)[:40], 0.0, None, None))
        sizes = {"B": b, "H": h, "N": n, "Nk": n, "D": d}
        for name, (plan, ov) in v_all.items():
            if plan.q.dtype != "f16" or plan.head_dim != d or plan.causal != causal:
                continue
            run = K.launcher(name, plan, ov, sizes)
            run(Qs[0], Ks[0], Vs[0], O)
            _wait_or_die(torch, f"timing {name} {label}")

            def ours(run=run):
                i = it[0] = (it[0] + 1) % nrot
                run(Qs[i], Ks[i], Vs[i], O)
            t = do_bench(ours, warmup=50, rep=250, return_mode="median")
            fa2, cud = base.get("FA2 (SDPA FLASH)"), base.get("cuDNN (SDPA CUDNN)")
            out.append((label, name, flops / t / 1e9, (fa2 / t) if fa2 else None, (cud / t) if cud else None))
        Qs.clear(); Ks.clear(); Vs.clear()  # noqa: E702
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, help="compile cubins into DIR (no GPU) and exit")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-time", action="store_true")
    args = ap.parse_args()
    if args.build:
        return 1 if build(args.build) else 0
    import torch
    OUT.mkdir(parents=True, exist_ok=True)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    K = Kernels()
    t0 = time.time()
    rows = correctness(K, args.quick)
    bad = [r for r in rows if r[2] != "ok"]
    lines = [f"{r[0]:24s} {str(r[1]):22s} {r[2]:10s} {r[3]}" for r in rows]
    (OUT / "attn_wgmma_correctness.txt").write_text("\n".join(lines) + "\n")
    per = {}
    for r in rows:
        per.setdefault(r[0], [0, 0])
        per[r[0]][0] += r[2] == "ok"
        per[r[0]][1] += 1
    worst = {}
    for r in rows:
        if r[2] == "ok":
            worst[r[0]] = max(worst.get(r[0], 0.0), float(r[3].split()[1]))
    for n, (a, t) in per.items():
        print(f"  {n:24s} {a}/{t} ok  worst rel {worst.get(n, float('nan')):.2e}  [{K.info.get(n, '')}]")
    print(f"correctness: {len(rows) - len(bad)}/{len(rows)} ok ({time.time() - t0:.1f} s)", flush=True)
    if not args.no_time:
        t1 = time.time()
        tab = timing(K)
        hdr = f"{'case':24} {'kernel':22} {'TFLOP/s':>8} {'vs FA2':>7} {'vs cuDNN':>8}"
        body = [f"{c:24} {n:22} {tf:8.1f} {'' if a is None else f'{a:7.3f}':>7} {'' if u is None else f'{u:8.3f}':>8}"
                for c, n, tf, a, u in tab]
        (OUT / "attn_wgmma_timing.txt").write_text("\n".join([hdr] + body) + "\n")
        print(f"timing ({time.time() - t1:.1f} s)\n" + "\n".join([hdr] + body))
    print(f"SUMMARY correctness {len(rows) - len(bad)}/{len(rows)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
