"""One training step (forward + backward) of issue 16's transformer block at a real size, built from
derived kernels, against the same block in PyTorch (issue 17's end-to-end target), in one process.

The block, pre-norm, on x [T, d] fp16 (T = B·N tokens; real size: B = 4, N = 4096, d = 2048,
16 heads of 128, MLP 4·d), every weight an fp16 leaf, x requiring its gradient too:
    h  = RMSNorm(x; w1)                 derived: devtools/train_block/block_rmsnorm_grad.yaml (C = 2048)
    qkv = h · Wqkv                      derived: devtools/train_block/block_gemm_grad.yaml (wgmma fwd, dA NT, dB TN)
    o  = causal attention(q, k, v)      derived: examples/flash_attention_wgmma_grad.yaml ([B, H, N, D])
                                        or devtools/train_block/block_attention_bnhd_grad.yaml ([B, N, H, D]),
                                        wgmma forward and backward
    x2 = o · Wo + x                     derived: devtools/train_block/block_gemm_residual_grad.yaml
    h2 = RMSNorm(x2; w2)
    u  = GELU_tanh(h2 · Wup + bup)      derived: devtools/train_block/block_gemm_bias_gelu_grad.yaml (GELU the
                                        GEMM's epilogue; the backward recomputes the pre-activation),
                                        or block_gemm_bias_grad.yaml + block_gelu_grad.yaml ("split":
                                        the pre-activation stored, GELU element-wise, as PyTorch does)
    y  = u · Wdown + x2                 derived: block_gemm_residual_grad.yaml
The derived variants (BLOCKS): bhnd, bnhd (fused MLP), bnhd_split.  Torch glue in the derived
block: q, k, v copied out of qkv [T, 3·d] into the attention's layout (bhnd: and o merged back to
[T, d] by a copy; bnhd: o is a view), autograd between the custom ops.
The PyTorch block computes the same function as PyTorch code would: one cuBLAS GEMM for Q/K/V,
SDPA on the heads as strided views (cuDNN backend; FlashAttention-2 in a second case), addmm for
the residual and bias epilogues, F.gelu(approximate="tanh"), RMSNorm (fp32 math from fp16, rounded
to fp16) under torch.compile.

Timed: forward + backward (torch.autograd.grad of the output with a fixed fp16 cotangent, for
every weight and x), device time by CUDA events around one step each (a sleep kernel queued first
so the host enqueues the step ahead of the GPU), warm-up, median; host wall per step and peak
memory as well.  Checked once: loss (per-token sum of squared errors vs a random target, fp32)
and every gradient of the derived step against the PyTorch block (relative error in norm).

    python devtools/train_step_bench.py prepare OUTDIR   # CPU (NVRTC): builds the pieces into OUTDIR
    python devtools/train_step_bench.py run OUTDIR       # GPU: one line per case, $OUT/train_step_bench.json
    python devtools/train_step_bench.py check            # CPU torch, tiny: the derived block's glue
                                                         # (pieces as torch ops) == the PyTorch block
    python devtools/train_step_bench.py check --builds OUTDIR   # CPU torch, tiny: the derived block on
                                                         # the built pieces, emulated, vs PyTorch in float64

A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
EXAMPLES = ROOT / "examples"
BLOCK = ROOT / "devtools" / "train_block"  # the block's own pieces: bench inputs, not CI examples
RESULT = "train_step_bench.json"
DEVICE = "cuda"  # the run step's tensors
EPS = 1e-6  # block_rmsnorm_grad.yaml's eps
WARMUP, REPS = 3, 10
SLEEP_CYCLES = 40_000_000  # ~20 ms at 1.98 GHz: longer than the host takes to enqueue one step
GRAD_TOL = 2e-2  # derived vs PyTorch: fp16 roundings only (the 200-step test's first-step tolerance)

# piece -> its spec (each built with its backward; OUTDIR/<piece> after prepare)
PIECES: dict[str, Path] = {
    "rmsnorm": BLOCK / "block_rmsnorm_grad.yaml",
    "gemm": BLOCK / "block_gemm_grad.yaml",
    "attention": EXAMPLES / "flash_attention_wgmma_grad.yaml",  # [B, H, N, D]
    "attention_bnhd": BLOCK / "block_attention_bnhd_grad.yaml",  # [B, N, H, D]: no head copies
    "gemm_residual": BLOCK / "block_gemm_residual_grad.yaml",
    "gemm_bias_gelu": BLOCK / "block_gemm_bias_gelu_grad.yaml",  # the backward recomputes X = h2·Wup + bup
    "gemm_bias": BLOCK / "block_gemm_bias_grad.yaml",  # X stored ...
    "gelu": BLOCK / "block_gelu_grad.yaml",  # ... and GELU a kernel of its own (the "split" MLP)
}
# piece -> the kernel's inputs, then its output, as derived_block calls it: (name, dims)
SIGNATURES: dict[str, tuple[tuple[str, str], ...]] = {
    "rmsnorm": (("X", "R C"), ("W", "C"), ("Y", "R C")),
    "gemm": (("A", "M K"), ("B", "K N"), ("C", "M N")),
    "attention": (("Q", "B H N D"), ("K", "B H N D"), ("V", "B H N D"), ("O", "B H N D")),
    "attention_bnhd": (("Q", "B N H D"), ("K", "B N H D"), ("V", "B N H D"), ("O", "B N H D")),
    "gemm_residual": (("A", "M K"), ("B", "K N"), ("C0", "M N"), ("C", "M N")),
    "gemm_bias_gelu": (("A", "M K"), ("B", "K N"), ("bias", "N"), ("C", "M N")),
    "gemm_bias": (("A", "M K"), ("B", "K N"), ("bias", "N"), ("C", "M N")),
    "gelu": (("X", "R C"), ("U", "R C")),
}
Ops = dict[str, Callable[..., Any]]


@dataclass(frozen=True)
class Shape:
    batch: int
    seq: int
    heads: int
    head_dim: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim

    @property
    def mlp(self) -> int:
        return 4 * self.d_model

    def __str__(self) -> str:
        return f"B={self.batch} N={self.seq} H={self.heads} D={self.head_dim} d={self.d_model} MLP={self.mlp}"


REAL = Shape(batch=4, seq=4096, heads=16, head_dim=128)  # 16k tokens; d = 2048 (the builds fix C and D)
TINY = Shape(batch=2, seq=24, heads=2, head_dim=16)  # check: the glue on CPU torch, float64
EMU = Shape(batch=1, seq=3, heads=16, head_dim=128)  # check --builds: the emulated pieces (d, D fixed)


# -- the block ---------------------------------------------------------------------------------
def rmsnorm_math(torch: Any, x: Any, w: Any) -> Any:
    """RMSNorm as the spec states it: fp32 math from the input dtype, rounded back to it."""
    xf = x.float() if x.dtype != torch.float64 else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.to(xf.dtype)
    return y.to(x.dtype)


# the derived block's variants: (the attention's layout, the MLP's up-projection + GELU)
BLOCKS: dict[str, tuple[str, str]] = {"bhnd": ("bhnd", "fused"), "bnhd": ("bnhd", "fused"),
                                      "bnhd_split": ("bnhd", "split")}


def pieces_of(block: str) -> tuple[str, ...]:
    """The pieces a variant of the derived block calls."""
    layout, mlp = BLOCKS[block]
    return ("rmsnorm", "gemm", "attention_bnhd" if layout == "bnhd" else "attention", "gemm_residual",
            *(("gemm_bias", "gelu") if mlp == "split" else ("gemm_bias_gelu",)))


def derived_block(x: Any, w: dict[str, Any], ops: Ops, s: Shape, block: str) -> Any:
    """The block on the derived pieces' interface.  Attention on contiguous [B, H, N, D] (q, k, v
    copied out of the heads of qkv, o merged back by a copy) or [B, N, H, D] (q, k, v copied out
    of qkv, o a view); the MLP's GELU fused into the up-projection (its backward recomputes the
    pre-activation by a GEMM) or split (the pre-activation stored, GELU element-wise)."""
    layout, mlp = BLOCKS[block]
    h = ops["rmsnorm"](x, w["norm1"])
    qkv = ops["gemm"](h, w["qkv"]).view(s.batch, s.seq, 3, s.heads, s.head_dim)
    if layout == "bnhd":
        q, k, v = (t.contiguous() for t in qkv.unbind(2))
        o = ops["attention_bnhd"](q, k, v).view(s.tokens, s.d_model)
    else:
        q, k, v = (t.contiguous() for t in qkv.permute(2, 0, 3, 1, 4).unbind(0))
        o = ops["attention"](q, k, v).permute(0, 2, 1, 3).reshape(s.tokens, s.d_model)
    x2 = ops["gemm_residual"](o, w["out"], x)
    h2 = ops["rmsnorm"](x2, w["norm2"])
    if mlp == "split":
        u = ops["gelu"](ops["gemm_bias"](h2, w["up"], w["up_bias"]))
    else:
        u = ops["gemm_bias_gelu"](h2, w["up"], w["up_bias"])
    return ops["gemm_residual"](u, w["down"], x2)


def torch_block(torch: Any, x: Any, w: dict[str, Any], s: Shape, norm: Callable[..., Any]) -> Any:
    """The same block written as PyTorch code is: heads as strided views, SDPA, addmm epilogues."""
    import torch.nn.functional as F

    h = norm(x, w["norm1"])
    q, k, v = (t.transpose(1, 2) for t in (h @ w["qkv"]).view(s.batch, s.seq, 3, s.heads, s.head_dim).unbind(2))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(s.tokens, s.d_model)
    x2 = torch.addmm(x, o, w["out"])
    u = F.gelu(torch.addmm(w["up_bias"], norm(x2, w["norm2"]), w["up"]), approximate="tanh")
    return torch.addmm(x2, u, w["down"])


def torch_pieces(torch: Any, norm: Callable[..., Any]) -> Ops:
    """Each piece's interface in PyTorch (the per-piece anchors; `check` runs the derived glue on them)."""
    import torch.nn.functional as F

    return {"rmsnorm": norm,
            "gemm": lambda a, b: a @ b,
            "attention": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "attention_bnhd": lambda q, k, v: F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2),
            "gemm_residual": lambda a, b, c0: torch.addmm(c0, a, b),
            "gemm_bias_gelu": lambda a, b, bias: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
            "gemm_bias": lambda a, b, bias: torch.addmm(bias, a, b),
            "gelu": lambda x: F.gelu(x, approximate="tanh")}


