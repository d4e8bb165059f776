"""Generated specs and schedules for differential testing of the whole pipeline.

`gemm_case(rng)` and `attention_case(rng)` draw a legal spec + schedule inside the supported
language: masks with every comparison (`<`, `<=`, both orders, conjunctions, windows),
transposed operands, batch dims, [B, H, N, D] and [B, N, H, D] layouts, fixed and dynamic
sizes (with tails), f16 / bf16 / f32, and every mapping (SIMT, mma.sync, wgmma).  A case says
which mapping it expects, or that the build must refuse with a named reason; `build_case`
runs the real CLI path (derive, check, lower, validate, print, compile).

Used by tests/test_differential.py (CPU: build, lowering validation, NVRTC, SASS promises) and
tests/gpu/test_differential_gpu.py (the same cases run on the GPU against the float64 reference).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# written with every comparison; the parser normalises > >= == to < / <= conditions
MASKS_CAUSAL = ["j <= i", "j < i", "i >= j", "i > j"]  # an upper bound on the key index: MASK may skip tiles
MASKS_OTHER = ["i <= j", "i < j", "j <= i && i < j + 40", "j + 3 <= i", "j < N - 5", "j >= i", "i == j",
               "i - j >= 2 && j > 3"]


@dataclass
class Case:
    name: str
    spec: dict[str, Any]
    mapping: str  # expected mapping name, or "refuse"
    refusal: str = ""  # a phrase the refusal must contain
    run_sizes: dict[str, int] = field(default_factory=dict)  # GPU sizes (dynamic ones)
    tags: tuple[str, ...] = ()

    def write(self, folder: Path) -> Path:
        path = folder / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(self.spec, sort_keys=False))
        return path


def _size(rng: random.Random, fixed_ok: bool, choices: tuple[int, ...], dynamic_p: float = 0.6) -> int | str:
    if not fixed_ok or rng.random() < dynamic_p:
        return "dynamic"
    return rng.choice(choices)


def gemm_case(rng: random.Random, idx: int, layouts: random.Random | None = None) -> Case:
    """layouts: the stream that draws a tensor-core case's transposed A (default rng)."""
    mapping = rng.choice(["simt", "simt", "mma_sync", "wgmma"])
    dtype = "f32" if mapping == "simt" and rng.random() < 0.5 else rng.choice(["f16", "bf16"])
    a_t = (rng if mapping == "simt" else layouts or rng).random() < 0.4  # A stored [K, M]
    b_t = rng.random() < 0.4  # B stored [N, K]
    batch = rng.random() < 0.3
    mask = None
    if mapping == "simt" and rng.random() < 0.4:
        mask = rng.choice(["k <= i", "k < i", "i <= k", "i < k + 7", "k < j", "k <= i && j <= k"])
    if mapping == "simt":
        bm, bn, bk = rng.choice([16, 32, 64]), rng.choice([16, 32, 64]), rng.choice([8, 16, 32])
        wm, wn = rng.choice([1, 2]), rng.choice([1, 2])
    elif mapping == "mma_sync":
        bm, bn, bk = rng.choice([64, 128]), rng.choice([64, 128]), rng.choice([32, 64])
        wm, wn = rng.choice([(2, 2), (4, 1), (2, 4), (4, 2)])
        if bm // wm < 32:  # a 16-row warp tile with a wide n tile spills in the mma.sync template
            wm = max(1, bm // 32)
        while (bm // wm) * (bn // wn) > 64 * 32:  # keep the warp tile's accumulators in registers
            wm, wn = (wm * 2, wn) if bm // wm >= bn // wn else (wm, wn * 2)
    else:
        bm, bn, bk = 128, rng.choice([128, 256]), 64
        wm, wn = 8, 1
    stages = 1 if mapping == "simt" else rng.choice([2, 3]) if mapping == "mma_sync" else rng.choice([3, 4])
    sizes: dict[str, Any] = {}
    tc = (64, 128, 192, 256) if mapping != "simt" else (40, 64, 96, 100)
    sizes["M"] = _size(rng, True, tuple(v for v in tc if v >= bm) or (2 * bm,))
    sizes["N"] = _size(rng, True, tuple(v for v in tc if v >= bn) or (2 * bn,))
    sizes["K"] = _size(rng, True, tuple(v for v in (tc if mapping == "simt" else (64, 128, 256)) if v >= bk) or (2 * bk,))
    if batch:
        sizes = {"Z": "dynamic", **sizes}
    zi = "z, " if batch else ""
    zd = ["Z"] if batch else []
    a_shape, a_read = (zd + ["K", "M"], f"A[{zi}k, i]") if a_t else (zd + ["M", "K"], f"A[{zi}i, k]")
    b_shape, b_read = (zd + ["N", "K"], f"B[{zi}j, k]") if b_t else (zd + ["K", "N"], f"B[{zi}k, j]")
    guard = f" | {mask}" if mask else ""
    stmt = f"C[{zi}i, j] = sum(k{guard}: {a_read} * {b_read})"
    sched: list[dict[str, Any]] = [
        {"rule": "tile", "def": "C", "index": "i", "size": bm},
        {"rule": "tile", "def": "C", "index": "j", "size": bn},
        {"rule": "reorder", "def": "C", "outer": "ii", "inner": "jo"},
        {"rule": "tile", "def": "C", "index": "k", "size": bk},
    ]
    cache = mapping != "simt" or rng.random() < 0.6
    if cache:
        sched.append({"rule": "cache", "def": "C", "tensor": "A", "at": "ko",
                      "over": ["ki", "ii"] if a_t else ["ii", "ki"], "level": "shared", "stages": stages})
        sched.append({"rule": "cache", "def": "C", "tensor": "B", "at": "ko",
                      "over": ["ji", "ki"] if b_t else ["ki", "ji"], "level": "shared", "stages": stages})
    if batch:
        sched.append({"rule": "parallel", "def": "C", "index": "z", "to": "grid.z"})
    sched += [{"rule": "parallel", "def": "C", "index": "io", "to": "grid.y"},
              {"rule": "parallel", "def": "C", "index": "jo", "to": "grid.x"}]
    sched.append({"rule": "parallel", "def": "C", "index": "ii", "to": "warp", "count": wm})
    if wn > 1:
        sched.append({"rule": "parallel", "def": "C", "index": "ji", "to": "warp", "count": wn})
    sched.append({"rule": "cache", "def": "C", "accumulator": "ko", "level": "register", "dtype": "f32"})
    if mapping != "simt":
        sched.append({"rule": "map_mma", "def": "C", "index": "ki", "instr": mapping})
    check = {n: v for n, v in {"M": bm + bm // 2 + 3, "N": bn + 5, "K": bk * 2 + 3, "Z": 2}.items()
             if sizes.get(n) == "dynamic"}
    if mapping != "simt":  # cp.async / TMA rows need 16-byte multiples along the contiguous dims
        check.update({n: v + (-v) % 8 for n, v in check.items() if n in ("K", "N") or (n == "M" and a_t)})
    run = {n: v for n, v in {"M": 300, "N": 260 if mapping == "simt" else 264, "K": 136, "Z": 3}.items()
           if sizes.get(n) == "dynamic"}
    name = f"g{idx:03d}_{mapping}_{dtype}{'_at' if a_t else ''}{'_bt' if b_t else ''}{'_z' if batch else ''}{'_mask' if mask else ''}"
    spec = {"name": name, "sizes": sizes,
            "inputs": {"A": {"shape": a_shape, "dtype": dtype}, "B": {"shape": b_shape, "dtype": dtype}},
            "statements": [stmt], "output": {"tensor": "C", "dtype": rng.choice([dtype, "f32"]) if dtype != "f32" else "f32"},
            "check_sizes": check, "schedule": sched}
    tags = tuple(t for t, on in (("transposed", a_t or b_t), ("mask", bool(mask)), ("batch", batch)) if on)
    return Case(name, spec, "contraction_" + mapping if mapping != "simt" else "simt", run_sizes=run, tags=tags)


def attention_case(rng: random.Random, idx: int) -> Case:
    mapping = rng.choice(["simt", "mma_sync", "mma_sync", "wgmma"])
    dtype = rng.choice(["f16", "bf16"]) if mapping != "simt" else rng.choice(["f16", "f32"])
    d = rng.choice([64, 128]) if mapping != "simt" else rng.choice([16, 32, 64])
    layout = "bnhd" if rng.random() < (0.5 if mapping == "simt" else 0.15) else "bhnd"
    mask = rng.choice([None, *MASKS_CAUSAL, *MASKS_CAUSAL, *MASKS_OTHER])
    bn = {"simt": rng.choice([16, 32]), "mma_sync": 64, "wgmma": 128}[mapping]
    bm = {"simt": rng.choice([16, 32]), "mma_sync": rng.choice([64, 128]), "wgmma": 128}[mapping]
    warps = {"simt": 1, "mma_sync": bm // 16, "wgmma": 8}[mapping]
    stages = {"simt": 1, "mma_sync": 2, "wgmma": 3}[mapping]
    n_fixed = rng.random() < 0.25
    sizes = {"B": "dynamic", "H": "dynamic", "N": rng.choice([200, 328]) if n_fixed else "dynamic", "D": d}
    idx4 = (lambda t, r: f"{t}[b, h, {r}, e]") if layout == "bhnd" else (lambda t, r: f"{t}[b, {r}, h, e]")
    shape = ["B", "H", "N", "D"] if layout == "bhnd" else ["B", "N", "H", "D"]
    o_idx = "O[b, h, i, d]" if layout == "bhnd" else "O[b, i, h, d]"
    v_idx = "V[b, h, j, d]" if layout == "bhnd" else "V[b, j, h, d]"
    guard = f"j | {mask}" if mask else "j"
    # K stored head-dim first ([B, H, D, N]): a layout the tensor-core mappings cannot address
    k_t = mapping != "simt" and layout == "bhnd" and rng.random() < 0.2
    k_read = "K[b, h, e, j]" if k_t else idx4("K", "j")
    stmts = [f"S[b, h, i, j] = scale * sum(e: {idx4('Q', 'i')} * {k_read})",
             f"P[b, h, i, j] = softmax({guard}: S[b, h, i, j])",
             f"{o_idx} = sum(j: P[b, h, i, j] * {v_idx})"]
    skip = mask in MASKS_CAUSAL and rng.random() < 0.8
    q_level = "register" if mapping != "simt" else "shared"
    sched: list[dict[str, Any]] = [
        {"rule": "split_softmax", "def": "P"}, {"rule": "fuse", "producer": "P"},
        {"rule": "assoc", "def": "O", "index": "j"},
        {"rule": "tile", "def": "O", "index": "j", "size": bn},
        {"rule": "tile", "def": "L", "index": "j_", "size": bn, "outer": "jo_l", "inner": "ji_l"},
        {"rule": "online_agg", "def": "O", "index": "jo"}, {"rule": "fuse", "producer": "S"},
        {"rule": "tile", "def": "O", "index": "i", "size": bm}]
    if layout == "bnhd":  # O[b, i, h, d]: bring the head loop outside the query rows
        sched.append({"rule": "reorder", "def": "O", "outer": "ii", "inner": "h"})
    if skip:
        sched.append({"rule": "skip_masked", "def": "O", "index": "jo"})
    sched += [{"rule": "cache", "def": "O", "tensor": "Q", "over": ["ii", "e"], "level": q_level},
              {"rule": "cache", "def": "O", "tensor": "K", "at": "jo", "over": ["c", "e"], "level": "shared", "stages": stages},
              {"rule": "cache", "def": "O", "tensor": "V", "at": "jo", "over": ["ji", "d"], "level": "shared", "stages": stages},
              {"rule": "parallel", "def": "O", "index": "b", "to": "grid.z"}]
    grid = [("h", "grid.y"), ("io", "grid.x")] if layout == "bhnd" else [("io", "grid.x"), ("h", "grid.y")]
    sched += [{"rule": "parallel", "def": "O", "index": v, "to": ax} for v, ax in grid]
    sched += [
              {"rule": "parallel", "def": "O", "index": "ii", "to": "warp", "count": warps}]
    if mapping != "simt":
        sched += [{"rule": "map_mma", "def": "O", "index": "e", "instr": mapping},
                  {"rule": "map_mma", "def": "O", "index": "ji", "instr": mapping, "m": "ii"}]
    check = {"B": 1, "H": 2}
    if not n_fixed:
        check["N"] = bm + bm // 2 + 5
    run = {"B": 1, "H": 2, **({} if n_fixed else {"N": rng.choice([77, 257, 300])})}
    name = f"a{idx:03d}_{mapping}_{dtype}_d{d}_{layout}_{_mask_tag(mask)}{'_skip' if skip else ''}{'_kt' if k_t else ''}"
    spec = {"name": name, "sizes": sizes,
            "inputs": {t: {"shape": ["B", "H", "D", "N"] if (t == "K" and k_t) else shape, "dtype": dtype}
                       for t in ("Q", "K", "V")},
            "params": {"scale": "1/sqrt(D)"}, "statements": stmts, "output": {"tensor": "O", "dtype": dtype},
            "check_sizes": check, "schedule": sched}
    expect, why = ("online_fold_" + mapping if mapping != "simt" else "simt"), ""
    if k_t:
        expect, why = "refuse", "the score is not"
    tags = tuple(t for t, on in (("mask", bool(mask)), ("bnhd", layout == "bnhd"), ("skip", skip), ("kt", k_t)) if on)
    return Case(name, spec, expect, why, run_sizes=run, tags=tags)


def simt_nocache(statement: str, name: str) -> dict:
    """An f32 contraction over one dynamic size N on the SIMT mapping, no CACHE steps."""
    return {"name": name, "sizes": {"N": "dynamic"},
            "inputs": {"A": {"shape": ["N", "N"], "dtype": "f32"}, "B": {"shape": ["N", "N"], "dtype": "f32"}},
            "statements": [statement], "output": {"tensor": "C", "dtype": "f32"}, "check_sizes": {"N": 70},
            "schedule": [{"rule": "tile", "def": "C", "index": "i", "size": 32},
                         {"rule": "tile", "def": "C", "index": "j", "size": 32},
                         {"rule": "reorder", "def": "C", "outer": "ii", "inner": "jo"},
                         {"rule": "tile", "def": "C", "index": "k", "size": 16},
                         {"rule": "parallel", "def": "C", "index": "io", "to": "grid.y"},
                         {"rule": "parallel", "def": "C", "index": "jo", "to": "grid.x"},
                         {"rule": "parallel", "def": "C", "index": "ii", "to": "warp", "count": 2},
                         {"rule": "cache", "def": "C", "accumulator": "ko", "level": "register", "dtype": "f32"}]}


def _mask_tag(mask: str | None) -> str:
    if mask is None:
        return "full"
    return (mask.replace(" ", "").replace("<=", "le").replace("<", "lt").replace(">=", "ge").replace(">", "gt")
            .replace("==", "eq").replace("&&", "_and_").replace("+", "p").replace("-", "m"))


def cases(n: int, seed: int = 0) -> list[Case]:
    """n generated cases, alternating GEMM-family and attention-family, deterministic in seed."""
    rng = random.Random(seed)
    # the tensor-core cases draw a transposed A from a stream of their own, so that adding that
    # draw left every case of `rng` as it was
    layouts = random.Random(f"tensor-core layouts {seed}")
    return [gemm_case(rng, k, layouts) if k % 2 == 0 else attention_case(rng, k) for k in range(n)]


def build_case(case: Case, folder: Path, *, codegen: bool = True) -> tuple[int, str, Path]:
    """Run `derivc build` on the case: (exit code, error line, build directory)."""
    from compiler.cli import main as cli_main
    import contextlib
    import io

    spec_path = case.write(folder)
    out = folder / f"{case.name}.build"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        args = ["build", str(spec_path), "-o", str(out), "--no-proofs", "--seed", "7"]
        if not codegen:
            args.append("--no-codegen")
        code = cli_main(args)
    return code, err.getvalue().strip(), out
