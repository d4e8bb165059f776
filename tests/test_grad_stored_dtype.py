"""grad.kernels' `dtype`: a backward kernel stores its output narrower than the gradient program
(an f32 intermediate in f16), the later kernels read the rounded tensor, the manifest and the
runtime carry the stored dtype, the reports say it is a storage choice validated numerically."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import yaml

from tests import trainkit
from tests.conftest import assert_fails

pytestmark = pytest.mark.xdist_group("training")


def _doc(d_dtype: str | None = "f16", dx_dtype: str | None = None) -> dict:
    doc = copy.deepcopy(trainkit.spec("f32"))
    kernels = doc["grad"]["kernels"]
    if d_dtype is not None:
        kernels[0]["dtype"] = d_dtype
    if dx_dtype is not None:
        kernels[1]["dtype"] = dx_dtype
    return doc


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The f32 softmax backward with its row term D stored in f16."""
    from compiler.cli import build_to

    root = tmp_path_factory.mktemp("stored")
    path = root / "softmax_d16.yaml"
    path.write_text(yaml.safe_dump(_doc(), sort_keys=False))
    build_to(path, root / "out", seed=1, proofs=False)
    return root / "out"


def test_the_writer_stores_and_the_reader_reads_the_stored_dtype(built):
    m = trainkit.read_manifest(built)
    assert [(k["name"], k["dtype"]) for k in m["kernels"]] == [("D", "f16"), ("dX", "f32")]
    assert "D[R] : f16 @global (read from kernel D)" in (built / "grad/dX/program.txt").read_text()
    writer = json.loads((built / "grad/D/derivation.json").read_text())
    assert writer["grad_kernel"]["stored"] == [{"tensor": "D", "dtype": "f16", "program_dtype": "f32",
                                                "written_by": ""}]
    reader = json.loads((built / "grad/dX/derivation.json").read_text())
    assert reader["grad_kernel"]["stored"][0]["written_by"] == "kernel D"
    for k in ("D", "dX"):
        report = (built / f"grad/{k}/report.md").read_text()
        assert "`D` is stored in f16" in report and "storage choice" in report and "validated numerically" in report
    # the printed kernels: D's writes an f16 tensor, dX's reads one
    assert "f16_t* __restrict__ p_D, int" in (built / "grad/D/kernel.cu").read_text()
    assert "const f16_t* __restrict__ p_D," in (built / "grad/dX/kernel.cu").read_text()
    kernel_check = [s for s in reader["steps"] if s["rule"] == "kernel"][0]
    assert kernel_check["numeric"]["passed"]


def test_the_runtime_runs_the_rounded_intermediate(built):
    """The emulated backward allocates nothing on the CPU but passes D (f16) to dX: the gradient is
    within f16's rounding of the float64 one, and not bit-equal to the f32 build's."""
    import derivc

    t = derivc.load_training(built, device="emu")
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, trainkit.C)) * 2).astype(np.float32)
    dy = rng.standard_normal((6, trainkit.C)).astype(np.float32)
    y, saved = t.forward_with_saved(X=x)
    g = t.backward(saved, dy)["X"]
    assert g.dtype == np.float32
    ref = trainkit.softmax_grad_fd(x, dy)
    err = np.linalg.norm(g - ref) / np.linalg.norm(ref)
    assert 1e-6 < err < 2e-3, err  # D's rounding shows, within f16's


def test_a_dtype_that_is_not_one_is_one_clear_error():
    assert_fails(yaml.safe_dump(_doc("f8")), 2, "grad.kernels[0].dtype", "f16")


def test_a_gradient_keeps_its_input_dtype():
    assert_fails(yaml.safe_dump(_doc(None, "f16")), 2, "grad.kernels[1].dtype", "gradient of X", "f32")
