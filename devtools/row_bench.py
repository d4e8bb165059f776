"""Row kernels vs a device-to-device copy and torch.compile, 8192 x 8192 fp16, one process.

    python3 devtools/row_bench.py > $OUT/row_bench.txt

TB/s counts the bytes of X read plus Y written (2 x 128 MiB); medians of triton's do_bench.
Also times each example with other thread counts (same derivation, PARALLEL count changed).
A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing as tt
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import derivc  # noqa: E402
from compiler.cli import build_to  # noqa: E402

R = C = 8192
x = torch.randn(R, C, device="cuda", dtype=torch.float16)
w = torch.randn(C, device="cuda", dtype=torch.float16)
b = torch.randn(C, device="cuda", dtype=torch.float16)
nbytes = 2 * x.numel() * 2
rows = []


def bench(fn) -> float:
    return tt.do_bench(fn, warmup=25, rep=200, return_mode="median")


def row(**k) -> None:
    rows.append(k)
    print(json.dumps(k), flush=True)


def rms(x, w):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).half()


def ln(x, w, b):
    return F.layer_norm(x.float(), (C,), w.float(), b.float(), 1e-6).half()


ref = {"softmax_two_pass": lambda: torch.softmax(x.float(), -1).half(), "softmax_online": lambda: torch.softmax(x.float(), -1).half(),
       "rmsnorm": lambda: rms(x, w), "layernorm": lambda: ln(x, w, b)}
args = {"softmax_two_pass": (x,), "softmax_online": (x,), "rmsnorm": (x, w), "layernorm": (x, w, b)}
compiled = {"softmax": torch.compile(lambda x: torch.softmax(x.float(), -1).half()), "rmsnorm": torch.compile(rms),
            "layernorm": torch.compile(ln)}

copy_ms = bench(lambda: x.clone())
row(case="copy", ms=round(copy_ms, 4), TBps=round(nbytes / copy_ms / 1e9, 3))
for fam, fn in (("softmax", lambda: compiled["softmax"](x)), ("rmsnorm", lambda: compiled["rmsnorm"](x, w)),
                ("layernorm", lambda: compiled["layernorm"](x, w, b))):
    ms = bench(fn)
    row(case=f"{fam} torch.compile", ms=round(ms, 4), TBps=round(nbytes / ms / 1e9, 3))
CONFIGS = [  # (example, threads (None: the example's), streaming tile (None: the example's), .cs hints forced)
    ("softmax_two_pass", None, None, True), ("softmax_two_pass", None, None, False), ("softmax_two_pass", 256, None, True),
    ("softmax_online", None, None, True), ("softmax_online", None, None, False), ("softmax_online", 128, 4096, True),
    ("softmax_online", 256, 4096, True), ("softmax_online", 128, 8192, True), ("softmax_online", 512, 8192, True),
    ("rmsnorm", None, None, True), ("rmsnorm", None, None, False), ("rmsnorm", 256, None, True), ("rmsnorm", 512, None, True),
    ("layernorm", None, None, True), ("layernorm", None, None, False), ("layernorm", 128, None, True),
]
if len(sys.argv) > 1 and sys.argv[1] == "--quick":
    CONFIGS = [(c[0], None, None, None) for c in CONFIGS if c[1] is None and c[2] is None and c[3]]
from codegen.mappings import rowwise  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    for name, threads, tile, stream in CONFIGS:
        path = ROOT / "examples" / f"{name}.yaml"
        spec = yaml.safe_load(path.read_text())
        for st in spec["schedule"]:
            if st.get("rule") == "parallel" and st.get("to") == "thread" and threads is not None:
                st["count"] = threads
            if st.get("rule") == "tile" and tile is not None:
                st["size"] = tile
        hint = {True: "cs", False: "plain", None: "policy"}[stream]
        spec["name"] = f"{name}_t{threads or 'ex'}_tile{tile or 'ex'}_{hint}"
        rowwise.STREAM_HINTS = stream  # an instruction choice of the printer, compared in one run (None: its policy)
        p = Path(tmp) / f"{spec['name']}.yaml"
        p.write_text(yaml.safe_dump(spec, sort_keys=False))
        try:
            build_to(p, Path(tmp) / spec["name"], proofs=False, seed=1)
            k = derivc.load(Path(tmp) / spec["name"])
            out = torch.empty_like(x)
            k(*args[name], out=out)
            torch.cuda.synchronize()
            want = ref[name]().float()
            err = ((out.float() - want).norm() / want.norm()).item()
            ms = bench(lambda: k(*args[name], out=out))
        except Exception as exc:  # noqa: BLE001
            row(case=spec["name"], error=str(exc)[:300])
            continue
        fam = "softmax" if name.startswith("softmax") else name
        tc = next(r for r in rows if r["case"] == f"{fam} torch.compile")
        row(case=spec["name"], ms=round(ms, 4), TBps=round(nbytes / ms / 1e9, 3), vs_copy=round(copy_ms / ms, 3),
            vs_compile=round(tc["ms"] / ms, 3), rel_err_vs_torch=float(f"{err:.3e}"))
