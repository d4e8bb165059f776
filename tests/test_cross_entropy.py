"""Fused cross-entropy on the CPU: loss[r] = logsumexp_c X[r, c] - X[r, T[r]] with an i32 target
and its gather (examples/cross_entropy.yaml), and the gradient dX = dloss (softmax(X) - onehot(T)),
the target's logit written as a row sum against the gt-one-hot of an integer-valued f32 target
(examples/cross_entropy_grad.yaml; its own tests: tests/test_cross_entropy_grad.py).

- the forward and the dX kernel are printed by the rowwise mapping (a row kernel that stores one
  value per row: no lane) and run through the CPU emulation with integer targets against numpy
  float64 at the vocabulary width 50257 and, with `C: dynamic`, at widths 1, 7, 1000, 4097;
- the spelling is exact: on integer targets the program is the gather (float64 interpreter);
- mutations caught: the ignore_index test off by one, the per-row store's tail guard dropped.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from codegen.emu import EmuError, run_printed
from codegen.kir.lower import lower
from codegen.mappings import print_kernel
from compiler.derive import derive
from compiler.derive_grad import derive_gradient
from compiler.interp import run_program
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = [1, 7, 1000, 4097]

pytestmark = pytest.mark.xdist_group("cross_entropy")


def _spec_file(tmp: Path, C: int | str, grad: bool) -> Path:
    source = ROOT / "examples" / "cross_entropy_grad.yaml" if grad else ROOT / "examples" / "cross_entropy.yaml"
    doc = yaml.safe_load(source.read_text())
    doc["sizes"]["C"] = C
    if C == "dynamic":
        doc["check_sizes"] = {"R": 2, "C": 1001}
    path = tmp / f"ce_{C}_{grad}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _data(R: int, C: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((R, C)) * 4).astype(np.float16).astype(np.float64)
    T = rng.integers(0, C, R).astype(np.float64)
    T[0] = 0  # the first column is a target (and, in the mutation test, the ignore bound's edge)
    dloss = rng.standard_normal(R).astype(np.float32).astype(np.float64)
    return X, T, dloss


def _reference(X, T, dloss):
    m = X.max(axis=1, keepdims=True)
    e = np.exp(X - m)
    lse = (m + np.log(e.sum(axis=1, keepdims=True)))[:, 0]
    rows = np.arange(X.shape[0])
    loss = lse - X[rows, T.astype(int)]
    dX = e / e.sum(axis=1, keepdims=True)
    dX[rows, T.astype(int)] -= 1.0
    return loss, dX * dloss[:, None]


def _forward(tmp: Path, C):
    path = _spec_file(tmp, C, grad=False)
    d = derive(load_spec_file(path), str(path), seed=2)
    return d, print_kernel(lower(d.programs[-1], "ce"), ())


def _backward(tmp: Path, C):
    path = _spec_file(tmp, C, grad=True)
    g = derive_gradient(load_spec_file(path), str(path), seed=2)
    (dx,) = g.kernels
    return dx, print_kernel(lower(dx.final, "ce_dx"), ())


def _run(printed, named: dict[str, np.ndarray], sizes: dict[str, int]) -> np.ndarray:
    args = [named[t.name] for t in printed.kernel.inputs]
    given = {n: sizes[n] for n in printed.kernel.dynamic() if n not in ("R", "C")}
    return np.asarray(run_printed(printed, 0, args, given), dtype=np.float64)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ce")
    return {C: (_forward(tmp, C)[1], _backward(tmp, C)[1]) for C in (50257, "dynamic")}


@pytest.mark.parametrize("C", [50257, *WIDTHS])
def test_forward_and_dx_kernels_are_the_cross_entropy(kernels, C):
    fwd, bwd = kernels[50257 if C == 50257 else "dynamic"]
    assert fwd.mapping == "rowwise" and bwd.mapping == "rowwise"
    X, T, dloss = _data(5, C, seed=C)
    loss, dX = _reference(X, T, dloss)
    got = _run(fwd, {"X": X, "T": T}, {"R": 5, "C": C})
    assert np.abs(got - loss).max() <= 1e-4 * max(1.0, np.abs(loss).max())
    got_dx = _run(bwd, {"X": X, "T": T, "dloss": dloss}, {"R": 5, "C": C})
    assert np.abs(got_dx - dX).max() <= 2e-3 * np.abs(dloss).max()  # f16 gradient


def test_the_spelling_is_the_gather_on_integer_targets(tmp_path):
    d, _ = _forward(tmp_path, 1000)
    X, T, dloss = _data(6, 1000, seed=9)
    loss, _ = _reference(X, T, dloss)
    for prog in (d.programs[0], d.programs[-1]):
        got = run_program(prog, {"R": 6, "C": 1000}, {"X": X, "T": T})["loss"]
        assert np.abs(got - loss).max() <= 1e-12 * np.abs(loss).max()


def test_an_ignore_index_off_by_one_is_caught(tmp_path):
    path = _spec_file(tmp_path, 1000, grad=False)
    text = path.read_text()
    assert "T[r] >= 0" in text
    path.write_text(text.replace("T[r] >= 0", "T[r] > 0"))
    d = derive(load_spec_file(path), str(path), seed=2)
    X, T, dloss = _data(6, 1000, seed=9)
    loss, _ = _reference(X, T, dloss)
    got = run_program(d.programs[0], {"R": 6, "C": 1000}, {"X": X, "T": T})["loss"]
    assert np.abs(got - loss).max() > 1e-3


def test_dropping_the_per_row_tail_guard_is_caught(tmp_path):
    from dataclasses import replace

    _, fwd = _forward(tmp_path, "dynamic")
    src = fwd.variants[0].source
    guard = "if (col0 < (long long)(sz_C)) {"
    assert guard in src.source
    mutated = replace(fwd, variants=(replace(fwd.variants[0], source=replace(src, source=src.source.replace(guard, "if (true) {"))),))
    X, T, dloss = _data(5, 7, seed=7)
    loss, _ = _reference(X, T, dloss)
    try:
        got = _run(mutated, {"X": X, "T": T}, {"R": 5, "C": 7})
    except EmuError:  # the emulation's bounds check: a read past the tensor
        return
    assert not np.abs(got - loss).max() <= 1e-4 * max(1.0, np.abs(loss).max())


def test_the_loss_exports_to_the_extended_reals(tmp_path):
    """(M + log L) - x with M a max (maybe -inf) is exported as eadd (eadd M (log L)) (neg x):
    every step's obligation is generated (coqc checks them: tests/test_obligations.py)."""
    from compiler.obligations import obligation_for
    from compiler.obligations_base import coq_text

    d, _ = _forward(tmp_path, 1000)
    for rec, before, after in zip(d.steps, d.programs, d.programs[1:]):
        text = coq_text(obligation_for(rec, before, after))
        assert "eadd" in text and "neg" in text, rec.rule
