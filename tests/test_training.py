"""The training runtime (codegen.training) on the CPU: a build with gradients (a `grad:` spec) loaded and checked
(the manifest, every backward kernel), forward and backward run through the emulation against
the float64 gradient, and one clear error for each way a manifest or a kernel directory is wrong."""
from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import trainkit  # noqa: E402

pytestmark = pytest.mark.xdist_group("training")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return trainkit.build_softmax_training(tmp_path_factory.mktemp("train"), "f32")


@pytest.fixture
def copy_of(built, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(built, out)
    return out


def load(out: Path):
    import derivc
    return derivc.load_training(out, device="emu")


def test_emu_forward_and_backward_match_float64(built):
    t = load(built)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, trainkit.C)).astype(np.float32) * 2
    dy = rng.standard_normal((5, trainkit.C)).astype(np.float32)
    y, saved = t.forward_with_saved(X=x)
    assert set(saved) == {"X", "Y"} and saved["Y"] is y
    grads = t.backward(saved, dy)
    assert set(grads) == {"X"}
    x64 = x.astype(np.float64)
    p = np.exp(x64 - x64.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert np.abs(y - p).max() < 1e-6
    ref = trainkit.softmax_grad_fd(x, dy)
    closed = p * (dy - (p * dy).sum(axis=1, keepdims=True))
    assert np.abs(ref - closed).max() < 1e-8 * np.abs(closed).max()  # the reference is right
    err = np.linalg.norm(grads["X"] - ref) / np.linalg.norm(ref)
    assert err < 1e-5, err
    assert np.array_equal(t.forward(X=x), y)


def test_emu_f16_build_gradient_within_the_f16_tolerance(tmp_path):
    """Inputs, output and gradient in f16, the row term D in f32: dtypes as the manifest says."""
    t = load(trainkit.build_softmax_training(tmp_path, "f16"))
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((7, trainkit.C)) * 2).astype(np.float16)
    dy = rng.standard_normal((7, trainkit.C)).astype(np.float16)
    y, saved = t.forward_with_saved(X=x)
    g = t.backward(saved, dy)["X"]
    assert g.dtype == np.float16 and g.shape == x.shape
    ref = trainkit.softmax_grad_fd(x, dy, "f16")
    assert np.linalg.norm(g - ref) / np.linalg.norm(ref) < 2e-3


def test_names_and_shapes_checked_at_a_call(built):
    t = load(built)
    x = np.zeros((2, trainkit.C), np.float32)
    with pytest.raises(ValueError, match="Z: not an input"):
        t.forward(X=x, Z=x)
    with pytest.raises(ValueError, match="missing input X"):
        t.forward()
    y, saved = t.forward_with_saved(X=x)
    with pytest.raises(ValueError, match=r"seed dY: shape \(3, 128\), expected \(2, 128\)"):
        t.backward(saved, np.zeros((3, trainkit.C), np.float32))
    with pytest.raises(ValueError, match="saved lacks Y"):
        t.backward({"X": x}, y)


def test_op_name_names_the_spec_and_the_build(built, copy_of):
    a, b = load(built), load(copy_of)
    assert a.name == b.name and a.name.startswith("softmax_rows_grad_f32_")
    (copy_of / "grad.json").write_text((copy_of / "grad.json").read_text() + " ")
    assert load(copy_of).name != a.name


def _edit(out: Path, change) -> None:
    m = trainkit.read_manifest(out)
    change(m)
    trainkit.write_manifest(out, m)


def _kernel(m, name):
    return next(k for k in m["kernels"] if k["name"] == name)


