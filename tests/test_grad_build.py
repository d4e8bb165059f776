"""`derivc build` / `derivc verify` of a spec with `grad:`: the layout, the records, the errors."""
from __future__ import annotations

import copy
import json

import pytest
import yaml

from tests import trainkit
from tests.conftest import assert_fails, run_cli


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("gradbuild")
    return trainkit.build_softmax_training(root, "f32")


def test_layout_and_manifest(built):
    m = trainkit.read_manifest(built)
    assert [k["name"] for k in m["kernels"]] == ["D", "dX"]
    assert m["saved"] == ["Y"] and m["grads"] == {"X": "dX"}
    for k in m["kernels"]:
        d = built / k["dir"]
        assert (d / "kernel.cu").is_file() and (d / ".derivc-build").is_file()
        trace = json.loads((d / "derivation.json").read_text())
        assert trace["grad_kernel"]["kernel"] == k["name"]
        assert trace["grad_kernel"]["grad"]["validated"] == "numerically"
        assert [s["rule"] for s in trace["steps"]][-2:] == ["lowering", "kernel"]
        report = (d / "report.md").read_text()
        assert "validated numerically, not proved" in report
    # the dX kernel reads D from the earlier kernel and Y from the forward: arguments, not recomputed
    dx = (built / "grad/dX/program.txt").read_text()
    assert "(read from kernel D)" in dx and "(read from forward)" in dx


def test_verify_rebuilds_the_backward(tmp_path):
    import shutil

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(trainkit.spec("f32"), sort_keys=False))
    out = tmp_path / "out"
    rc, _, err = run_cli(["build", str(spec), "-o", str(out)], proofs=True)
    assert rc == 0, err
    rc, _, err = run_cli(["verify", str(out)])
    assert rc in (0, 1), err  # 1: no coqc on this machine
    assert "grad/" not in err
    # an edited backward kernel is found
    copy_dir = tmp_path / "b"
    shutil.copytree(out, copy_dir)
    cu = copy_dir / "grad/dX/kernel.cu"
    cu.write_text(cu.read_text().replace("+", "-", 1))
    rc, _, err = run_cli(["verify", str(copy_dir)])
    assert rc != 0 and "grad/dX/kernel.cu" in err


def _doc(**grad):
    doc = copy.deepcopy(trainkit.spec("f32"))
    doc["grad"].update(grad)
    return doc


def test_unknown_kernel_output_is_named():
    doc = _doc(kernels=[{"output": "dQ", "schedule": []}])
    assert_fails(yaml.safe_dump(doc), 2, "grad.kernels[0].output", "'dQ'")


def test_a_gradient_without_a_kernel_is_named():
    doc = _doc(kernels=[{"output": "D", "schedule": []}])
    assert_fails(yaml.safe_dump(doc), 2, "grad.kernels", "no kernel writes dX")


def test_a_failing_kernel_step_names_the_kernel():
    doc = _doc()
    doc["grad"]["kernels"][1]["schedule"].insert(0, {"rule": "tile", "def": "dX", "index": "zz", "size": 4})
    assert_fails(yaml.safe_dump(doc), 2, "step 1", "grad.kernels[1]", "zz")


def test_unknown_wrt_is_refused():
    doc = _doc(wrt=["Nope"])
    assert_fails(yaml.safe_dump(doc), 3, "grad.wrt", "Nope")
