"""The activation backward fused into the forward's tensor-core GEMM (gemm_bias_{relu,gelu}_grad):
kernel dX is the gradient program read at dX, with the pre-activation X inlined (fuse_let) and the
forward's wgmma schedule, so dC·act'(x) is the epilogue of the fp32 accumulators and X is never
stored; dX is stored in f16 (grad.kernels' dtype) and dA / dB read it on wgmma (NT / TN).

- the plans: every gradient GEMM on wgmma, dX's epilogue reading dC and bias, dX an f16 output;
- the printed dX kernel run on the CPU (emulation) against the program; a mutation of the
  epilogue (the bias read at the row, not the column, in the recomputed pre-activation) is caught there;
- the instruction choice: GELU's backward (1 - tanh², amplified by x³ where |tanh| -> 1) gets
  tanhf, its forward keeps tanh.approx.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from codegen.kir.lower import lower
from codegen.mappings import epilogue as epi_mod
from codegen.mappings.contraction import match
from codegen.mappings.plan import layout
from compiler.derive_grad import derive_gradient
from compiler.ir import Aff, Read
from compiler.kernel_view import kernel_view
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
MAPPING = "contraction wgmma"
SIZES = {"M": 150, "N": 270, "K": 72}  # a partial tile in every dim (128 x 256 x 64 tiles)


@pytest.fixture(scope="module")
def kernels():
    """{(activation, kernel): (its final program, its kernel IR)}, derived without the checks."""
    out = {}
    for act in ("relu", "gelu"):
        path = EX / f"gemm_bias_{act}_grad.yaml"
        g = derive_gradient(load_spec_file(path), str(path), seed=1, check=False)
        for d in g.kernels:
            out[act, d.grad_kernel] = (d.final, lower(d.final, d.spec.name))
    return out


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_every_gradient_gemm_is_on_wgmma(kernels, act):
    assert [k for a, k in kernels if a == act] == ["dX", "dA", "dB", "dbias"]
    prog, k = kernels[act, "dX"]
    view = kernel_view(prog)
    assert [n for n, _ in view.inputs] == ["A", "B", "bias", "dC"]  # X recomputed, not read
    assert k.output.dtype == "f16" and prog.tensor_type("dX").dtype == "f16"
    plan = match(k, MAPPING)
    assert sorted(t.name for t in plan.epilogue.tensors) == ["bias", "dC"]
    assert layout(plan) == "NN"
    for name, want in (("dA", "NT"), ("dB", "TN")):
        prog, k = kernels[act, name]
        assert prog.tensor_type("dX").dtype == "f16"  # the stored dX, a tensor-core operand
        assert layout(match(k, MAPPING)) == want


def test_gelu_backward_gets_the_exact_tanh_and_its_forward_the_fast_one(kernels):
    body = match(kernels["gelu", "dX"][1], MAPPING).epilogue
    assert "tanhf(" in body.body and "derivc_tanh_approx" not in body.body and not body.helpers
    from compiler.derive import derive

    path = EX / "gemm_bias_gelu.yaml"
    d = derive(load_spec_file(path), str(path), check=False)
    fwd = match(lower(d.final, d.spec.name), MAPPING).epilogue
    assert "derivc_tanh_approx(" in fwd.body and fwd.helpers == ("tanh_approx",)


def _check_text(prog, k) -> dict:
    from codegen.build import print_checked
    from codegen.kernel_check import check_kernel_text

    return check_kernel_text(print_checked(k), prog, SIZES, seed=5)


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_fused_dX_kernel_runs_against_the_program(kernels, act):
    record = _check_text(*kernels[act, "dX"])
    assert record["passed"] and len(record["draws"]) >= 3
    assert all(r["tolerance"] == 2e-3 for r in record["draws"])  # an f16 output
    assert {r["draw"] for r in record["draws"] if r["sizes"] == SIZES} >= {"plain", "large"}


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_mutation_bias_at_the_row_in_the_recomputed_x_is_caught(kernels, act, monkeypatch):
    from codegen.kernel_check import KernelCheckError

    orig = epi_mod._Printer.read

    def at_row(self, r, guarded):  # bias[i] for bias[j]: the pre-activation of another column
        if r.tensor == "bias":
            r = Read("bias", tuple(a.subst("ji", Aff.of("ii")).subst("jo", Aff.of("io")) for a in r.idx))
        return orig(self, r, guarded)

    monkeypatch.setattr(epi_mod._Printer, "read", at_row)
    with pytest.raises(KernelCheckError, match="disagrees with the spec"):
        _check_text(*kernels[act, "dX"])
