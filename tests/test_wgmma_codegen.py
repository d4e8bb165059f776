"""wgmma contraction codegen (codegen/mappings/render_wgmma.py), CPU only: render, compile with NVRTC for
sm_90a, check the SASS (HGMMA, async copies, no local memory, no serialized wgmma pipeline) and
the plan validation (plans built by hand in tests/plankit.py; the kernels that run come from
specs, tests/gpu)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codegen.cuda import nvrtc, sass  # noqa: E402
from plankit import gemm  # noqa: E402
from codegen.mappings.render_wgmma import render_wgmma, tma_supported  # noqa: E402

needs_nvrtc = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="NVRTC not installed")
needs_sass = pytest.mark.skipif(not (nvrtc.nvrtc_available() and sass.sass_available()),
                                reason="NVRTC or cuobjdump/nvdisasm not installed")


def wg(name: str, dtype: str = "f16", **kw):
    kw.setdefault("block", (128, 256, 64))
    kw.setdefault("warps", (8, 1))
    kw.setdefault("stages", 4)
    kw.setdefault("guards", (True, True, True))
    return gemm(name, dtype, mma="wgmma", **kw)


PLANS = {
    "wg_f16_kn": (wg("wg_f16_kn"), False),
    "wg_bf16_nk": (wg("wg_bf16_nk", "bf16", b_transposed=True), False),
    "wg_f16_256x128_f32out": (wg("wg_f16_256x128_f32out", out_dtype="f32", block=(256, 128, 64)), False),
    "wg_bf16_batch_s2": (wg("wg_bf16_batch_s2", "bf16", block=(64, 128, 128), warps=(4, 2), stages=2,
                            batch=True), False),
    "wg_f16_fixed": (None, False),  # fixed sizes, no guards: built below
    "wt_f16_kn": (wg("wt_f16_kn"), True),
    "wt_bf16_nk_batch": (wg("wt_bf16_nk_batch", "bf16", block=(128, 128, 64), b_transposed=True,
                            batch=True, stages=5), True),
}


def _fixed_plan():
    from dataclasses import replace
    p = wg("wg_f16_fixed", guards=(False, False, False))
    return replace(p, fixed=(("M", 1024), ("N", 2048), ("K", 512)), dynamic=())


def _plan(key):
    plan, tma = PLANS[key]
    return (_fixed_plan() if plan is None else plan), tma


@pytest.mark.parametrize("key", list(PLANS))
def test_render_contract(key):
    plan, tma = _plan(key)
    ks = render_wgmma(plan, tma=tma)
    assert ks.entry == plan.kernel_name
    assert "--gpu-architecture=sm_90a" in ks.options
    assert ks.threads == plan.warps_m * plan.warps_n * 32 + (128 if tma else 0)
    assert ks.smem_bytes <= 227 * 1024
    assert "wgmma.mma_async.sync.aligned.m64n" in ks.source
    assert ks.arg_names[:3] == (plan.a.name, plan.b.name, plan.c.name)
    assert ks.arg_names[3:3 + len(plan.dynamic)] == plan.dynamic
    assert (ks.arg_names[-1] == "tmaps") == tma


@needs_sass
@pytest.mark.parametrize("key", list(PLANS))
def test_compiles_to_hgmma_without_local_memory(key):
    plan, tma = _plan(key)
    ks = render_wgmma(plan, tma=tma)
    res = nvrtc.compile_cubin(ks.source, ks.entry, tuple(ks.options) + ("-Xptxas=-v",))
    assert "C7515" not in res.log, "ptxas serialized the wgmma pipeline"
    assert "C7508" not in res.log, "ptxas ignored setmaxnreg"
    report = sass.disassemble(res.cubin, ptxas_log=res.log)
    assert sass.check_promises(report, expect_mma="wgmma", expect_async_copy=True, forbid_spills=True,
                               kernel=ks.entry) == []
    assert report.count("HMMA", kernel=ks.entry) == 0
    if tma:
        assert report.count("UTMALDG", kernel=ks.entry) > 0
    else:
        assert report.count("LDGSTS", kernel=ks.entry) > 0


@needs_nvrtc
def test_derived_schedule_renders_and_compiles():
    from codegen.kir.lower import lower
    from codegen.mappings import contraction
    from compiler.derive import derive
    from compiler.spec import load_spec_file
    path = ROOT / "examples" / "gemm_wgmma.yaml"
    spec = load_spec_file(path)
    plan = contraction.match(lower(derive(spec, str(path), seed=7).final, spec.name), "wgmma")
    assert plan.mma == "wgmma" and (plan.block_m, plan.block_n, plan.block_k) == (128, 256, 64)
    assert (plan.warps_m, plan.warps_n, plan.stages) == (8, 1, 4)
    for tma in (False, True):
        ks = render_wgmma(plan, tma=tma)
        nvrtc.compile_cubin(ks.source, ks.entry, ks.options)


@pytest.mark.parametrize("kw, msg", [
    (dict(warps=(2, 4)), "warpgroups of 4 warps"),
    (dict(block=(128, 256, 32)), "multiple of 64"),
    (dict(block=(96, 256, 64)), "multiple of 64"),
    (dict(block=(128, 512, 64)), "<= 256"),
    (dict(stages=1), "stages"),
    (dict(dtype="f32"), "f16 or both bf16"),
    (dict(stages=6), "shared memory"),
])
def test_plan_validation(kw, msg):
    dtype = kw.pop("dtype", "f16")
    with pytest.raises(ValueError, match=msg):
        render_wgmma(wg("bad", dtype, **kw))


def test_needs_sm90a():
    with pytest.raises(ValueError, match="sm_90a"):
        render_wgmma(wg("x"), options=("--gpu-architecture=sm_90",))


def test_tma_supported_needs_16_byte_rows():
    p = wg("t")
    assert tma_supported(p, {"M": 100, "N": 64, "K": 72})
    assert not tma_supported(p, {"M": 100, "N": 70, "K": 72})
    assert not tma_supported(p, {"M": 100, "N": 64, "K": 37})
    assert not tma_supported(p, {"M": 100, "N": 64, "K": 0})
    assert not tma_supported(p, {"M": 100, "N": 64, "K": 64}, (0x1000, 0x1008))
