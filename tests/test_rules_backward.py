"""RECOMPUTE and SOFTMAX-ROWTERM on gradient programs: property (every mask, layouts, large
logits, fully masked rows), negative (preconditions refuse by name) and mutation tests (a
rewrite that drops the mask, the log or the row term fails the numeric check)."""
from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from compiler.derive import checked_outputs
from compiler.errors import DerivationError
from compiler.grad import differentiate
from compiler.interp import rel_error, run_program
from compiler.ir import Bin, Read, Un, walk
from compiler.lower_spec import lower_spec
from compiler.rules import RULES
from compiler.spec import parse_spec_text
from tests.conftest import spec_yaml
from tests.test_grad import MASKS, _attention


def _gradient(mask: str | None, seed: int = 0, layout: str = "bhnd"):
    spec = parse_spec_text(spec_yaml(_attention(mask, random.Random(seed), layout)))
    return differentiate(lower_spec(spec), "O", ["Q", "K", "V", "Bias"], "dO").program


def _apply(prog, rule: str, **params):
    r = RULES[rule]
    p = r.parse_params(params)
    return r.rewrite(prog, p, r.check(prog, p))


def _max_error(before, after, sizes: dict[str, int], scale: float = 1.0, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, t in before.inputs:
        shape = tuple(a.evaluate(sizes) for a in t.dims)
        inputs[name] = rng.standard_normal(shape) * scale
    ref = run_program(before, sizes, inputs)
    with np.errstate(all="ignore"):
        got = run_program(after, sizes, inputs)
    return max(rel_error(got[n], ref[n]) for n in checked_outputs(before))


SIZES = [{"B": 1, "H": 2, "N": 7}, {"B": 2, "H": 1, "N": 1}, {"B": 1, "H": 1, "N": 13}]


@pytest.mark.parametrize("mask", MASKS)
def test_recompute_then_rowterm_preserve_every_gradient(mask):
    g = _gradient(mask, seed=3, layout="bnhd" if mask and "<" in mask else "bhnd")
    r = _apply(g, "recompute", **{"def": "P"})
    t = _apply(r, "softmax_rowterm", **{"def": "dS", "probs": "P", "output": "O"})
    d = dict((n, v) for n, v in g.sizes)
    for sizes in SIZES:
        full = {**{k: v for k, v in d.items() if v is not None}, **sizes}
        # logits ×16 make dS = P∘(dP − D) ill-conditioned (D ≈ the peak's dP): two exact
        # rewrites then differ by rounding amplified ~1e3, not by a term
        for scale, tol in ((1.0, 1e-12), (4.0, 1e-9)):
            assert _max_error(g, r, full, scale) <= tol
            assert _max_error(g, t, full, scale) <= tol


def test_recompute_writes_lse_and_reads_it():
    g = _gradient("j <= i")
    r = _apply(g, "recompute", **{"def": "P", "lse_name": "LSE"})
    p = r.def_named("P")
    assert "LSE" in {x.tensor for x in walk(p.body) if isinstance(x, Read)}
    assert any(isinstance(x, Un) and x.op == "log" for x in walk(r.def_named("LSE").body))
    assert not any(x.__class__.__name__ == "Softmax" for x in walk(p.body))


def test_recompute_on_a_fully_masked_row_gives_zero_probabilities():
    g = _gradient("i - j >= 2")
    r = _apply(g, "recompute", **{"def": "P"})
    sizes = {"B": 1, "H": 1, "N": 5, "D": dict(g.sizes)["D"]}
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(tuple(a.evaluate(sizes) for a in t.dims)) for n, t in r.inputs}
    with np.errstate(all="ignore"):
        out = run_program(r, sizes, inputs)
    assert np.all(out["P"][:, :, :2] == 0) and np.all(np.isfinite(out["dQ"]))
    assert np.all(np.isneginf(out["LSE"][:, :, :2]))


def test_recompute_lays_m_and_lse_out_in_the_given_order():
    """order: [b, i, h]: M and LSE are [B, N, H] (the layout of a forward that writes LSE beside
    O[b, i, h, d]), read at [b, i, h]; every gradient unchanged, and LSE is the default layout's
    transposed."""
    g = _gradient("j <= i")
    plain = _apply(g, "recompute", **{"def": "P", "lse_name": "LSE"})
    r = _apply(g, "recompute", **{"def": "P", "lse_name": "LSE", "order": ["b", "i", "h"]})
    lse = r.def_named("LSE")
    assert [lp.var for lp in lse.loops] == ["b", "i", "h"] and [str(a) for a in lse.store] == ["b", "i", "h"]
    assert {tuple(map(str, x.idx)) for x in walk(r.def_named("P").body) if isinstance(x, Read) and x.tensor == "LSE"} \
        == {("b", "i", "h")}
    d = dict((n, v) for n, v in g.sizes)
    sizes = {**{k: v for k, v in d.items() if v is not None}, "B": 2, "H": 3, "N": 7}
    assert _max_error(g, r, sizes) <= 1e-12
    rng = np.random.default_rng(1)
    inputs = {n: rng.standard_normal(tuple(a.evaluate(sizes) for a in t.dims)) for n, t in r.inputs}
    with np.errstate(all="ignore"):
        a_, b_ = run_program(plain, sizes, inputs)["LSE"], run_program(r, sizes, inputs)["LSE"]
    assert b_.shape == (2, 7, 3) and np.array_equal(np.transpose(a_, (0, 2, 1)), b_)


