"""GPU correctness of generated kernels: hand-built plans (the compiler will produce them later),
poisoned outputs, fresh random inputs, relative error against a float64 reference."""
import math

import pytest

cupy = pytest.importorskip("cupy")
try:
    if cupy.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except Exception as e:  # no driver / no device
    pytest.skip(f"no CUDA device ({e})", allow_module_level=True)

try:
    import torch
    HAVE_TORCH = torch.cuda.is_available()
except ImportError:
    torch = None
    HAVE_TORCH = False

from codegen.devtools import plans
from codegen.render import render
from codegen.runtime import CompiledKernel

pytestmark = pytest.mark.gpu
TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}
_VARIANTS = plans.variants()
_KERNELS: dict = {}


def kernel(name):
    if name not in _KERNELS:
        _KERNELS[name] = CompiledKernel(_VARIANTS[name])
    return _KERNELS[name]


def rand(shape, dtype, kind="torch"):
    if kind == "torch":
        if not HAVE_TORCH:
            pytest.skip("torch not available")
        dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
        return torch.randn(shape, device="cuda", dtype=torch.float32).to(dt)
    if dtype == "bf16":
        pytest.skip("CuPy has no bfloat16")
    return cupy.random.standard_normal(shape, dtype=cupy.float32).astype(
        {"f16": cupy.float16, "f32": cupy.float32}[dtype])


def f64(x):
    if HAVE_TORCH and isinstance(x, torch.Tensor):
        return cupy.asarray(x.detach().to(torch.float64).cpu().numpy())
    return x.astype(cupy.float64)


def poisoned(shape, dtype, kind):
    if kind == "torch":
        dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]
        return torch.full(shape, float("nan"), device="cuda", dtype=dt)
    return cupy.full(shape, cupy.nan, dtype={"f16": cupy.float16, "f32": cupy.float32}[dtype])


def rel_err(out, ref):
    o = f64(out)
    assert not bool(cupy.isnan(o).any()), "NaN in output (unwritten or invalid)"
    den = float(cupy.linalg.norm(ref))
    return float(cupy.linalg.norm(o - ref)) / (den if den > 0 else 1.0)


# ---------------------------------------------------------------- GEMM
def gemm_ref(a, b, bt):
    a, b = f64(a), f64(b)
    if bt:
        b = cupy.swapaxes(b, -1, -2)
    return cupy.matmul(a, b)


GEMM_CASES = [
    # name, (B or None, M, N, K), kind
    ("g_f16_128x128x32_s3", (None, 512, 384, 256), "torch"),
    ("g_f16_128x128x32_s3", (None, 256, 256, 512), "cupy"),
    ("g_f16_128x128x32_s4", (None, 256, 512, 320), "torch"),
    ("g_f16_128x256x32_s3", (None, 384, 512, 256), "torch"),
    ("g_f16_128x128x64_s3", (None, 256, 384, 512), "torch"),
    ("g_f16_128x128x32_w4_s4", (None, 384, 256, 512), "torch"),
    ("g_f16_128x128x64_w4_s3", (None, 256, 384, 640), "torch"),
    ("g_f16_128x256x64_s3", (None, 256, 512, 256), "torch"),
    ("g_f16_guard", (None, 300, 200, 136), "torch"),
    ("g_f16_guard", (None, 129, 201, 77), "torch"),      # K % 8 != 0: scalar tile path; odd N
    ("g_f16_guard", (None, 64, 64, 32), "cupy"),
    ("g_bf16_guard_bt", (None, 257, 130, 100), "torch"),
    ("g_bf16_guard_bt", (None, 33, 45, 19), "torch"),
    ("g_bf16_64x64_s2_batch", (3, 100, 70, 50), "torch"),
    ("g_f16_noswz_s1", (None, 190, 260, 96), "torch"),
    ("g_f16_global", (None, 100, 90, 40), "torch"),
    ("g_f16_mixed", (None, 130, 70, 72), "torch"),
    ("g_f32_simt", (None, 200, 150, 75), "torch"),
    ("g_f32_simt", (None, 64, 64, 64), "cupy"),
    ("g_f32_simt_128", (2, 130, 260, 33), "torch"),
    ("g_f32_simt_global", (None, 50, 70, 30), "torch"),
]


@pytest.mark.parametrize("name,shape,kind", GEMM_CASES)
def test_gemm(name, shape, kind):
    p = _VARIANTS[name]
    bsz, m, n, k = shape
    pre = (bsz,) if bsz else ()
    a = rand(pre + (m, k), p.a.dtype, kind)
    b = rand(pre + ((n, k) if p.b_transposed else (k, n)), p.b.dtype, kind)
    out = poisoned(pre + (m, n), p.c.dtype, kind)
    res = kernel(name)(a, b, out=out)
    assert res is out
    err = rel_err(out, gemm_ref(a, b, p.b_transposed))
    assert err <= TOL[p.a.dtype], f"{name} {shape}: rel err {err:.3e}"
    fresh = kernel(name)(a, b)  # allocating path returns the same kind of array
    assert type(fresh) is type(a)