def weights(torch: Any, s: Shape, dtype: Any, device: str, seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    d, mlp = s.d_model, s.mlp

    def normal(*shape: int, std: float, mean: float = 0.0) -> Any:
        t = torch.randn(*shape, generator=g, dtype=torch.float64) * std + mean
        return t.to(device=device, dtype=dtype).requires_grad_(True)

    return {"norm1": normal(d, std=0.1, mean=1.0), "qkv": normal(d, 3 * d, std=d ** -0.5),
            "out": normal(d, d, std=d ** -0.5), "norm2": normal(d, std=0.1, mean=1.0),
            "up": normal(d, mlp, std=d ** -0.5), "up_bias": normal(mlp, std=0.02),
            "down": normal(mlp, d, std=mlp ** -0.5)}


def inputs(torch: Any, s: Shape, dtype: Any, device: str, seed: int = 1) -> tuple[Any, Any, Any]:
    """(x requiring its gradient, the output cotangent dy, a loss target in fp32)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(s.tokens, s.d_model, generator=g).to(device=device, dtype=dtype).requires_grad_(True)
    dy = (torch.randn(s.tokens, s.d_model, generator=g) * s.tokens ** -0.5).to(device=device, dtype=dtype)
    target = torch.randn(s.tokens, s.d_model, generator=g).to(device=device, dtype=torch.promote_types(dtype, torch.float32))
    return x, dy, target


def loss_of(y: Any, target: Any) -> Any:
    """Per-token sum of squared errors, averaged over the tokens (in the target's dtype: fp32, as
    the 200-step test; float64 in `check`)."""
    return (y.to(target.dtype) - target).pow(2).sum(-1).mean()


def rel(a: Any, b: Any) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def compare(torch: Any, run_a: Callable[[], Any], run_b: Callable[[], Any], leaves: dict[str, Any], target: Any,
            leaves_b: dict[str, Any] | None = None) -> dict[str, float]:
    """Relative errors of a against b: the output y, the loss and every leaf's gradient of the loss
    (b's leaves are `leaves_b` where b runs on copies of a's, e.g. in another dtype)."""
    out = {}
    for key, run, ls in (("a", run_a, leaves), ("b", run_b, leaves_b or leaves)):
        y = run()
        loss = loss_of(y, target)
        out[key] = (y.detach(), loss.detach(), torch.autograd.grad(loss, list(ls.values())))
    (ya, la, ga), (yb, lb, gb) = out["a"], out["b"]
    errors = {"y": rel(ya, yb), "loss": abs(float(la) - float(lb)) / abs(float(lb))}
    errors.update({f"d{n}": rel(p, q) for n, p, q in zip(leaves, ga, gb)})
    return errors


# -- prepare (CPU) -----------------------------------------------------------------------------
def spec_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def prepare(outdir: Path) -> int:
    """Build every piece into outdir/<piece> (no proofs), load each back through the emulation
    runtime (re-derived and compared with the sources on disk), record the specs' digests."""
    import derivc
    from compiler.cli import build_to

    outdir.mkdir(parents=True, exist_ok=True)
    failed = []
    for piece, spec in PIECES.items():
        t0 = time.time()
        try:
            build_to(spec, outdir / piece, seed=1, proofs=False)
            t = derivc.load_training(outdir / piece, device="emu")
            k = t.forward_build.printed.kernel
            got = tuple((x.name, " ".join(str(a) for a in x.dims)) for x in (*k.inputs, k.outputs[0]))
            if got != SIGNATURES[piece]:
                raise ValueError(f"the kernel takes / writes {got}, the block calls it as {SIGNATURES[piece]}")
            kernels = [e.name for e in t.manifest.kernels]
            print(f"{piece}: {spec.name} built and loaded ({time.time() - t0:.0f} s; backward kernels "
                  f"{', '.join(kernels)})", flush=True)
        except Exception as exc:  # noqa: BLE001 - one piece failing must not hide the others
            failed.append(piece)
            print(f"{piece}: {spec.name} FAILED: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
    (outdir / "pieces.json").write_text(json.dumps(
        {p: {"spec": str(s.relative_to(ROOT)), "sha256": spec_digest(s)} for p, s in PIECES.items()}, indent=1))
    size = sum(f.stat().st_size for f in outdir.rglob("*") if f.is_file())
    print(f"{outdir}: {size / 2**20:.1f} MiB" + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


# -- run (GPU) ---------------------------------------------------------------------------------
class Recorder:
    """One JSON row per case, printed as it comes and written to $OUT/<RESULT> after each."""

    def __init__(self, path: Path):
        self.path, self.rows = path, []

    def __call__(self, **row: Any) -> None:
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        self.path.write_text(json.dumps(self.rows, indent=1))

    def case(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """Run one case; a failure is recorded (error + trace) and the next case runs."""
        t0 = time.time()
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - fail loudly per case, continue with the others
            self(case=name, error=f"{type(exc).__name__}: {str(exc)[:400]}", trace=traceback.format_exc()[-2000:],
                 wall_s=round(time.time() - t0, 1))
            return None
        self(case=name, **res, wall_s=round(time.time() - t0, 1))
        return res


def device_ms(torch: Any, fn: Callable[[], Any], warmup: int = WARMUP, reps: int = REPS,
              inner: int = 1) -> dict[str, float]:
    """Median device time of one call (CUDA events around `inner` back-to-back calls, a sleep
    kernel queued first so that the host enqueues them ahead of the GPU), host wall per call
    (synchronised), and the peak memory of the calls above what was allocated before."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / inner)
    peak = torch.cuda.max_memory_allocated() - base
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    host = (time.perf_counter() - t0) * 1e3 / 3
    return {"ms": round(statistics.median(times), 4), "min_ms": round(min(times), 4),
            "host_ms": round(host, 3), "peak_mib": round(peak / 2**20, 1)}


def step_fn(torch: Any, block: Callable[[], Any], leaves: list[Any], dy: Any) -> Callable[[], Any]:
    """One training step's device work: the forward and the gradients of every leaf."""
    return lambda: torch.autograd.grad(block(), leaves, dy)


def step_flops(s: Shape) -> float:
    """Forward + backward FLOPs: the GEMMs 3 × 2·T·(d·3d + d·d + 2·d·mlp) and causal attention
    (forward 2·B·H·N²·D, backward 2.5 ×, both halved for the mask)."""
    gemm = 2 * s.tokens * (3 * s.d_model ** 2 + s.d_model ** 2 + 2 * s.d_model * s.mlp)
    attn = 4 * s.batch * s.heads * s.seq ** 2 * s.head_dim * 0.5
    return 3 * gemm + 3.5 * attn


def run(outdir: Path, out: Path) -> int:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import derivc

    rec = Recorder(out / RESULT)
    s = REAL
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; block {s}, "
          f"{step_flops(s) / 1e12:.2f} TFLOP per step", flush=True)
    recorded = json.loads((outdir / "pieces.json").read_text())
    stale = [p for p, spec in PIECES.items() if recorded.get(p, {}).get("sha256") != spec_digest(spec)]
    if stale:
        print(f"WARNING: the spec of {', '.join(stale)} changed since prepare (the builds run as built)", flush=True)
    matmul = torch.backends.cuda.matmul
    matmul.allow_fp16_reduced_precision_reduction = False  # fp32 accumulation, as the derived GEMMs
    ops: Ops = {}

    for piece in PIECES:  # a piece that does not load fails the cases that use it
        def load(piece: str = piece) -> dict[str, Any]:
            t0 = time.time()
            ops[piece] = derivc.torch_op(outdir / piece)
            return {"load_s": round(time.time() - t0, 1)}
        rec.case(f"load:{piece}", load)
    w = weights(torch, s, torch.float16, DEVICE)
    x, dy, target = inputs(torch, s, torch.float16, DEVICE)
    leaves = {"x": x, **w}
    norm = torch.compile(lambda a, b: rmsnorm_math(torch, a, b), dynamic=False)

    def derived(block: str) -> Callable[[], Any]:
        return lambda: derived_block(x, w, ops, s, block)

    def reference(backend: Any) -> Callable[[], Any]:
        def block() -> Any:
            with sdpa_kernel(backend):
                return torch_block(torch, x, w, s, norm)
        return block

    flops = step_flops(s)
    times: dict[str, float] = {}
    anchors = {"pytorch_cudnn": SDPBackend.CUDNN_ATTENTION, "pytorch_fa2": SDPBackend.FLASH_ATTENTION}

    def timed(name: str, block: Callable[[], Any]) -> Callable[[], dict[str, Any]]:
        def case() -> dict[str, Any]:
            r = device_ms(torch, step_fn(torch, block, list(leaves.values()), dy))
            times[name] = r["ms"]
            vs = {f"ratio_vs_{a}": round(times[a] / r["ms"], 3) for a in anchors if a in times and a != name}
            return {**r, "tflops": round(flops / r["ms"] / 1e9, 1), **vs}
        return case

    for name, backend in anchors.items():  # the anchors first: their compile warm-up is not timed
        rec.case(name, timed(name, reference(backend)))
    for block in BLOCKS:
        rec.case(f"derived_{block}", timed(f"derived_{block}", derived(block)))
    for block in BLOCKS:
        if f"derived_{block}" in times:
            ms = times[f"derived_{block}"]
            rec(case=f"summary_{block}", derived_ms=ms, tflops=round(flops / ms / 1e9, 1),
                **{f"ratio_vs_{a}": round(times[a] / ms, 3) for a in anchors if a in times},
                note="ratio = PyTorch ms / derived ms (> 1: derived faster)")

    for block in BLOCKS:
        def check(block: str = block) -> dict[str, Any]:
            errors = compare(torch, derived(block), reference(SDPBackend.CUDNN_ATTENTION), leaves, target)
            bad = {k: e for k, e in errors.items() if not e < GRAD_TOL}
            return {"rel_err": {k: float(f"{e:.3e}") for k, e in errors.items()}, "tol": GRAD_TOL,
                    "ok": not bad, **({"over_tol": list(bad)} if bad else {})}
        rec.case(f"check_loss_and_gradients_{block}", check)
    pieces(torch, rec, ops, torch_pieces(torch, norm), s)
    return 0 if all("error" not in r for r in rec.rows) else 1


def pieces(torch: Any, rec: Recorder, ops: Ops, ref: Ops, s: Shape) -> None:
    """Each piece alone, forward + backward at the block's shapes: derived vs its PyTorch op."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device=DEVICE).manual_seed(2)
    T, d, mlp = s.tokens, s.d_model, s.mlp

    def t(*shape: int, std: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=g, device=DEVICE) * std).half().requires_grad_(True)

    heads = (s.batch, s.heads, s.seq, s.head_dim)
    args = {"rmsnorm": lambda: (t(T, d), t(d)),
            "gemm": lambda: (t(T, d), t(d, 3 * d, std=d ** -0.5)),
            "attention": lambda: (t(*heads), t(*heads), t(*heads)),
            "attention_bnhd": lambda: tuple(t(s.batch, s.seq, s.heads, s.head_dim) for _ in range(3)),
            "gemm_residual": lambda: (t(T, mlp), t(mlp, d, std=mlp ** -0.5), t(T, d)),
            "gemm_bias_gelu": lambda: (t(T, d), t(d, mlp, std=d ** -0.5), t(mlp, std=0.02)),
            "gemm_bias": lambda: (t(T, d), t(d, mlp, std=d ** -0.5), t(mlp, std=0.02)),
            "gelu": lambda: (t(T, mlp),)}
    for piece, make in args.items():
        def case(piece: str = piece, make: Callable[[], tuple] = make) -> dict[str, Any]:
            xs = make()
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                dy = torch.randn_like(ref[piece](*xs)).mul_(0.1)
            res: dict[str, Any] = {}
            for name, op in (("derived", ops[piece]), ("pytorch", ref[piece])):
                def one(op: Callable[..., Any] = op) -> Any:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return torch.autograd.grad(op(*xs), xs, dy)
                res[name] = device_ms(torch, one, warmup=2, reps=5)["ms"]
            return {"derived_ms": res["derived"], "pytorch_ms": res["pytorch"],
                    "ratio": round(res["pytorch"] / res["derived"], 3)}
        rec.case(f"piece:{piece}", case)


# -- check (CPU torch, tiny) --------------------------------------------------------------------
def check_cpu() -> int:
    """The derived block's glue with each piece as its PyTorch op, against the PyTorch block, in
    float64 on the CPU at a tiny size: the two must compute the same function (to rounding)."""
    import torch

    s = TINY
    norm = lambda a, b: rmsnorm_math(torch, a, b)  # noqa: E731
    w = weights(torch, s, torch.float64, "cpu")
    x, _, target = inputs(torch, s, torch.float64, "cpu")
    ops = torch_pieces(torch, norm)
    failed = []
    for block in BLOCKS:
        errors = compare(torch, lambda: derived_block(x, w, ops, s, block), lambda: torch_block(torch, x, w, s, norm),
                         {"x": x, **w}, target)
        print(f"derived glue ({block}) vs PyTorch block, float64, {s}: "
              + ", ".join(f"{k} {e:.1e}" for k, e in errors.items()))
        failed += [f"{block}:{k}" for k, e in errors.items() if not e < 1e-12]
    print("FAILED: " + ", ".join(failed) if failed else "ok")
    return 1 if failed else 0


def emu_ops(torch: Any, outdir: Path, needed: set[str]) -> Ops:
    """Each built piece run on the CPU through the emulation (codegen.emu: the printed kernel.cu,
    compiled by the host compiler) as a torch.autograd.Function: the forward kernel, then the
    backward kernels of grad.json (Training on device "emu")."""
    import numpy as np

    import derivc

    def function(t: Any) -> Callable[..., Any]:
        class Piece(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, *xs: Any) -> Any:
                y, ctx.saved = t.forward_with_saved(**{n: x.detach().numpy() for n, x in zip(t.inputs, xs)})
                return torch.from_numpy(np.array(y))

            @staticmethod
            def backward(ctx: Any, dy: Any) -> Any:
                grads = t.backward(ctx.saved, dy.contiguous().numpy())
                return tuple(torch.from_numpy(np.array(grads[n])) if n in grads else None for n in t.inputs)

        return Piece.apply

    return {piece: function(derivc.load_training(outdir / piece, device="emu")) for piece in needed}


def check_emu(outdir: Path, blocks: tuple[str, ...]) -> int:
    """The derived block on the built pieces (emulated on the CPU, fp16 as on the GPU) against the
    PyTorch block in float64 from the same fp16 weights and input, at a tiny size: loss, output
    and every gradient within GRAD_TOL (relative, in norm)."""
    import torch

    s = EMU
    ops = emu_ops(torch, outdir, {p for b in blocks for p in pieces_of(b)})
    norm = lambda a, b: rmsnorm_math(torch, a, b)  # noqa: E731
    w = weights(torch, s, torch.float16, "cpu")
    x, _, target = inputs(torch, s, torch.float16, "cpu")
    leaves = {"x": x, **w}
    exact = {k: v.detach().double().requires_grad_(True) for k, v in leaves.items()}
    w64 = {k: v for k, v in exact.items() if k != "x"}
    failed = []
    for block in blocks:
        t0 = time.time()
        errors = compare(torch, lambda: derived_block(x, w, ops, s, block),
                         lambda: torch_block(torch, exact["x"], w64, s, norm), leaves, target.double(), exact)
        print(f"derived block ({block}, emulated) vs PyTorch float64, {s}: "
              + ", ".join(f"{k} {e:.1e}" for k, e in errors.items()) + f" ({time.time() - t0:.0f} s)", flush=True)
        failed += [f"{block}:{k}" for k, e in errors.items() if not e < GRAD_TOL]
    print("FAILED: " + ", ".join(failed) if failed else "ok")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="build the pieces (CPU)").add_argument("outdir", type=Path)
    sub.add_parser("run", help="time on the GPU").add_argument("outdir", type=Path)
    sub.add_parser("check", help="the glue against the PyTorch block, tiny, CPU torch").add_argument(
        "--builds", type=Path, help="prepare's OUTDIR: the derived block on the emulated pieces instead")
    sub.choices["check"].add_argument("--blocks", nargs="*", choices=tuple(BLOCKS), help="with --builds: these variants")
    a = ap.parse_args()
    if a.cmd == "prepare":
        return prepare(a.outdir)
    if a.cmd == "run":
        return run(a.outdir, Path(os.environ.get("OUT", "/tmp")))
    return check_emu(a.builds, tuple(a.blocks or BLOCKS)) if a.builds else check_cpu()


if __name__ == "__main__":
    sys.exit(main())
