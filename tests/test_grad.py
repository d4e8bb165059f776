"""GRAD: the gradient program against central finite differences, on generated specs.

Every construct a spec may use has a derivative rule; each appears in the generated statements
below, and each rule's mutation (a wrong derivative) must be caught by the finite-difference
check.  The check itself must fail on a wrong gradient program."""
from __future__ import annotations

import random

import numpy as np
import pytest

from compiler import grad as grad_mod
from compiler.derive import choose_check_sizes
from compiler.draws import plan_draws
from compiler.errors import DerivationError, SpecError
from compiler.grad import differentiate
from compiler.grad_check import check_gradient
from compiler.interp import run_program
from compiler.ir import Bin, Const, Read
from compiler.lower_spec import lower_spec
from compiler.spec import parse_spec_text
from tests.conftest import spec_yaml

ROW = {"sizes": {"R": "dynamic", "C": 13}, "inputs": {"X": {"shape": ["R", "C"], "dtype": "f32"},
                                                      "W": {"shape": ["C"], "dtype": "f32"}},
       "check_sizes": {"R": 3}}

# (statements, wrt): every construct with a derivative rule, alone and mixed
ROW_CASES = [
    (["Y[r, c] = exp(X[r, c]) * W[c]"], ["X", "W"]),
    (["Y[r, c] = log(X[r, c] * X[r, c] + 1) / (W[c] * W[c] + 2)"], ["X", "W"]),
    (["Y[r, c] = sqrt(X[r, c] * X[r, c] + 0.5) - rsqrt(W[c] * W[c] + 0.25)"], ["X", "W"]),
    (["Y[r, c] = tanh(X[r, c]) + erf(W[c] * X[r, c])"], ["X", "W"]),
    (["Y[r, c] = max(X[r, c], W[c]) * max(X[r, c], 0)"], ["X", "W"]),
    (["M[r] = max(k: X[r, k])", "Y[r, c] = exp(X[r, c] - M[r]) * W[c]"], ["X", "W"]),
    (["Y[r, c] = where(c < 5, X[r, c], W[c] * X[r, c]) + where(c >= 7 && c < 11, W[c], 0)"], ["X", "W"]),
    (["Y[r, c] = X[r, c] * (c - r) / C + W[c]"], ["X", "W"]),
    (["Y[r, c] = sum(k | k <= c: X[r, k] * W[k]) - X[r, c]"], ["X", "W"]),
    (["Y[r, c] = softmax(c | c <= r + 4: X[r, c] * W[c])"], ["X", "W"]),
    (["Y[r, c] = softmax(c: X[r, c]) * W[c] + softmax(c | c > 2: W[c] * X[r, c])"], ["X", "W"]),
    (["S[r] = rsqrt(sum(k: X[r, k] * X[r, k]) / C + 0.001)", "Y[r, c] = X[r, c] * S[r] * W[c]"], ["X", "W"]),
    (["mean[r] = sum(k: X[r, k]) / C", "var[r] = sum(k: (X[r, k] - mean[r]) * (X[r, k] - mean[r])) / C",
      "Y[r, c] = (X[r, c] - mean[r]) * rsqrt(var[r] + 0.001) * W[c]"], ["X", "W"]),
    (["Y[r, c] = X[r, c] * W[c]"], ["W"]),  # X not differentiated
    (["Z[c] = W[c] * 2", "Y[r, c] = X[r, c] + 1"], ["W"]),  # the output does not depend on W
]


def _gradient(doc: dict, wrt: list[str], seed: int = 1):
    spec = parse_spec_text(spec_yaml(doc))
    ir0 = lower_spec(spec)
    g = differentiate(ir0, spec.output.tensor, wrt, "d" + spec.output.tensor)
    sizes = choose_check_sizes(spec, ir0, [ir0], [])
    return ir0, g, plan_draws(ir0, sizes, seed)


