"""f64: the SIMT mapping computes a kernel with an f64 tensor in double (the one mapping that
prints f64: the row mapping and the tensor-core mappings refuse it by name, MAP-MMA refuses f64
operands); a program's intermediates are f64 then; the kernel step checks f64 outputs at 1e-10, so
a float function left in a double kernel fails the build; the emulated forward + backward of
examples/softmax_f64_grad.yaml agree with float64 to rounding."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from compiler.cli import build_to
from compiler.lower_spec import lower_spec
from compiler.spec import parse_spec_text

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "softmax_f64_grad.yaml"
KERNELS = ("", "grad/D/", "grad/dX/")


@pytest.fixture(scope="module")
def built(example_build) -> Path:
    """The example's build (the run's shared one, seed 0)."""
    b = example_build(EXAMPLE)
    assert b.rc == 0, b.stderr
    return b.out


def test_every_kernel_is_simt_in_double_and_checked_at_f64_precision(built):
    for k in KERNELS:
        assert json.loads((built / k / "plan.json").read_text())["mapping"] == "simt", k
        src = (built / k / "kernel.cu").read_text()
        body = src.split('extern "C"')[1]
        assert "SIMT fp64" in src and "f64_t" in body and "float" not in body, k
        kernel = json.loads((built / k / "derivation.json").read_text())["steps"][-1]
        assert kernel["rule"] == "kernel" and kernel["numeric"]["draws"], k
        assert all(d["passed"] and d["tolerance"] == 1e-10 and d["rel_error"] < 1e-14
                   for d in kernel["numeric"]["draws"]), k
    manifest = json.loads((built / "grad.json").read_text())
    assert {k["name"]: k["dtype"] for k in manifest["kernels"]} == {"D": "f64", "dX": "f64"}


def test_intermediates_of_an_f64_program_are_f64():
    spec = yaml.safe_load(EXAMPLE.read_text())
    prog = lower_spec(parse_spec_text(EXAMPLE.read_text()))
    assert prog.intermediate_dtype() == "f64"
    spec["inputs"]["X"]["dtype"], spec["output"]["dtype"] = "f32", "f32"
    assert lower_spec(parse_spec_text(yaml.safe_dump(spec))).intermediate_dtype() == "f32"


def test_the_row_mapping_prints_the_same_schedule_in_f32(tmp_path):
    """What the refusal changes: at f32 the forward goes to the row mapping, at f64 to SIMT."""
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["inputs"]["X"]["dtype"], spec["output"]["dtype"] = "f32", "f32"
    spec.pop("grad")
    path = tmp_path / "softmax_f32.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    build_to(path, tmp_path / "out", seed=0, proofs=False)
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["mapping"] == "rowwise"


def test_non_simt_mappings_refuse_an_f64_kernel_by_name(built):
    from codegen.kir.lower import UnsupportedMapping, lower
    from codegen.mappings import REGISTRY, print_kernel
    from compiler.derive import derive
    from compiler.spec import load_spec_file

    d = derive(load_spec_file(EXAMPLE), str(EXAMPLE), seed=0, check=False)
    k = lower(d.final, "softmax_f64")
    assert print_kernel(k, ()).mapping == "simt"
    rowwise = next(m for m in REGISTRY.values() if m.name == "rowwise")
    real_family = rowwise.family
    assert real_family != "any"
    try:  # with SIMT out of the way the refusal is what the build says
        saved = dict(REGISTRY)
        for key in [key for key, m in REGISTRY.items() if m.family == "any"]:
            del REGISTRY[key]
        with pytest.raises(UnsupportedMapping, match=r"rowwise: f64 tensors \(X, Y\) are printed by the SIMT mapping only"):
            print_kernel(k, ())
    finally:
        REGISTRY.clear()
        REGISTRY.update(saved)


def test_map_mma_refuses_f64_operands(tmp_path):
    from compiler.errors import DerivationError

    text = (ROOT / "examples" / "gemm.yaml").read_text().replace("dtype: f16", "dtype: f64")
    path = tmp_path / "gemm_f64.yaml"
    path.write_text(text)
    with pytest.raises(DerivationError, match="tensor cores need f16 or bf16 operands"):
        build_to(path, tmp_path / "out", seed=0, proofs=False)


def test_a_float_function_in_a_double_kernel_fails_the_kernel_step(tmp_path, monkeypatch):
    from codegen.mappings import cexpr

    from compiler.cli import BuildError

    monkeypatch.setitem(cexpr.UNARY_C_DOUBLE, "exp", "expf")  # exp rounded to float: ~1e-7 off
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec.pop("grad")
    path = tmp_path / "softmax_f64.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(BuildError, match="kernel"):
        build_to(path, tmp_path / "out", seed=0, proofs=False)


def test_emulated_forward_and_backward_match_float64(built):
    import derivc

    t = derivc.load_training(built, device="emu")
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal((5, 128)) * 4, rng.standard_normal((5, 128))
    y, saved = t.forward_with_saved(X=x)
    dx = t.backward(saved, dy)["X"]
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ref = p * (dy - (p * dy).sum(axis=1, keepdims=True))
    assert y.dtype == np.float64 and dx.dtype == np.float64
    assert np.linalg.norm(y - p) / np.linalg.norm(p) < 1e-14
    assert np.linalg.norm(dx - ref) / np.linalg.norm(ref) < 1e-13
