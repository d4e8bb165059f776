"""The cross-entropy gradient derived from the spec (examples/cross_entropy_grad.yaml):
dX[r, c] = dloss[r] · (softmax(X)[r, c] − [c == T[r]]), 0 on ignored rows.

- GRAD finds the row max M a stabiliser (compiler/grad_shift.py: loss does not depend on M's
  value), so the gradient program has no indicator of the maximum (no gt, no second max);
  every stabiliser claim is checked against the float64 interpreter: moving the claimed
  definition by a random δ per index leaves the output unchanged, and a definition not claimed
  moves it (the negative cases);
- the gradient program in float64 against numpy and against central finite differences of the
  forward program, at widths with tails, with ignored rows, all-equal logits and logits ±1e4;
- the dX kernel (rowwise mapping) run through the CPU emulation against float64 on the same rows,
  at C = 50257 and, with `C: dynamic`, at widths 1, 7, 1000, 4097;
- every step of the backward kernel's derivation exports its obligation (coqc checks them in
  the build).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from codegen.emu import run_printed
from codegen.kir.lower import lower
from codegen.mappings import print_kernel
from compiler.derive_grad import derive_gradient, gradient_program
from compiler.grad_shift import stabilisers
from compiler.interp import run_program
from compiler.ir import Aff, Bin, Read, TensorType, walk
from compiler.lower_spec import lower_spec
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cross_entropy_grad.yaml"

pytestmark = pytest.mark.xdist_group("cross_entropy")


def _spec(tmp: Path, C: int | str, statements: list[str] | None = None) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["sizes"]["C"] = C
    if C == "dynamic":
        doc["check_sizes"] = {"R": 2, "C": 1001}
    if statements is not None:
        doc["statements"] = statements
        doc.pop("schedule")
        doc["grad"]["kernels"] = [{"output": "dX", "schedule": []}]
    path = tmp / f"ce_{C}_{abs(hash(str(statements)))}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# --------------------------------------------------------------------------- rows


def _rows(C: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Six rows: random logits, an ignored row (T = -100), all-equal logits, logits ±1e4 (one
    large winner; the target on a loser), a row whose target is its last column, random again."""
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((6, C)) * 4).astype(np.float16).astype(np.float64)
    X[2] = 3.0
    X[3] = np.where(rng.random(C) < 0.5, -1e4, 1e4).astype(np.float16)
    X[3, C // 2] = 1e4
    T = rng.integers(0, C, 6).astype(np.float64)
    T[1] = -100
    T[3] = int(np.argmin(X[3]))
    T[4] = C - 1
    dloss = rng.standard_normal(6).astype(np.float32).astype(np.float64)
    return X, T, dloss


def _reference(X, T, dloss):
    m = X.max(axis=1, keepdims=True)
    e = np.exp(X - m)
    p = e / e.sum(axis=1, keepdims=True)
    rows = np.arange(X.shape[0])
    hot = np.zeros_like(X)
    keep = T >= 0
    hot[rows[keep], T[keep].astype(int)] = 1.0
    return (p - hot) * np.where(keep, dloss, 0.0)[:, None]


@pytest.fixture(scope="module")
def programs():
    ir0, gradient = gradient_program(load_spec_file(EXAMPLE), str(EXAMPLE))
    return ir0, gradient


def test_the_row_max_is_a_stabiliser_and_leaves_no_indicator(programs):
    _, gradient = programs
    assert gradient.stabilisers == ("M",)
    dx = gradient.program.def_named("dX")
    ops = {e.op for e in walk(dx.body) if isinstance(e, Bin)}
    assert "gt" not in ops
    assert not any(d.name.startswith("dM") for d in gradient.program.defs)


@pytest.mark.parametrize("C", [1, 7, 1000, 4097])
def test_gradient_program_in_float64(programs, C):
    _, gradient = programs
    X, T, dloss = _rows(C, seed=C)
    got = run_program(gradient.program, {"R": 6, "C": C}, {"X": X, "T": T, "dloss": dloss})["dX"]
    want = _reference(X, T, dloss)
    assert np.abs(got - want).max() <= 1e-12 * max(1.0, np.abs(dloss).max())
    assert np.all(got[1] == 0.0)  # the ignored row


@pytest.mark.parametrize("C", [1, 7, 33])
def test_gradient_program_against_finite_differences(programs, C):
    ir0, gradient = programs
    X, T, dloss = _rows(C, seed=3 * C)
    X[3] = np.random.default_rng(C).standard_normal(C) * 30  # finite differences need a smooth row
    sizes = {"R": 6, "C": C}
    got = run_program(gradient.program, sizes, {"X": X, "T": T, "dloss": dloss})["dX"]
    h = 1e-5
    fd = np.zeros_like(X)
    for r in range(6):
        for c in range(C):
            up, down = X.copy(), X.copy()
            up[r, c] += h
            down[r, c] -= h
            f = [run_program(ir0, sizes, {"X": x, "T": T})["loss"] @ dloss for x in (up, down)]
            fd[r, c] = (f[0] - f[1]) / (2 * h)
    assert np.abs(got - fd).max() <= 1e-6 * max(1.0, np.abs(dloss).max())


# --------------------------------------------------------------------------- stabilisers, numerically

_CE = ["M[r] = max(k: X[r, k])", "L[r] = sum(k: exp(X[r, k] - M[r]))"]
# statements -> the definitions claimed to be stabilisers, and whether moving M moves the output
STABILISER_CASES = [
    (_CE + ["loss[r] = where(T[r] >= 0, M[r] + log(L[r]) - X[r, T[r]], 0)"], ("M",), False),
    (_CE + ["loss[r] = log(L[r]) + M[r]"], ("M",), False),
    (_CE + ["loss[r] = sum(k: exp(X[r, k] - M[r]) / L[r] * X[r, k])"], ("M",), False),  # the softmax's mean
    (_CE + ["loss[r] = M[r] - log(L[r])"], (), True),  # the sign of the log
    (_CE + ["loss[r] = M[r] + log(L[r] + 1)"], (), True),  # a term that does not scale
    (_CE + ["loss[r] = M[r] + log(L[r]) + M[r]"], (), True),
    (_CE + ["loss[r] = tanh(M[r]) + log(L[r])"], (), True),
    (_CE + ["loss[r] = M[r] + log(L[r] * L[r])"], (), True),  # scales twice
    (_CE + ["loss[r] = M[r] + log(L[0])"], (), True),  # δ at another row
    (_CE + ["loss[r] = gt(M[r], 1) + M[r] + log(L[r])"], (), True),  # a step of M alone
    (_CE + ["loss[r] = where(T[r] >= 0, M[r], 0) + log(L[r])"], (), True),  # 0 does not move with M
    (_CE + ["loss[r] = sum(k: X[r, k] - M[r]) + M[r]"], (), True),  # C shifts summed, not one
    (_CE + ["loss[r] = sum(q: exp(X[q, 0] - M[q])) / sum(q: exp(X[q, 1] - M[q])) + X[r, 0]"], (), True),  # δ runs with q
    (["M[r] = max(k: X[r, k])", "L[r] = sum(k: exp(X[r, k] - M[r]) * exp(X[r, k] - M[r]))",
      "loss[r] = M[r] + log(L[r])"], (), True),
    # invariant, but halves are not followed: differentiated as usual (refused, not wrong)
    (["M[r] = max(k: X[r, k])", "L[r] = sum(k: exp(X[r, k] - M[r]) * exp(X[r, k] - M[r]))",
      "loss[r] = M[r] + log(L[r]) / 2"], (), False),
]


def _moved_output(ir0, name: str, sizes: dict[str, int], inputs: dict[str, np.ndarray], delta: np.ndarray):
    """The output when definition `name` is moved by δ at its index (δ an extra input)."""
    d = ir0.def_named(name)
    moved = replace(d, body=Bin("+", d.body, Read("Delta", tuple(Aff.of(lp.var) for lp in d.loops))))
    prog = replace(ir0.with_def(moved), inputs=ir0.inputs + (("Delta", TensorType(d.type.dims, "f32")),))
    with np.errstate(all="ignore"):
        return run_program(prog, sizes, {**inputs, "Delta": delta})[ir0.output]


@pytest.mark.parametrize("statements,claimed,moves", STABILISER_CASES, ids=[s[-1] for s, _, _ in STABILISER_CASES])
def test_a_stabiliser_claim_is_exact_and_the_others_move_the_output(tmp_path, statements, claimed, moves):
    ir0 = lower_spec(load_spec_file(_spec(tmp_path, 5, statements)))
    assert stabilisers(ir0, "loss") == claimed
    rng = np.random.default_rng(7)
    inputs = {"X": rng.standard_normal((4, 5)) * 2, "T": np.array([0.0, 4.0, -100.0, 2.0])}
    sizes = {"R": 4, "C": 5}
    base = _moved_output(ir0, "M", sizes, inputs, np.zeros(4))
    moved = _moved_output(ir0, "M", sizes, inputs, rng.standard_normal(4) * 3 - 10)
    change = np.abs(moved - base).max()
    assert change > 1e-6 if moves else change <= 1e-12 * max(1.0, np.abs(base).max())


# --------------------------------------------------------------------------- the kernel


@pytest.fixture(scope="module")
def dx_kernels(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ceg")
    out = {}
    for C in (50257, "dynamic"):
        path = _spec(tmp, C)
        g = derive_gradient(load_spec_file(path), str(path), seed=2)
        (dx,) = g.kernels
        out[C] = (dx, print_kernel(lower(dx.final, "ce_dx"), ()))
    return out


@pytest.mark.parametrize("C", [50257, 1, 7, 1000, 4097])
def test_dx_kernel_against_float64(dx_kernels, C):
    _, printed = dx_kernels[50257 if C == 50257 else "dynamic"]
    assert printed.mapping == "rowwise"
    X, T, dloss = _rows(C, seed=C + 1)
    named = {"X": X, "T": T, "dloss": dloss}
    args = [named[t.name] for t in printed.kernel.inputs]
    got = np.asarray(run_printed(printed, 0, args, {}), dtype=np.float64)
    want = _reference(X, T, dloss)
    assert np.abs(got - want).max() <= 2e-3 * np.abs(dloss).max()  # f16 gradient
    assert np.all(got[1] == 0.0)


def test_dx_kernel_computes_one_max_per_row(dx_kernels):
    dx, _ = dx_kernels[50257]
    maxes = [e for d in dx.final.defs for e in walk(d.body) if getattr(e, "op", "") == "max"]
    assert len(maxes) == 1


def test_every_backward_step_exports_its_obligation(dx_kernels):
    from compiler.obligations import obligation_for
    from compiler.obligations_base import coq_text

    dx, _ = dx_kernels[50257]
    for rec, before, after in zip(dx.steps, dx.programs, dx.programs[1:]):
        assert coq_text(obligation_for(rec, before, after)), rec.rule