def _row_doc(statements: list[str]) -> dict:
    out = statements[-1].split("[")[0]
    return {**ROW, "name": "g", "statements": statements, "output": {"tensor": out, "dtype": "f32"}}


@pytest.mark.parametrize("statements,wrt", ROW_CASES, ids=[c[0][-1][:40] for c in ROW_CASES])
def test_row_constructs_match_finite_differences(statements, wrt):
    ir0, g, plan = _gradient(_row_doc(statements), wrt)
    records = check_gradient(ir0, g, plan, 11)
    assert all(e <= 1e-6 for r in records for e in r["rel_error"].values())


def test_unused_input_has_zero_gradient():
    ir0, g, plan = _gradient(_row_doc(["Z[c] = W[c] * 2", "Y[r, c] = X[r, c] + 1"]), ["W", "X"])
    draw = plan.draws(3)[0]
    got = run_program(g.program, draw.sizes, {**draw.inputs(ir0), "dY": np.ones((3, 13))})
    assert np.all(got["dW"] == 0) and np.all(got["dX"] == 1)


def _attention(mask: str | None, rng: random.Random, layout: str = "bhnd") -> dict:
    guard = f" | {mask}" if mask else ""
    idx = {"bhnd": ("b, h, {}, e", ["B", "H", "N", "D"]), "bnhd": ("b, {}, h, e", ["B", "N", "H", "D"])}[layout]
    q, shape = idx
    return {
        "name": "att", "sizes": {"B": "dynamic", "H": "dynamic", "N": "dynamic", "D": rng.choice([3, 8])},
        "inputs": {t: {"shape": shape, "dtype": "f16"} for t in ("Q", "K", "V")} | {"Bias": {"shape": ["N"], "dtype": "f32"}},
        "params": {"scale": "1/sqrt(D)"},
        "statements": [
            f"S[b, h, i, j] = scale * sum(e: Q[{q.format('i')}] * K[{q.format('j')}]) + Bias[j] * (i - j) / N",
            f"P[b, h, i, j] = softmax(j{guard}: S[b, h, i, j])",
            f"O[b, h, i, e] = sum(j: P[b, h, i, j] * V[{q.format('j')}])",
        ],
        "output": {"tensor": "O", "dtype": "f16"},
        "check_sizes": {"B": 1, "H": 2, "N": rng.choice([5, 9, 17])},
    }


MASKS = [None, "j <= i", "j < i", "i >= j", "i > j", "i <= j", "j <= i && i < j + 3", "i == j", "j < N - 2",
         "i - j >= 2 && j > 1"]


@pytest.mark.parametrize("mask", MASKS)
def test_attention_masks_match_finite_differences(mask):
    rng = random.Random(hash(mask) % 1000)
    ir0, g, plan = _gradient(_attention(mask, rng, rng.choice(["bhnd", "bnhd"])), ["Q", "K", "V", "Bias"])
    records = check_gradient(ir0, g, plan, 5)
    assert {r["draw"] for r in records} >= {"plain", "large"}


def test_fully_masked_rows_give_zero_gradients():
    """Rows with no live key (i - j >= 2 leaves rows 0 and 1 empty): zero gradients, no NaN."""
    ir0, g, plan = _gradient(_attention("i - j >= 2", random.Random(0)), ["Q", "K", "V"])
    draw = plan.draws(7)[0]
    inputs = draw.inputs(ir0)
    dO = np.random.default_rng(0).standard_normal(run_program(ir0, draw.sizes, inputs)["O"].shape)
    got = run_program(g.program, draw.sizes, {**inputs, "dO": dO})
    for name in ("dQ", "dK", "dV"):
        assert np.all(np.isfinite(got[name]))
    assert np.all(got["dQ"][:, :, :2] == 0)


# --------------------------------------------------------------------------- the check has teeth

WRONG_UNARY = {
    "exp": lambda e, v: Const(1.0), "log": lambda e, v: v, "sqrt": lambda e, v: Const(0.5),
    "rsqrt": lambda e, v: Bin("*", Const(-0.5), v), "tanh": lambda e, v: Const(1.0), "erf": lambda e, v: Const(1.0),
}