# ---------------------------------------------------------------- attention
def attn_ref(q, k, v, scale, causal):
    q, k, v = f64(q), f64(k), f64(v)
    s = cupy.matmul(q, cupy.swapaxes(k, -1, -2)) * scale
    nq, nk = s.shape[-2], s.shape[-1]
    if causal:
        i = cupy.arange(nq)[:, None]
        j = cupy.arange(nk)[None, :]
        s = cupy.where(j <= i, s, -cupy.inf)
    mx = s.max(axis=-1, keepdims=True) if nk else s
    mx = cupy.where(cupy.isfinite(mx), mx, 0.0) if nk else mx
    e = cupy.exp(s - mx)
    den = e.sum(axis=-1, keepdims=True)
    p = cupy.where(den > 0, e / cupy.where(den > 0, den, 1.0), 0.0)
    return cupy.matmul(p, v)


ATTN_CASES = [
    # name, (B, H, Nq, Nk)
    ("a_f16_d64_nc", (2, 3, 256, 256)),
    ("a_f16_d64_c", (2, 3, 256, 256)),
    ("a_f16_d128_nc", (2, 3, 256, 384)),
    ("a_f16_d128_c", (2, 3, 384, 384)),
    ("a_bf16_d64_guard_c", (2, 2, 200, 200)),
    ("a_bf16_d64_guard_c", (1, 3, 77, 130)),
    ("a_bf16_d128_guard_c", (2, 2, 190, 190)),
    ("a_f16_d64_w4", (1, 4, 256, 320)),
    ("a_f16_d128_qs_psmem", (2, 2, 150, 150)),
    ("a_f16_d128_s1", (2, 2, 200, 200)),
    ("a_f32_simt_d64", (2, 2, 70, 70)),
    ("a_f32_simt_d128", (1, 3, 50, 90)),
    ("a_f32_simt_global", (2, 1, 40, 40)),
]


@pytest.mark.parametrize("name,shape", ATTN_CASES)
def test_attention(name, shape):
    p = _VARIANTS[name]
    bsz, h, nq, nk = shape
    d = p.head_dim
    q = rand((bsz, h, nq, d), p.q.dtype)
    k = rand((bsz, h, nk, d), p.q.dtype)
    v = rand((bsz, h, nk, d), p.q.dtype)
    out = poisoned((bsz, h, nq, d), p.o.dtype, "torch")
    kernel(name)(q, k, v, out=out)
    err = rel_err(out, attn_ref(q, k, v, p.scale, p.causal))
    assert err <= TOL[p.q.dtype], f"{name} {shape}: rel err {err:.3e}"
    if HAVE_TORCH and nq == nk and p.q.dtype != "f32":
        sd = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=p.causal, scale=p.scale)
        e2 = float((out.float() - sd.float()).norm() / sd.float().norm())
        assert e2 <= 2 * TOL[p.q.dtype], f"{name}: vs SDPA rel err {e2:.3e}"


@pytest.mark.parametrize("name", ["a_bf16_d64_guard_c", "a_f16_d128_qs_psmem", "a_f32_simt_global"])
def test_attention_no_keys_gives_zero(name):
    """A row that sees no key (seq_k = 0) is fully masked: 0, never NaN."""
    p = _VARIANTS[name]
    q = rand((1, 2, 19, p.head_dim), p.q.dtype)
    kv = rand((1, 2, 0, p.head_dim), p.q.dtype)
    out = poisoned((1, 2, 19, p.head_dim), p.o.dtype, "torch")
    kernel(name)(q, kv, kv, out=out)
    assert bool((out == 0).all()), "fully masked rows must be 0"


# ---------------------------------------------------------------- plans change the code
def test_plan_fields_change_source():
    base = render(plans.gemm("g"))
    assert "cp.async" in base.source and "ldmatrix" in base.source and "mma.sync" in base.source
    assert render(plans.gemm("g", stages=4)).source != base.source
    assert "^ (r & 7)" not in render(plans.gemm("g", swizzle=False)).source
    assert "ldmatrix" not in render(plans.gemm("g", levels=("global", "global"))).source.split("extern \"C\"")[1]
    att = render(plans.attention("a", causal=True)).source
    assert "col > row" in att and "continue" in att
    assert "sPw" in render(plans.attention("a", p_in_registers=False)).source


# ---------------------------------------------------------------- argument checks
def test_argument_errors():
    kern = kernel("g_f16_guard")
    a = rand((64, 32), "f16")
    with pytest.raises(ValueError, match="dtype"):
        kern(a.float(), rand((32, 64), "f16"))
    with pytest.raises(ValueError, match="rank"):
        kern(a[None], rand((32, 64), "f16"))
    with pytest.raises(ValueError, match="dim K"):
        kern(a, rand((31, 64), "f16"))
    with pytest.raises(ValueError, match="contiguous"):
        kern(a, rand((64, 32), "f16").t())
    with pytest.raises(ValueError, match="multiple of its tile"):
        kernel("g_f16_128x128x32_s3")(rand((100, 32), "f16"), rand((32, 128), "f16"))
    att = kernel("a_f16_d64_nc")
    q = rand((1, 1, 128, 128), "f16")
    with pytest.raises(ValueError, match="compiled for D = 64"):
        att(q, q, q)
