"""The step checks of a gradient program measure the error against the magnitude of the terms
(compiler/magnitude.py).  Bottom-right causal attention with NQ != NK (the large draw keeps NQ and
NK, so dQ = sum_j P (dP - D) K cancels to rounding on one-hot rows) derives under it and did not
under the output's norm; a dropped D, a wrong or slightly shifted LSE and a mask missing from the
recomputation still fail; M bounds how a perturbation of the inputs moves every tensor (first
order) and is not vacuous."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from compiler.derive import OUTPUT_SCALE, TERMS_SCALE, derive_program
from compiler.derive_grad import derive_gradient, gradient_program
from compiler.draws import plan_draws, reference
from compiler.errors import DerivationError
from compiler.interp import run_program
from compiler.ir import Bin, Const
from compiler.magnitude import magnitudes, terms_error
from compiler.rules import RULES
from compiler.spec import SpecFile, parse_spec_text

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "attention_bottom_right_causal_grad.yaml"
SIZES = {"more_queries": {"NQ": 37, "NK": 29}, "more_keys": {"NQ": 29, "NK": 37}}


def _spec(NQ: int, NK: int) -> SpecFile:  # noqa: N803 - the spec's size names
    text = EXAMPLE.read_text()
    old = "check_sizes: {B: 1, H: 1, NQ: 150, NK: 140}"
    assert old in text
    return parse_spec_text(text.replace(old, f"check_sizes: {{B: 1, H: 2, NQ: {NQ}, NK: {NK}}}"), str(EXAMPLE))


def _schedule_only(spec: SpecFile) -> SpecFile:
    """The spec without backward kernels: the mutations fail in grad.schedule, the tests stop there."""
    assert spec.grad is not None
    return spec.model_copy(update={"grad": spec.grad.model_copy(update={"kernels": []})})


@pytest.mark.parametrize("sizes", SIZES.values(), ids=list(SIZES))
def test_bottom_right_gradient_steps_pass_against_the_terms(sizes):
    g = derive_gradient(_spec(**sizes), str(EXAMPLE), seed=11)
    steps = list(g.shared.steps) + [s for k in g.kernels for s in k.steps]
    assert [s.rule for s in g.shared.steps] == ["recompute", "softmax_rowterm", "unfuse"]
    for s in steps:
        assert s.numeric["error_scale"] == TERMS_SCALE and s.numeric["rel_error"] <= 1e-12, s.rule
        assert {d["kind"] for d in s.numeric["draws"]} >= {"plain", "large"}
    large = next(d for d in g.shared.steps[0].numeric["draws"] if d["kind"] == "large")
    assert large.get("sizes", {}).get("NQ", sizes["NQ"]) == sizes["NQ"]  # the mask names NQ, NK: kept


def test_against_the_output_norm_the_same_steps_fail():
    """Why the scale: the cancellation of dQ is rounding-sized against dQ's own norm."""
    spec = _spec(37, 29)
    _, gradient = gradient_program(spec)
    with pytest.raises(DerivationError, match="relative error"):
        derive_program(spec, gradient.program, spec.grad.schedule, seed=1, error_scale=OUTPUT_SCALE)


# -- mutations: each still fails at 1e-12 of the terms' magnitude --------------------------------

def _wrapped_rewrite(monkeypatch, rule: str, change):
    r = RULES[rule]
    real = r.rewrite
    monkeypatch.setattr(r, "rewrite", lambda prog, p, facts: change(real(prog, p, facts)))


def _shift_lse(prog, by: float):
    lse = prog.def_named("LSE")
    return prog.with_def(replace(lse, body=Bin("+", lse.body, Const(by))))


def _drop_d(monkeypatch):
    r = RULES["softmax_rowterm"]
    real = r.check
    monkeypatch.setattr(r, "check", lambda prog, p: {**real(prog, p), "replacement": Const(0.0)})


def _no_mask(monkeypatch):
    from compiler.rules import recompute

    monkeypatch.setattr(recompute, "guarded", lambda mask, body, neutral: body)


