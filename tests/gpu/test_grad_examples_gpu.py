"""Every examples/*_grad.yaml on the GPU: built as `derivc build` builds it, loaded with
derivc.load_training, forward + backward run on CUDA tensors, the output and EVERY gradient
compared with float64 torch.autograd of the same math (written here per family: attention with its
mask / bias / ALiBi / GQA / layout, GEMM with its epilogue, row norms), at lengths that are and
are not multiples of the tiles.  Attention runs at N = 1, 77, 129, 1000 (4097 for the causal d64
example), plain and with logits x8; masks that leave rows without a key (strict causal's query 0,
a window W = 0, bottom-right causal with NQ > NK) must give rows of exact zeros in the output and
in dQ, and no NaN anywhere; prefix-LM (j <= i || j < Prefix) runs at prefixes 0, 1, 100 and past N.  An example without an entry in REFERENCES fails on the CPU
(tests/test_grad_examples.py): a new *_grad.yaml must say what it computes.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*_grad.yaml"))
PENDING = sorted((ROOT / "examples" / "pending").glob("*_grad.yaml"))  # build refused today (see the file)

# relative norm error of each tensor against float64, by the tensor's dtype and the family: the
# backward reads the f16 output O (FlashAttention-2's D = rowsum(dO O)) and rounds its results
# to f16; large logits make dS = P (dP - D) cancel, so attention gets the loosest bound
# ReLU: the backward recomputes the pre-activation in f32 from f16 inputs; where it is within
# rounding of 0 its step gt(X, 0) may differ from float64's, an O(|dC|) error on those elements
# (measured 2.2e-3 at 1000 x 1024 x 1000 on the H200)
TOL = {"attention": 1e-2, "gemm": 2e-3, "gemm_relu": 5e-3, "norm": 2e-3, "f64": 1e-12}
TOL_F32_OUTPUT = 1e-4  # f32 gradients (ALiBi's slopes are not differentiated; none today)


class Case(NamedTuple):
    sizes: dict[str, int]  # every size of the spec, dynamic ones included
    logits: float = 1.0  # attention: Q x logits
    by_name: tuple[str, ...] = ()  # sizes passed by name (no input's shape holds them)


class Ref(NamedTuple):
    family: str
    cases: tuple[Case, ...]
    math: Callable[..., Any]  # (torch, inputs as float64 leaves, sizes) -> output
    # inputs holding class indices (integer-valued floats in [0, size)): (input, size)
    classes: tuple[tuple[str, str], ...] = ()


# -- the math, float64 ------------------------------------------------------------------------

def _safe_softmax(torch, s, mask):
    """softmax over the last axis of s where mask, 0 elsewhere; a row with no True is all 0
    (torch.softmax of an all -inf row is NaN)."""
    m = torch.where(mask, s, torch.full_like(s, -math.inf)).amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.where(mask, torch.exp(torch.where(mask, s, m) - m), torch.zeros_like(s))
    z = e.sum(dim=-1, keepdim=True)
    return e / torch.where(z > 0, z, torch.ones_like(z))


def _ij(torch, nq, nk, device):
    i = torch.arange(nq, device=device).view(nq, 1)
    j = torch.arange(nk, device=device).view(1, nk)
    return i, j


def attention(mask: str, *, layout: str = "bhnd", gqa: bool = False, bias: bool = False, alibi: bool = False):
    def run(torch, x, sizes):
        q, k, v = x["Q"], x["K"], x["V"]
        if layout == "bnhd":  # [B, N, H, D] -> [B, H, N, D]
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if gqa:  # Q [B, HK, G, N, D]; K, V [B, HK, N, D] read by every g of the group
            k, v = k.unsqueeze(2), v.unsqueeze(2)
        d = q.shape[-1]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        nq, nk = q.shape[-2], k.shape[-2]
        i, j = _ij(torch, nq, nk, q.device)
        if bias:
            s = s + x["Bias"]
        if alibi:
            s = s + x["Slope"].view(1, -1, 1, 1) * (j - i)
        keep = {"none": torch.ones(nq, nk, dtype=torch.bool, device=q.device), "causal": j <= i, "strict": j < i,
                "window": (j <= i) & (i - j < sizes.get("W", 0)), "bottom_right": j <= i + nk - nq,
                "prefix": (j <= i) | (j < sizes.get("Prefix", 0))}[mask]
        o = _safe_softmax(torch, s, keep) @ v
        return o.transpose(1, 2) if layout == "bnhd" else o
    return run


def gemm(epilogue: str):
    def run(torch, x, sizes):
        c = x["A"] @ x["B"]
        if epilogue == "none":
            return c
        c = c + x["bias"]
        if epilogue == "relu":
            return torch.relu(c)
        if epilogue == "gelu":
            return 0.5 * c * (1 + torch.tanh(0.7978845608 * (c + 0.044715 * c * c * c)))
        return c + x["C0"]  # residual
    return run


def softmax_rows(torch, x, sizes):
    return torch.softmax(x["X"], dim=-1)


def cross_entropy(torch, x, sizes):
    return torch.nn.functional.cross_entropy(x["X"], x["T"].detach().long(), reduction="none")


def layernorm(torch, x, sizes):
    xx = x["X"]
    mean = xx.mean(dim=-1, keepdim=True)
    var = ((xx - mean) ** 2).mean(dim=-1, keepdim=True)
    return (xx - mean) * torch.rsqrt(var + 1e-6) * x["W"] + x["Bb"]


def rmsnorm(torch, x, sizes):
    xx = x["X"]
    return xx * torch.rsqrt((xx * xx).mean(dim=-1, keepdim=True) + 1e-6) * x["W"]


# -- what each example computes, at which sizes ------------------------------------------------

def _attn_cases(d: int, lengths=(1, 77, 129, 1000), **fixed: int) -> tuple[Case, ...]:
    out = []
    for n in lengths:
        batch = {"B": 2, "H": 3} if n <= 129 else {"B": 1, "H": 2}  # the SIMT backward is O(N² D²) per head
        for logits in (1.0, 8.0):
            out.append(Case({**batch, "N": n, "D": d, **fixed}, logits))
    return tuple(out)


def _gqa_cases() -> tuple[Case, ...]:
    return tuple(Case({"B": 2 if n <= 129 else 1, "HK": 2, "G": 2, "N": n, "D": 128}, lg)
                 for n in (1, 77, 129, 1000) for lg in (1.0, 8.0))


def _window_cases() -> tuple[Case, ...]:
    """W = 0 empties every row; W = 1 leaves the diagonal; W = 100 cuts inside a 128-row tile."""
    return tuple(Case({"B": 2 if n <= 129 else 1, "H": 3 if n <= 129 else 2, "N": n, "D": 128, "W": w}, lg, ("W",))
                 for n, w in ((1, 0), (77, 0), (77, 1), (129, 100), (1000, 1), (1000, 100)) for lg in (1.0, 8.0))


def _prefix_cases() -> tuple[Case, ...]:
    """Prefix = 0 is causal; 1 adds key 0; 100 crosses the diagonal inside a 128-row tile (and past
    a 64-row tile); 2N + 3 lies beyond N (every row sees every key: non-causal)."""
    return tuple(Case({"B": 2 if n <= 129 else 1, "H": 3 if n <= 129 else 2, "N": n, "D": 128, "Prefix": p}, lg, ("Prefix",))
                 for n in (1, 77, 129, 1000) for p in (0, 1, 100, 2 * n + 3) for lg in (1.0, 8.0))


def _bottom_right_cases() -> tuple[Case, ...]:
    return tuple(Case({"B": 2 if nq * nk < 20000 else 1, "H": 2, "NQ": nq, "NK": nk, "D": 128}, lg)
                 for nq, nk in ((77, 129), (129, 77), (1, 1000), (1000, 1), (1000, 1000)) for lg in (1.0, 8.0))


GEMM_CASES = (Case({"M": 77, "N": 129, "K": 200}), Case({"M": 1000, "N": 1024, "K": 1000}))
NORM_CASES = tuple(Case({"R": r, "C": 8192}) for r in (1, 3, 77))
F64_CASES = tuple(Case({"R": r, "C": 128}) for r in (1, 3, 77, 1000))

REFERENCES: dict[str, Ref] = {
    "flash_attention_grad": Ref("attention", _attn_cases(64, (1, 77, 129, 1000, 4097)), attention("causal")),
    "flash_attention_wgmma_grad": Ref("attention", _attn_cases(128), attention("causal")),
    "flash_attention_wgmma_noncausal_grad": Ref("attention", _attn_cases(128), attention("none")),
    "attention_strict_causal_grad": Ref("attention", _attn_cases(128), attention("strict")),
    "attention_sliding_window_grad": Ref("attention", _window_cases(), attention("window")),
    "attention_alibi_grad": Ref("attention", _attn_cases(128), attention("causal", alibi=True)),
    "attention_bias_grad": Ref("attention", _attn_cases(128), attention("none", bias=True)),
    "attention_gqa_grad": Ref("attention", _gqa_cases(), attention("causal", gqa=True)),
    "flash_attention_wgmma_bnhd_grad": Ref("attention", _attn_cases(128), attention("causal", layout="bnhd")),
    "attention_bottom_right_causal_grad": Ref("attention", _bottom_right_cases(), attention("bottom_right")),
    "attention_prefix_lm_grad": Ref("attention", _prefix_cases(), attention("prefix")),
    "gemm_grad": Ref("gemm", GEMM_CASES, gemm("none")),
    "gemm_bias_relu_grad": Ref("gemm_relu", GEMM_CASES, gemm("relu")),
    "gemm_bias_gelu_grad": Ref("gemm", GEMM_CASES, gemm("gelu")),
    "gemm_residual_grad": Ref("gemm", GEMM_CASES, gemm("residual")),
    "softmax_online_grad": Ref("norm", NORM_CASES, softmax_rows),
    "softmax_f64_grad": Ref("f64", F64_CASES, softmax_rows),  # SIMT in double: float64 to rounding
    "layernorm_grad": Ref("norm", NORM_CASES, layernorm),
    "rmsnorm_grad": Ref("norm", NORM_CASES, rmsnorm),
    "cross_entropy_grad": Ref("norm", tuple(Case({"R": r, "C": 50257}) for r in (1, 3, 77)), cross_entropy,
                              classes=(("T", "C"),)),
}


# -- the run -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trainings(tmp_path_factory):
    import derivc
    from compiler.cli import build_to

    root = tmp_path_factory.mktemp("grad_examples")
    # DERIVC_PREBUILT=DIR: builds devtools/prebuild.py wrote (DIR/<stem>, same seed, same build)
    prebuilt = Path(os.environ["DERIVC_PREBUILT"]) if os.environ.get("DERIVC_PREBUILT") else None
    cache: dict[str, Any] = {}

    def get(path: Path) -> Any:
        if path.stem not in cache:
            out = prebuilt / path.stem if prebuilt is not None and (prebuilt / path.stem).is_dir() else None
            if out is None:
                out = root / path.stem
                build_to(path, out, seed=0, proofs=False)  # seed 0: as CI builds them
            cache[path.stem] = derivc.load_training(out)
        return cache[path.stem]

    return get


def _inputs(torch, t, case: Case, seed: int, ref: Ref) -> tuple[dict[str, Any], Any]:
    """The forward inputs (randn in their dtype; attention's Q x logits, ALiBi's slopes in
    (0, 0.5], class indices uniform in [0, size)) and the seed (the output cotangent), on CUDA."""
    from compiler.machine import DTYPES

    g = torch.Generator(device="cuda").manual_seed(seed)
    kernel = t.forward_build.printed.kernel
    xs = {}
    for arg in kernel.inputs:
        shape = tuple(a.evaluate(case.sizes) for a in arg.dims)
        x = torch.randn(shape, generator=g, device="cuda", dtype=torch.float64)
        if arg.name == "Q":
            x = x * case.logits
        if arg.name == "Slope":
            x = torch.rand(shape, generator=g, device="cuda", dtype=torch.float64) * 0.5 + 1e-3
        for name, size in ref.classes:
            if arg.name == name:
                x = torch.randint(0, case.sizes[size], shape, generator=g, device="cuda").double()
        xs[arg.name] = x.to(getattr(torch, DTYPES[arg.dtype].torch))
    out = kernel.output
    seed_t = torch.randn(tuple(a.evaluate(case.sizes) for a in out.dims), generator=g, device="cuda",
                         dtype=torch.float64).to(getattr(torch, DTYPES[out.dtype].torch))
    return xs, seed_t


def _rel(torch, got, want) -> float:
    want = want.double()
    diff = torch.linalg.norm(got.double() - want).item()
    scale = torch.linalg.norm(want).item()
    return diff / scale if scale else diff


# parked examples that build (without proofs, as the fixture builds every example) and run
RUNNABLE_PENDING = [p for p in PENDING if p.stem in ("cross_entropy_grad",)]
CASES = [(p, i) for p in EXAMPLES + RUNNABLE_PENDING
         for i in range(len(REFERENCES[p.stem].cases) if p.stem in REFERENCES else 0)]


def _case_id(path: Path, i: int) -> str:
    case = REFERENCES[path.stem].cases[i]
    return "-".join([path.stem, *(f"{k}{v}" for k, v in case.sizes.items()), f"x{case.logits:g}"])


@pytest.mark.gpu
@pytest.mark.parametrize("path,case_index", CASES, ids=[_case_id(p, i) for p, i in CASES])
def test_gradients_match_float64_autograd(torch, trainings, path: Path, case_index: int):
    ref = REFERENCES[path.stem]
    check_gradients(torch, trainings(path), ref, ref.cases[case_index], seed=17 + case_index, where=path.stem)


def check_gradients(torch, t: Any, ref: Ref, case: Case, seed: int, where: str,
                    to_runtime: Callable[[Any], Any] = lambda x: x, to_torch: Callable[[Any], Any] = lambda x: x
                    ) -> None:
    """Forward + backward of `t` on _inputs (handed to the runtime through `to_runtime`: torch
    tensors as they are, or CuPy arrays through DLPack), the output and every gradient (back
    through `to_torch`) compared with float64 autograd of `ref.math`."""
    xs, dy = _inputs(torch, t, case, seed=seed, ref=ref)
    named = {n: case.sizes[n] for n in case.by_name}
    y, saved = t.forward_with_saved(**{n: to_runtime(x) for n, x in xs.items()}, **named)
    grads = t.backward(saved, to_runtime(dy), **named)
    torch.cuda.synchronize()
    y, grads = to_torch(y), {n: to_torch(g) for n, g in grads.items()}

    leaves = {n: x.detach().double().requires_grad_(n in t.manifest.wrt) for n, x in xs.items()}
    y_ref = ref.math(torch, leaves, case.sizes)
    y_ref.backward(dy.double())
    where = f"{where} at {case.sizes}, logits x{case.logits:g}"
    tol = TOL[ref.family]
    assert y.dtype == dy.dtype and tuple(y.shape) == tuple(y_ref.shape), where
    assert _rel(torch, y, y_ref.detach()) <= tol, f"{where}: output {_rel(torch, y, y_ref.detach()):.3e}"
    assert set(grads) == set(t.manifest.wrt), where
    for name in t.manifest.wrt:
        got, want = grads[name], leaves[name].grad
        assert got.dtype == xs[name].dtype and got.shape == xs[name].shape, f"{where}: d{name} {got.dtype} {got.shape}"
        assert bool(torch.isfinite(got).all()), f"{where}: d{name} has NaN / inf"
        bound = TOL_F32_OUTPUT if got.dtype == torch.float32 else tol
        err = _rel(torch, got, want)
        assert err <= bound, f"{where}: d{name} relative error {err:.3e} > {bound:g}"
    if ref.family == "attention":
        _empty_rows_are_zero(torch, y, y_ref.detach(), grads, where)


def _empty_rows_are_zero(torch, y, y_ref, grads, where: str) -> None:
    """Rows whose queries see no key: the reference is exactly 0 there; so must the output and
    dQ be (not NaN, not round-off)."""
    empty = (y_ref == 0).all(dim=-1)  # [..., N] over every axis but the feature axis
    if not bool(empty.any()):
        return
    assert bool((y.double()[empty] == 0).all()), f"{where}: a fully masked row of the output is not 0"
    dq = grads["Q"].double()
    assert bool((dq[empty] == 0).all()), f"{where}: dQ of a fully masked row is not 0"