BAD_MANIFESTS = {
    "unknown input": (lambda m: _kernel(m, "dX")["inputs"].append("Z"),
                      "kernel dX.inputs: Z is none of the forward inputs"),
    "wrong order": (lambda m: m["kernels"].reverse(),
                    "kernel dX.inputs: D is the output of kernel D, which runs later"),
    "output not saved": (lambda m: m.update(saved=[]), "kernel D.inputs: Y is the forward output but not listed in saved"),
    "no gradient kernel": (lambda m: m["kernels"].pop(), "grads.X: no kernel produces dX"),
    "wrt not an input": (lambda m: m.update(wrt=["X", "W"], grads={"X": "dX", "W": "dW"}),
                         "wrt: W is not an input of the forward build"),
    "grads without wrt": (lambda m: m["grads"].update(W="dW"), r"grads.W: W is not in wrt \(X\)"),
    "of": (lambda m: m.update(of="O"), r"of: O is not the forward build's output \(Y\)"),
    "seed clash": (lambda m: m.update(seed="X"), "seed: X is already a tensor"),
    "unknown field": (lambda m: m.update(extra=1), "the manifest: unknown field 'extra'"),
    "missing field": (lambda m: m.pop("saved"), "the manifest: missing field 'saved'"),
    "bad dtype": (lambda m: _kernel(m, "D").update(dtype="f8"), "kernel D.dtype: 'f8' is not a dtype"),
    "gradient dtype": (lambda m: _kernel(m, "dX").update(dtype="f16"),
                       r"kernel dX: dX is f16 \[R, C\] but X is f32 \[R, C\]"),
    "duplicate input": (lambda m: _kernel(m, "D")["inputs"].append("Y"), "kernel D.inputs: Y is listed twice"),
    "missing kernel": (lambda m: _kernel(m, "D").update(dir="grad/nope"), r"grad/nope: does not exist"),
    "dir outside": (lambda m: _kernel(m, "D").update(dir="../x"), r"kernel D.dir: ../x is not inside"),
    "inputs differ from the kernel's": (lambda m: _kernel(m, "dX")["inputs"].remove("D"),
                                        "kernel dX .*: the kernel's inputs are dY, Y, D, the manifest lists dY, Y"),
    "output dtype differs from the kernel's": (lambda m: _kernel(m, "D").update(dtype="f16"),
                                               r"kernel D .*: the kernel's output D is f32 \[R\], the manifest says f16 \[R\]"),
    "output shape differs from the kernel's": (lambda m: _kernel(m, "D").update(shape=["C"]),
                                               r"the kernel's output D is f32 \[R\], the manifest says f32 \[C\]"),
    "further output the kernel does not write": (
        lambda m: _kernel(m, "D").update(also=[{"name": "Z", "dtype": "f32", "shape": ["R"]}]),
        r"kernel D .*: the kernel's outputs are D, the manifest says D, Z"),
    "further output with an unknown field": (
        lambda m: _kernel(m, "D").update(also=[{"name": "Z", "dtype": "f32", "shape": ["R"], "x": 1}]),
        r"kernel D.also\[0\]: unknown field 'x'"),
    "further output written twice": (
        lambda m: _kernel(m, "D").update(also=[{"name": "dX", "dtype": "f32", "shape": ["R", "C"]}]),
        r"kernel dX.output: dX is already a tensor of the build"),
    "dir of another kernel": (lambda m: _kernel(m, "D").update(dir="grad/dX"),
                              "kernel D .*: the kernel's inputs are dY, Y, D, the manifest lists dY, Y"),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_bad_manifest_is_one_clear_error(copy_of, case):
    change, message = BAD_MANIFESTS[case]
    _edit(copy_of, change)
    with pytest.raises(ValueError, match=message) as exc:
        load(copy_of)
    assert str(exc.value).startswith(str(copy_of)), exc.value  # names the file (or the directory)
    assert "\n" not in str(exc.value)


def test_kernel_reading_a_tensor_of_another_dtype_is_refused(copy_of):
    """The D kernel is fine but the manifest says D is f16: dX reads D as f32."""
    def change(m):
        _kernel(m, "D").update(dtype="f16")
    _edit(copy_of, change)
    with pytest.raises(ValueError, match="the manifest says f16"):
        load(copy_of)


def test_no_manifest_not_json_no_marker_tampered_kernel(copy_of):
    import derivc

    manifest = trainkit.read_manifest(copy_of)
    (copy_of / "grad.json").write_text("{")
    with pytest.raises(ValueError, match="grad.json: not valid JSON"):
        load(copy_of)
    (copy_of / "grad.json").unlink()
    with pytest.raises(ValueError, match="grad.json: not found .*no grad: section"):
        load(copy_of)
    trainkit.write_manifest(copy_of, manifest)
    (copy_of / "grad" / "D" / ".derivc-build").unlink()
    with pytest.raises(ValueError, match=r"grad/D: has no \.derivc-build"):
        load(copy_of)
    shutil.copy(copy_of / "grad" / "dX" / ".derivc-build", copy_of / "grad" / "D")
    cu = copy_of / "grad" / "D" / "kernel.cu"
    cu.write_text(cu.read_text().replace("+", "-", 1))
    with pytest.raises(ValueError, match="grad/D/kernel.cu: differs from the kernel the derivation gives"):
        load(copy_of)
    with pytest.raises(ValueError, match="device 'cpu'"):
        derivc.load_training(copy_of, device="cpu")


def test_as_torch_needs_cuda(built):
    with pytest.raises(ValueError, match="as_torch needs device 'cuda'"):
        load(built).as_torch()


def test_manifest_problems_found_before_the_kernels_run(copy_of):
    """Order errors are found on the manifest alone: nothing is emulated."""
    m = trainkit.read_manifest(copy_of)
    m["kernels"] = [copy.deepcopy(m["kernels"][1]), copy.deepcopy(m["kernels"][0])]
    trainkit.write_manifest(copy_of, m)
    shutil.rmtree(copy_of / "grad")
    with pytest.raises(ValueError, match="runs later"):
        load(copy_of)