def _no_log(monkeypatch):
    from compiler.rules import recompute

    real = recompute.Un
    monkeypatch.setattr(recompute, "Un", lambda op, a: a if op == "log" else real(op, a))


MUTATIONS = {
    "dropped_D": (_drop_d, "softmax_rowterm"),
    "mask_missing_in_recompute": (_no_mask, "recompute"),
    "LSE_without_log": (_no_log, "recompute"),
    "LSE_shifted_1e-9": (lambda mp: _wrapped_rewrite(mp, "recompute", lambda p: _shift_lse(p, 1e-9)), "recompute"),
}


@pytest.mark.parametrize("sizes", SIZES.values(), ids=list(SIZES))
@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_wrong_gradient_rewrite_still_fails(monkeypatch, mutation, sizes):
    mutate, rule = MUTATIONS[mutation]
    mutate(monkeypatch)
    with pytest.raises(DerivationError) as exc:
        derive_gradient(_schedule_only(_spec(**sizes)), str(EXAMPLE), seed=11)
    assert exc.value.rule == f"grad.schedule: {rule}" and "numeric check failed" in exc.value.reason, str(exc.value)


# -- the magnitude itself -----------------------------------------------------------------------

@pytest.fixture(scope="module", params=["GRAD", "scheduled"])
def gradient_draws(request):
    """A gradient program (GRAD's: softmax; after grad.schedule: exp, log, max, guards) and its
    inputs on the plain and large draws (NQ > NK)."""
    spec = _spec(37, 29)
    g0 = gradient_program(spec)[1].program
    prog = derive_program(spec, g0, spec.grad.schedule, check=False).final if request.param == "scheduled" else g0
    plan = plan_draws(g0, {"B": 1, "H": 2, "NQ": 37, "NK": 29, "D": 128}, 5)  # the draws of the steps
    out = []
    for draw in plan.draws(5)[:2]:
        draw, tensors, _ = reference(g0, draw, plan.degree)
        out.append((draw.sizes, {n: tensors[n] for n, _ in prog.inputs}))
    return prog, out


EPS = 1e-9


def _perturbation_ratios(prog, sizes, inputs) -> dict[str, tuple[float, float]]:
    """Per tensor: max |f(x (1 + EPS r)) - f(x)| / (EPS M) elementwise (r in [-1, 1]), and the same
    in norm; checks M >= |f| on the way."""
    from compiler.interp import _norm

    rng = np.random.default_rng(0)
    mags = magnitudes(prog, sizes, inputs)
    with np.errstate(all="ignore"):
        base = run_program(prog, sizes, inputs, contract=False)
        moved = run_program(prog, sizes, {n: x * (1 + EPS * rng.uniform(-1, 1, x.shape)) for n, x in inputs.items()},
                            contract=False)
    out = {}
    for d in prog.defs:
        finite = np.isfinite(base[d.name])
        with np.errstate(all="ignore"):  # -inf - -inf off the finite elements
            delta = np.abs(moved[d.name] - base[d.name])[finite]
        ref, m = base[d.name][finite], mags[d.name][finite]
        assert np.all(m >= np.abs(ref) * (1 - 1e-12)), d.name
        out[d.name] = (float((delta / np.maximum(EPS * m, 1e-300)).max(initial=0.0)), _norm(delta) / (EPS * _norm(m)))
    return out


def test_the_magnitude_bounds_a_first_order_perturbation(gradient_draws):
    """|f(x (1 + eps r)) - f(x)| <= eps M(f) for every tensor: M is the first-order condition of
    the float64 evaluation, each rule of the table an upper bound (measured <= 0.2); and not a
    vacuous one: the perturbation reaches 1e-5 of ‖eps M‖ in every tensor (measured 6e-5 .. 6e-2;
    rounding is independent per operation, a perturbation of the inputs moves S and LSE
    together; dQ's value is 2e-6 of ‖M‖ on the large draw: the cancellation)."""
    prog, draws = gradient_draws
    for sizes, inputs in draws:
        for name, (worst, in_norm) in _perturbation_ratios(prog, sizes, inputs).items():
            assert worst <= 1.0 + 1e-6, (name, worst)
            assert in_norm >= 1e-5, (name, in_norm)