def test_recompute_refuses_an_order_that_is_not_of_the_row_loops():
    from compiler.errors import StepInputError

    g = _gradient("j <= i")
    for order in (["b", "i"], ["b", "i", "j"], ["b", "i", "h", "h"]):
        with pytest.raises(StepInputError, match="parameter order"):
            _apply(g, "recompute", **{"def": "P", "order": order})


# --------------------------------------------------------------------------- preconditions


def test_recompute_refuses_a_definition_without_softmax():
    g = _gradient("j <= i")
    with pytest.raises(DerivationError, match="softmax"):
        _apply(g, "recompute", **{"def": "S"})


def test_rowterm_refuses_a_wrong_output():
    g = _gradient("j <= i")
    with pytest.raises(DerivationError, match="plain contraction"):
        _apply(g, "softmax_rowterm", **{"def": "dS", "probs": "P", "output": "S"})


def test_rowterm_refuses_when_the_output_reads_other_probabilities():
    """O = Σ_j P2·V with P2 ≠ P: the exchange would give Σ dO·O with the wrong O."""
    doc = _attention("j <= i", random.Random(0))
    doc["statements"] = doc["statements"][:2] + [
        "P2[b, h, i, j] = P[b, h, i, j] * 2",
        "O[b, h, i, e] = sum(j: P2[b, h, i, j] * V[b, h, j, e])"]
    g = differentiate(lower_spec(parse_spec_text(spec_yaml(doc))), "O", ["Q"], "dO").program
    dS = [d.name for d in g.defs if d.name.startswith("dS")][0]
    with pytest.raises(DerivationError):
        _apply(g, "softmax_rowterm", **{"def": dS, "probs": "P2", "output": "O"})


def test_rowterm_refuses_when_dp_reads_another_value_tensor():
    """dP = Σ_d dO·W with W ≠ the V of O: no exchange gives O."""
    g = _gradient(None)
    dp = g.def_named("dP")
    wrong = g.with_def(replace(dp, body=replace(dp.body, body=Bin("*", dp.body.body.a, Read("K", dp.body.body.b.idx)))))
    with pytest.raises(DerivationError, match="no sum"):
        _apply(wrong, "softmax_rowterm", **{"def": "dS", "probs": "P", "output": "O"})


# --------------------------------------------------------------------------- mutations


def _mutated(monkeypatch, module, name, fn):
    monkeypatch.setattr(module, name, fn)


def test_recompute_without_the_mask_is_caught(monkeypatch):
    from compiler.rules import recompute

    monkeypatch.setattr(recompute, "guarded", lambda mask, body, neutral: body)
    g = _gradient("j <= i")
    r = _apply(g, "recompute", **{"def": "P"})
    assert _max_error(g, r, {"B": 1, "H": 2, "N": 7, "D": dict(g.sizes)["D"]}) > 1e-3


def test_recompute_without_the_log_is_caught(monkeypatch):
    from compiler.rules import recompute

    real = recompute.Un
    monkeypatch.setattr(recompute, "Un", lambda op, a: a if op == "log" else real(op, a))
    g = _gradient(None)
    r = _apply(g, "recompute", **{"def": "P"})
    assert _max_error(g, r, {"B": 1, "H": 2, "N": 7, "D": dict(g.sizes)["D"]}) > 1e-3


def test_rowterm_with_a_wrong_output_index_is_caught(monkeypatch):
    from compiler.rules import softmax_rowterm

    real = softmax_rowterm._unify

    def shifted(out, pairs, j):
        b = real(out, pairs, j)
        if b is not None:  # the row index of O moved by one
            k = out.loops[-2].var
            b = {**b, k: b[k] + 1}
        return b

    monkeypatch.setattr(softmax_rowterm, "_unify", shifted)
    g = _gradient(None)
    t = _apply(g, "softmax_rowterm", **{"def": "dS", "probs": "P", "output": "O"})
    assert _max_error(g, t, {"B": 1, "H": 2, "N": 7, "D": dict(g.sizes)["D"]}) > 1e-3
