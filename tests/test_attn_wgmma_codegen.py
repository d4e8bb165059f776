"""wgmma attention codegen (codegen/mappings/render_attn_wgmma.py), CPU only: render, compile with NVRTC for
sm_90a, check the SASS (HGMMA with a register A operand, TMA loads, no local memory, no serialized
wgmma pipeline, setmaxnreg honoured) and the plan validation. The GPU check is
tests/gpu (kernels derived from specs)."""
from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codegen.cuda import nvrtc, sass  # noqa: E402
from plankit import attention, mask  # noqa: E402
from codegen.mappings.render_attn_wgmma import (render_attn_wgmma,  # noqa: E402
                                       tma_supported_attn)

needs_sass = pytest.mark.skipif(not (nvrtc.nvrtc_available() and sass.sass_available()),
                                reason="NVRTC or cuobjdump/nvdisasm not installed")


def aw(name: str, dtype: str = "f16", d: int = 128, **kw):
    kw.setdefault("block", (128, 128))
    kw.setdefault("warps", kw["block"][0] // 16)
    kw.setdefault("stages", 2)
    kw.setdefault("guards", (True, True))
    kw.setdefault("q_level", "shared")
    return attention(name, dtype, d=d, mma="wgmma", **kw)


PLANS = {
    "aw_f16_d128_nc": (aw("aw_f16_d128_nc"), True, False),
    "aw_f16_d128_c": (aw("aw_f16_d128_c"), True, True),
    "aw_bf16_d128_c": (aw("aw_bf16_d128_c", "bf16"), True, True),
    "aw_f16_d64_c_s3": (aw("aw_f16_d64_c_s3", d=64, stages=3), True, True),
    "aw_bf16_d64_nc_unguarded": (aw("aw_bf16_d64_nc_unguarded", "bf16", d=64, guards=(False, False)), True, False),
    "aw_f16_d128_bn64_c": (aw("aw_f16_d128_bn64_c", block=(128, 64), stages=3), True, True),
    "awno_f16_d128_c": (aw("awno_f16_d128_c"), False, True),
    "aw_f16_d128_64rows": (aw("aw_f16_d128_64rows", block=(64, 128)), True, True),
}


def render(key, **kw):
    plan, ov, causal = PLANS[key]
    return plan, render_attn_wgmma(plan, mask(plan, causal), overlap=ov, **kw)


@pytest.mark.parametrize("key", list(PLANS))
def test_render_contract(key):
    plan, ks = render(key)
    assert ks.entry == plan.kernel_name
    assert "--gpu-architecture=sm_90a" in ks.options
    assert ks.threads == plan.warps * 32 + 128
    assert ks.smem_bytes <= 227 * 1024
    assert "wgmma.mma_async.sync.aligned.m64n" in ks.source
    assert "cp.async.bulk.tensor.3d" in ks.source
    assert ks.arg_names[:4] == (plan.q.name, plan.k.name, plan.v.name, plan.o.name)
    assert ks.arg_names[4:4 + len(plan.dynamic)] == plan.dynamic
    assert ks.arg_names[-1] == "tmaps"


@needs_sass
@pytest.mark.parametrize("key", list(PLANS))
def test_compiles_to_hgmma_without_local_memory(key):
    plan, ks = render(key)
    res = nvrtc.compile_cubin(ks.source, ks.entry, tuple(ks.options) + ("-Xptxas=-v",))
    for code in ("C7513", "C7515", "C7510"):
        assert code not in res.log, f"ptxas serialized the wgmma pipeline ({code})"
    assert "C7508" not in res.log, "ptxas ignored setmaxnreg"
    report = sass.disassemble(res.cubin, ptxas_log=res.log)
    assert sass.check_promises(report, expect_mma="wgmma", expect_async_copy=True, forbid_spills=True,
                               kernel=ks.entry) == []
    assert report.count("HMMA", kernel=ks.entry) == 0
    assert report.count("UTMALDG", kernel=ks.entry) > 0
    assert report.local_memory_ops == 0
    # P.V takes P from registers and V MN-major: HGMMA with a register A operand and .tnspB
    assert re.search(r"HGMMA\.64x\d+x16\.F32(\.BF16)? R\d+, R\d+, gdesc\[UR\d+\]\.tnspB", report.text)


@needs_sass
def test_softmax_overlaps_the_pv_wgmma():
    """overlap=True: between the wait that leaves one group (P.V) in flight and the full wait, the
    exp2 of the softmax runs (ptxas neither hoists the wait nor serializes the pipeline)."""
    plan, ks = render("aw_f16_d128_nc")
    rep = sass.disassemble(nvrtc.compile_cubin(ks.source, ks.entry, ks.options).cubin)
    seq = [ln for ln in rep.text.splitlines() if re.search(r"WARPGROUP\.DEPBAR|MUFU\.EX2", ln)]
    i1 = next(i for i, ln in enumerate(seq) if "DEPBAR.LE gsb0, 0x1" in ln)
    exps = 0
    for ln in seq[i1 + 1:]:
        if "DEPBAR" in ln:
            break
        exps += 1
    assert exps >= plan.block_n, f"only {exps} exp2 between the waits"


@pytest.mark.parametrize("kw, msg", [
    (dict(block=(128, 128), warps=4), "consumer warps"),
    (dict(block=(96, 128), warps=6), "block_m"),
    (dict(block=(128, 72)), "multiple of 16"),
    (dict(stages=1), "stages"),
    (dict(dtype="f32"), "f16 or all bf16"),
    (dict(stages=4), "shared memory"),
    (dict(p_in_registers=False), "p_in_registers"),
    (dict(kv_level="global"), "shared"),
])
def test_plan_validation(kw, msg):
    dtype = kw.pop("dtype", "f16")
    with pytest.raises(ValueError, match=msg):
        p = aw("bad", dtype, **kw)
        render_attn_wgmma(p, mask(p, False))


def test_needs_sm90a_and_tma():
    with pytest.raises(ValueError, match="sm_90a"):
        render_attn_wgmma(aw("x"), mask(aw("x"), False), options=("--gpu-architecture=sm_90",))
    with pytest.raises(ValueError, match="TMA"):
        render_attn_wgmma(aw("x"), mask(aw("x"), False), tma=False)
    with pytest.raises(ValueError, match="wgmma"):
        render_attn_wgmma(replace(aw("x"), mma="mma_sync"), mask(aw("x"), False))


def test_tma_supported():
    p = aw("t")
    s = {"B": 1, "H": 2, "N": 100, "Nk": 0, "D": 128}
    assert tma_supported_attn(p, s, (0x1000, 0x2000, 0x3000))
    assert not tma_supported_attn(p, s, (0x1000, 0x2008, 0x3000))
    assert not tma_supported_attn(p, dict(s, N=0), (0x1000, 0x2000, 0x3000))