def test_contracted_sums_give_the_elementwise_magnitudes(gradient_draws, monkeypatch):
    """A sum of a product is contracted (matrix products, as the interpreter does); M is the
    elementwise definition's to rounding, infinities and NaN in the same places."""
    from compiler import magnitude

    prog, draws = gradient_draws
    contracted = []
    original = magnitude._sum_of_product

    def counted(*args):
        out = original(*args)
        contracted.append(out is not None)
        return out

    for sizes, inputs in draws:
        monkeypatch.setattr(magnitude, "_sum_of_product", counted)
        fast = magnitudes(prog, sizes, inputs)
        monkeypatch.setattr(magnitude, "_sum_of_product", lambda *args: None)
        slow = magnitudes(prog, sizes, inputs)
        for name, m in slow.items():
            assert np.array_equal(np.isnan(fast[name]), np.isnan(m)), name
            assert np.array_equal(fast[name] == np.inf, m == np.inf), name
            finite = np.isfinite(m)
            assert np.allclose(fast[name][finite], m[finite], rtol=1e-9, atol=0), name
    assert any(contracted)


# every argument a difference of two inputs near 1000 (X = C - D in [0.5, 2], A = X - 1): its M is
# ~2000 x its value, so each function's M is all slope and a wrong slope shows
OPS_SPEC = {
    "name": "ops", "sizes": {"N": 512}, "inputs": {n: {"shape": ["N"], "dtype": "f32"} for n in "CDB"},
    "statements": ["X[i] = C[i] - D[i]", "A[i] = C[i] - D[i] - 1",
                   "Lg[i] = log(X[i])", "Qt[i] = A[i] / X[i]", "Rt[i] = sqrt(X[i])", "Rs[i] = rsqrt(X[i])",
                   "Th[i] = tanh(A[i])", "Ef[i] = erf(A[i])", "Ex[i] = exp(A[i])", "Mx[i] = max(A[i], B[i])",
                   "Y[i] = Lg[i] + Qt[i] + Rt[i] + Rs[i] + Th[i] + Ef[i] + Ex[i] + Mx[i] - A[i] * B[i]"],
    "output": {"tensor": "Y", "dtype": "f32"},
}


def test_each_function_of_the_table_is_a_tight_bound():
    """One function per tensor of an argument that is a cancellation (M ~2000 x its value): the
    perturbation stays under eps M and reaches 0.8 of it (a slope too small fails the first, one
    too large the second)."""
    import yaml

    from compiler.lower_spec import lower_spec

    prog = lower_spec(parse_spec_text(yaml.safe_dump(OPS_SPEC)))
    rng = np.random.default_rng(1)
    x = rng.uniform(0.5, 2.0, 512)
    inputs = {"C": 1000.0 + x, "D": np.full(512, 1000.0), "B": rng.standard_normal(512)}
    for name, (worst, _) in _perturbation_ratios(prog, {"N": 512}, inputs).items():
        assert worst <= 1.0 + 1e-6 and (name == "Y" or worst >= 0.8), (name, worst)


def test_terms_error_matches_infinities_exactly_and_refuses_nan():
    ref, mag = np.array([-np.inf, 1e-20, 2.0]), np.array([np.inf, 1.0, 2.0])
    assert terms_error(np.array([-np.inf, 0.0, 2.0]), ref, mag) < 1e-19
    assert terms_error(np.array([0.0, 0.0, 2.0]), ref, mag) == float("inf")
    assert terms_error(np.array([-np.inf, np.nan, 2.0]), ref, mag) == float("inf")
    assert terms_error(np.array([-np.inf, 1e-20]), ref, mag) == float("inf")