@pytest.mark.parametrize("op", sorted(WRONG_UNARY))
def test_a_wrong_unary_derivative_is_caught(monkeypatch, op):
    original = grad_mod._Differentiator.unary_derivative

    def mutated(self, e, value):
        return WRONG_UNARY[op](e, value) if e.op == op else original(self, e, value)

    monkeypatch.setattr(grad_mod._Differentiator, "unary_derivative", mutated)
    case = next(c for c in ROW_CASES if f"{op}(" in " ".join(c[0]))
    ir0, g, plan = _gradient(_row_doc(case[0]), case[1])
    with pytest.raises(DerivationError, match="central differences"):
        check_gradient(ir0, g, plan, 11)


@pytest.mark.parametrize("op", ["*", "/", "-", "max"])
def test_a_wrong_binary_derivative_is_caught(monkeypatch, op):
    original = grad_mod._Differentiator.binary

    def mutated(self, e, adj, binders, site, out):
        if e.op == op:  # the second operand's adjoint dropped
            self.back(e.a, adj if op != "max" else adj, binders, site, out)
            return
        original(self, e, adj, binders, site, out)

    monkeypatch.setattr(grad_mod._Differentiator, "binary", mutated)
    statements = {"*": ["Y[r, c] = X[r, c] * W[c]"], "/": ["Y[r, c] = X[r, c] / (W[c] * W[c] + 1)"],
                  "-": ["Y[r, c] = X[r, c] - W[c] * X[r, c]"], "max": ["Y[r, c] = max(X[r, c], W[c])"]}[op]
    ir0, g, plan = _gradient(_row_doc(statements), ["X", "W"])
    with pytest.raises(DerivationError, match="central differences"):
        check_gradient(ir0, g, plan, 11)


def test_a_softmax_vjp_without_the_row_term_is_caught(monkeypatch):
    monkeypatch.setattr(grad_mod, "sub", lambda a, b: a)  # every a - b loses b: the row term goes
    ir0, g, plan = _gradient(_attention("j <= i", random.Random(1)), ["Q"])
    with pytest.raises(DerivationError, match="central differences"):
        check_gradient(ir0, g, plan, 5)


def test_a_wrong_gradient_program_is_caught():
    ir0, g, plan = _gradient(_row_doc(["Y[r, c] = exp(X[r, c]) * W[c]"]), ["X", "W"])
    from dataclasses import replace

    dx = g.program.def_named("dX")
    bad = replace(g, program=g.program.with_def(replace(dx, body=Bin("*", Const(1.001), dx.body))))
    with pytest.raises(DerivationError, match="dY/dX"):
        check_gradient(ir0, bad, plan, 11)


# --------------------------------------------------------------------------- refusals


def test_unknown_wrt_and_of_are_named():
    spec = parse_spec_text(spec_yaml(_row_doc(["Y[r, c] = X[r, c] * W[c]"])))
    ir0 = lower_spec(spec)
    with pytest.raises(DerivationError, match="grad.wrt: Z is not an input"):
        differentiate(ir0, "Y", ["Z"], "dY")
    with pytest.raises(DerivationError, match="grad.of: Q is not a definition"):
        differentiate(ir0, "Q", ["X"], "dY")
    with pytest.raises(DerivationError, match="seed: the name X is already used"):
        differentiate(ir0, "Y", ["X"], "X")


def test_grad_section_is_validated():
    doc = _row_doc(["Y[r, c] = X[r, c] * W[c]"])
    with pytest.raises(SpecError, match="grad.kernels"):
        parse_spec_text(spec_yaml({**doc, "grad": {"of": "Y", "wrt": ["X"], "kernels": []}}))
    with pytest.raises(SpecError, match="unknown field"):
        parse_spec_text(spec_yaml({**doc, "grad": {"of": "Y", "wrt": ["X"], "kernel": []}}))
