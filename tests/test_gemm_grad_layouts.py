"""The gradient GEMM layouts on tensor cores (CPU only): dA = dC·Bᵀ (NT: B stored [K, N] read
[n, k]) and dB = Aᵀ·dC (TN: A stored [M, K] read [k, m]), and TT, on mma.sync and wgmma.

- the four examples (examples/gemm_grad_{a,b}[_wgmma].yaml) and their bf16 twins build, the
  `kernel` step included (kernel.cu run on the CPU through the emulation against the program at
  check sizes with tails in every dim; wgmma: the cp.async and the TMA kernels);
- a TT spec builds on both instructions;
- the plan read off the kernel IR names the layout (NN / NT / TN / TT);
- hand-built TN / TT plans compile to HMMA / HGMMA without local memory (NVRTC + SASS);
- a transposed A the printer cannot stage (level 'global') is refused by name.
The mutations (A transpose bit cleared, ldmatrix .trans dropped) are in test_kernel_mutations.py.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codegen.cuda import nvrtc, sass  # noqa: E402
from codegen.mappings.plan import layout  # noqa: E402
from codegen.mappings.render import render_contraction  # noqa: E402
from codegen.mappings.render_wgmma import render_wgmma, tma_supported  # noqa: E402
from plankit import gemm  # noqa: E402

EX = ROOT / "examples"
EXAMPLES = {"gemm_grad_a": "NT", "gemm_grad_b": "TN", "gemm_grad_a_wgmma": "NT", "gemm_grad_b_wgmma": "TN"}
needs_sass = pytest.mark.skipif(not (nvrtc.nvrtc_available() and sass.sass_available()),
                                reason="NVRTC or cuobjdump/nvdisasm not installed")


def spec_text(name: str, dtype: str = "f16") -> str:
    """An example's text, its operands and output in `dtype`; name 'gemm_tt[_wgmma]': C = Aᵀ·Bᵀ
    on gemm[_wgmma].yaml's schedule (A stored [K, M], B stored [N, K]); 'gemm_grad_b_1stage':
    gemm_grad_b.yaml with one pipeline stage."""
    if name == "gemm_grad_b_1stage":  # one stage: the unpipelined loop's ldmatrix.trans A fragments
        return spec_text("gemm_grad_b", dtype).replace("name: gemm_grad_b", f"name: {name}").replace(
            "stages: 3", "stages: 1")
    if name.startswith("gemm_tt"):
        base = "gemm_wgmma" if name.endswith("wgmma") else "gemm"
        text = (EX / f"{base}.yaml").read_text().replace(f"name: {base}", f"name: {name}")
        text = text.replace("A: {shape: [M, K]", "A: {shape: [K, M]").replace("B: {shape: [K, N]", "B: {shape: [N, K]")
        text = text.replace("sum(k: A[i, k] * B[k, j])", "sum(k: A[k, i] * B[j, k])")
        text = text.replace("over: [ii, ki]", "over: [ki, ii]").replace("over: [ki, ji]", "over: [ji, ki]")
    else:
        text = (EX / f"{name}.yaml").read_text()
    return text.replace("dtype: f16", f"dtype: {dtype}")


def write_spec(tmp: Path, name: str, dtype: str) -> Path:
    path = tmp / f"{name}_{dtype}.yaml"
    path.write_text(spec_text(name, dtype))
    return path


def kernel_plan(path: Path):
    from codegen.kir.lower import lower
    from codegen.mappings import contraction
    from compiler.derive import derive
    from compiler.spec import load_spec_file
    spec = load_spec_file(path)  # derived unchecked: test_builds_through_the_kernel_step checks the same specs
    return contraction.match(lower(derive(spec, str(path), seed=7, check=False).final, spec.name), "contraction")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("name", list(EXAMPLES) + ["gemm_tt", "gemm_tt_wgmma", "gemm_grad_b_1stage"])
def test_builds_through_the_kernel_step(name, dtype, tmp_path, example_build):
    from compiler.cli import build_to

    if (EX / f"{name}.yaml").exists() and spec_text(name, dtype) == (EX / f"{name}.yaml").read_text():
        b = example_build(EX / f"{name}.yaml")  # the example itself: the run's shared build (seed 0)
        assert b.rc == 0, b.stderr
        out = b.out
    else:
        out = tmp_path / "out"
        build_to(write_spec(tmp_path, name, dtype), out, proofs=False, seed=7)
    trace = json.loads((out / "derivation.json").read_text())
    kernel = trace["steps"][-1]
    assert kernel["rule"] == "kernel"
    wgmma = name.endswith("wgmma")
    assert kernel["facts"]["mapping"] == ("contraction_wgmma" if wgmma else "contraction_mma_sync")
    ran = {d["variant"] for d in kernel["numeric"]["draws"]}
    assert ran == ({"kernel", "kernel_tma"} if wgmma else {"kernel"})
    assert all(d["passed"] for d in kernel["numeric"]["draws"])
    sizes = trace["check_sizes"]  # tiles are 64, 128 and 256: a partial last tile in every dim
    assert all(v % 64 for v in sizes.values()), f"check sizes {sizes} must leave tails in every dim"


@pytest.mark.parametrize("name, want", list(EXAMPLES.items()) + [("gemm", "NN"), ("gemm_wgmma", "NN"),
                                                                 ("gemm_tt", "TT"), ("gemm_tt_wgmma", "TT")])
def test_plan_names_the_layout(name, want, tmp_path):
    path = write_spec(tmp_path, name, "f16")
    plan = kernel_plan(path)
    assert layout(plan) == want
    assert (plan.a_transposed, plan.b_transposed) == (want[0] == "T", want[1] == "T")
    assert plan.mma == ("wgmma" if name.endswith("wgmma") else "mma_sync")


def test_tma_rows_follow_the_layout():
    """TMA needs 16-byte rows of each operand as stored: M for a transposed A, else K."""
    tn = gemm("t", mma="wgmma", a_transposed=True, block=(128, 256, 64), warps=(8, 1), stages=4)
    assert tma_supported(tn, {"M": 64, "N": 64, "K": 37})
    assert not tma_supported(tn, {"M": 60, "N": 64, "K": 64})
    assert not tma_supported(replace(tn, a_transposed=False, a=replace(tn.a, dims=("M", "K"))),
                             {"M": 64, "N": 64, "K": 37})


def test_transposed_a_from_global_is_refused():
    p = gemm("g", a_transposed=True, levels=("global", "shared"))
    with pytest.raises(ValueError, match=r"layout TN: A stored \[K, M\].*'global' is not implemented"):
        render_contraction(p)


SASS_PLANS = {
    "mma_sync_tn_f16": (gemm("tn_f16", a_transposed=True, block=(128, 256, 64), warps=(2, 4), guards=(True,) * 3), None),
    "mma_sync_tt_bf16": (gemm("tt_bf16", "bf16", a_transposed=True, b_transposed=True, block=(128, 256, 64),
                              warps=(2, 4), guards=(True,) * 3), None),
    "wgmma_tn_f16": (gemm("wtn_f16", mma="wgmma", a_transposed=True, block=(128, 256, 64), warps=(8, 1),
                          stages=4, guards=(True,) * 3), False),
    "wgmma_tn_bf16_tma": (gemm("wtn_bf16", "bf16", mma="wgmma", a_transposed=True, block=(128, 256, 64),
                               warps=(8, 1), stages=4, guards=(True,) * 3), True),
    "wgmma_tt_f16_tma": (gemm("wtt_f16", mma="wgmma", a_transposed=True, b_transposed=True,
                              block=(128, 256, 64), warps=(8, 1), stages=4, guards=(True,) * 3), True),
}


@needs_sass
@pytest.mark.parametrize("key", list(SASS_PLANS))
def test_sass_tensor_cores_without_local_memory(key):
    plan, tma = SASS_PLANS[key]
    ks = render_contraction(plan) if tma is None else render_wgmma(plan, tma=tma)
    res = nvrtc.compile_cubin(ks.source, ks.entry, tuple(ks.options) + ("-Xptxas=-v",))
    assert "C7515" not in res.log, "ptxas serialized the wgmma pipeline"
    report = sass.disassemble(res.cubin, ptxas_log=res.log)
    mma = "mma_sync" if tma is None else "wgmma"
    assert sass.check_promises(report, expect_mma=mma, expect_async_copy=True, forbid_spills=True,
                               kernel=ks.entry) == []
    if tma is None:
        assert report.count("LDSM", kernel=ks.entry) > 0 and report.count("HGMMA", kernel=ks.entry) == 0
        assert "ldmatrix.sync.aligned.m8n8.x4.trans" in ks.source
    else:
        assert report.count("HMMA", kernel=ks.entry) == 0
        assert report.count("UTMALDG" if tma else "LDGSTS", kernel=ks.entry) > 0
        assert ", p, 1, 1, 1, " in ks.source  # imm-trans-a set
