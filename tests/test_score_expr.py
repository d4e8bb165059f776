"""General score functions on the tensor-core fold mappings (mma.sync, wgmma), without a GPU.

- the score's normal form (codegen/mappings/score.py) preserves the value of random expressions;
- equivalent spellings (the scale on either side, / sqrt(D) or * (1/sqrt(D)), soft-capping's
  constants written either way) print byte-identical kernels on both mappings;
- generated score compositions (hypothesis) build on both mappings: derived, lowered, printed,
  compiled and run on the CPU emulation against the final program in float64;
- a mutation of the normal form (a dropped constant factor) is caught by the kernel check.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings, strategies as st

from codegen.kir.lower import lower
from codegen.mappings import online_fold, score
from codegen.mappings.ctx_common import DEFAULT_OPTIONS
from compiler.derive import derive
from compiler.interp import UNARY
from compiler.ir import Aff, Bin, Const, IndexValue, Read, Un
from compiler.spec import load_spec_file
from derivc_testing import sweep_full, sweep_seed

EX = Path(__file__).resolve().parents[1] / "examples"
QK = "sum(e: Q[b, h, i, e] * K[b, h, j, e])"
BASES = {"wgmma": "flash_attention_wgmma", "mma_sync": "flash_attention"}
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")


def _spec(base: str, score_text: str, name: str = "score_variant") -> dict:
    spec = yaml.safe_load((EX / f"{base}.yaml").read_text())
    spec["name"] = name
    spec["statements"][0] = f"S[b, h, i, j] = {score_text}"
    return spec


def _printed(tmp_path: Path, spec: dict, instr: str) -> str:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    s = load_spec_file(path)
    k = lower(derive(s, str(path), seed=1, check=False).final, s.name)  # its text is the subject, not its checks
    return online_fold._print(k, DEFAULT_OPTIONS, instr).variants[0].source.source


# ------------------------------------------------------------------ the normal form keeps the value

ENV = {"acc": 1.7, "t": -0.6}
FIXED = {"D": 128}


def _value(e) -> float:
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Read):
        return ENV[e.tensor]
    if isinstance(e, IndexValue):
        return float(e.aff.evaluate({**FIXED, "j": 3, "i": 5}))
    if isinstance(e, Un):
        return float(UNARY[e.op](np.float64(_value(e.a))))
    a, b = _value(e.a), _value(e.b)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else math.nan, "max": max(a, b)}[e.op]


_leaf = st.one_of(
    st.sampled_from([Read("acc", ()), Read("t", ()), IndexValue(Aff.of("D")), IndexValue(Aff.build({"j": 1, "i": -1}))]),
    st.floats(-4, 4, allow_nan=False).filter(lambda v: abs(v) > 1e-3).map(Const))
_exprs = st.recursive(_leaf, lambda sub: st.one_of(
    st.builds(Bin, st.sampled_from(["+", "-", "*", "/", "max"]), sub, sub),
    st.builds(Un, st.sampled_from(["neg", "tanh"]), sub),
    st.builds(lambda a: Un("sqrt", Bin("*", a, a)), sub)), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(_exprs)
def test_the_normal_form_keeps_the_value(e):
    before = _value(e)
    after = _value(score.normal_form(e, FIXED))
    if math.isfinite(before) and abs(before) < 1e6:
        assert after == pytest.approx(before, rel=1e-5, abs=1e-5 * (1 + abs(before)))


def test_the_normal_form_of_the_spellings():
    acc = Read("acc", ())
    scale = Const(1 / math.sqrt(128), label="scale")
    spellings = [Bin("*", scale, acc), Bin("*", acc, scale), Bin("/", acc, Un("sqrt", IndexValue(Aff.of("D")))),
                 Bin("*", acc, Bin("/", Const(1.0), Un("sqrt", IndexValue(Aff.of("D"))))),
                 Bin("*", Bin("*", acc, Const(0.5)), Bin("*", Const(2.0), scale))]
    forms = {score.normal_form(s, FIXED) for s in spellings}
    assert len(forms) == 1, forms
    assert score.split_scale(forms.pop(), acc) == (float(np.float32(128 ** -0.5)), None)  # the fast path
    softcap = score.normal_form(Bin("*", Const(30.0), Un("tanh", Bin("/", Bin("*", scale, acc), Const(30.0)))), FIXED)
    assert score.split_scale(softcap, acc)[1] == softcap  # not a constant times the sum: the general path
    assert score.split_scale(score.normal_form(Bin("*", Const(-2.0), acc), FIXED), acc)[1] is not None


# ------------------------------------------------------------------ equivalent spellings, same kernel

SPELLINGS = [
    [f"scale * {QK}", f"{QK} * scale", f"{QK} / sqrt(D)", f"{QK} * (1 / sqrt(D))", f"(1 / sqrt(D)) * {QK}"],
    [f"30 * tanh(scale * {QK} / 30)", f"tanh({QK} * scale / 30) * 30", f"30 * tanh({QK} / sqrt(D) / 30)",
     f"30 * tanh({QK} / (30 * sqrt(D)))"],
]


@pytest.mark.parametrize("instr", sorted(BASES))
@pytest.mark.parametrize("group", range(len(SPELLINGS)), ids=["scale", "softcap"])
def test_equivalent_spellings_print_byte_identical_kernels(tmp_path, instr, group):
    texts = {_printed(tmp_path, _spec(BASES[instr], s), instr) for s in SPELLINGS[group]}
    assert len(texts) == 1
    text = texts.pop()
    assert ("tanhf" in text) == (group == 1)


def test_the_scale_on_the_right_prints_the_reference_kernel(tmp_path):
    ref = yaml.safe_load((EX / "flash_attention_wgmma.yaml").read_text())
    right = yaml.safe_load((EX / "attention_scale_right.yaml").read_text())
    right["name"] = ref["name"]
    assert _printed(tmp_path, right, "wgmma") == _printed(tmp_path, ref, "wgmma")


# ------------------------------------------------------------------ generated compositions, emulated


def _compose(draw) -> str:
    x = QK
    for _ in range(draw(st.integers(1, 3))):
        c = draw(st.sampled_from(["0.5", "2", "0.125", "3"]))
        x = draw(st.sampled_from([
            f"{c} * {x}", f"{x} * {c}", f"{x} / {c}", f"{x} / sqrt(D)", f"20 * tanh({x} / 20)",
            f"{x} + {c} * (j - i)", f"{x} - {c}", f"max({x}, -{c})", f"-{x}", f"{x} * (1 + 0.01 * (i - j))",
        ]))
    return x


@needs_gxx
@pytest.mark.sweep
@pytest.mark.parametrize("instr", sorted(BASES))
@settings(max_examples=3 if sweep_full() else 1, deadline=None, suppress_health_check=list(HealthCheck))
@seed(sweep_seed())
@given(data=st.data())
def test_generated_scores_build_and_run_on_the_emulation(tmp_path_factory, instr, data):
    from compiler.cli import build_to

    text = data.draw(st.composite(lambda draw: _compose(draw))())
    tmp = tmp_path_factory.mktemp("gen")
    path = tmp / "gen.yaml"
    path.write_text(yaml.safe_dump(_spec(BASES[instr], text, "gen_score"), sort_keys=False))
    build_to(path, tmp / "out", seed=2, proofs=False)  # the kernel step runs the emulation: raises on a mismatch
    assert (tmp / "out" / "kernel.cu").exists()


@needs_gxx
@pytest.mark.parametrize("instr", [pytest.param("mma_sync"),  # the example's spec on flash_attention's schedule
                                   pytest.param("wgmma", marks=pytest.mark.xdist_group("example-attention_softcap"))])
def test_the_softcap_example_builds_on_both_mappings(tmp_path, instr, example_build):
    from compiler.cli import build_to

    assert sorted(BASES) == ["mma_sync", "wgmma"]
    if instr == "wgmma":  # the example itself: the run's shared build
        b = example_build(EX / "attention_softcap.yaml")
        assert b.rc == 0, b.stderr[-2000:]
        out = b.out
    else:
        spec = yaml.safe_load((EX / "attention_softcap.yaml").read_text())
        spec["schedule"] = yaml.safe_load((EX / "flash_attention.yaml").read_text())["schedule"]
        path = tmp_path / "softcap.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        build_to(path, tmp_path / "out", seed=2, proofs=False)
        out = tmp_path / "out"
    assert json.loads((out / "plan.json").read_text())["mapping"].endswith(instr)
    assert "30.0f * tanhf(" in (out / "kernel.cu").read_text()


@needs_gxx
def test_a_mutated_normal_form_is_caught(tmp_path, monkeypatch):
    """Drop the inner factor when two constant factors combine: 30 * tanh(QK / sqrt(D) / 30) then
    prints without 1/sqrt(D); the kernel check on the CPU emulation catches it."""
    from compiler.cli import BuildError, build_to

    def dropped(c, a):
        inner = score._scaled(a)
        return Bin("*", Const(c), inner[1] if inner is not None else a)

    monkeypatch.setattr(score, "_times", dropped)
    with pytest.raises(BuildError, match="kernel"):
        build_to(EX / "attention_softcap.yaml", tmp_path / "out", seed=2, proofs=False)
