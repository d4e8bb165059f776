"""The numeric check's cost is linear in the row length.

- the reference interpreter evaluates a row reduction once per row, not once per element: the
  largest array it builds for softmax / LayerNorm / RMSNorm (the spec and the derived program) is
  a few times R × C, never R × C × C (counted by wrapping `compiler.interp.evaluate`);
- the work estimate that refuses absurd checks (compiler/checkcost.py) counts the same way and
  bounds what the interpreter builds; vocabulary widths (C = 50257, 128256) pass it and derive
  in seconds.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import compiler.interp as interp
from compiler.checkcost import program_points
from compiler.derive import derive
from compiler.lower_spec import MAX_CHECK_POINTS, lower_spec
from compiler.spec import load_spec_file, parse_spec_text

ROOT = Path(__file__).resolve().parents[1]
ROW_EXAMPLES = ["softmax_two_pass", "softmax_online", "layernorm", "rmsnorm", "softmax_c1000"]


def _largest_array(monkeypatch, prog, sizes) -> int:
    """The largest array the interpreter's `evaluate` returns while running prog."""
    seen = [0]
    inner = interp.evaluate

    def counting(env, e):
        out = inner(env, e)
        seen[0] = max(seen[0], int(np.asarray(out).size))
        return out

    monkeypatch.setattr(interp, "evaluate", counting)
    interp.run_program(prog, sizes, interp.random_inputs(prog, sizes, np.random.default_rng(0)))
    monkeypatch.setattr(interp, "evaluate", inner)
    return seen[0]


def _with_width(name: str, C: int) -> str:
    doc = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    doc["sizes"]["C"] = C
    doc["check_sizes"] = {"R": 2}
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.mark.parametrize("name", ["softmax_two_pass", "layernorm", "rmsnorm"])
def test_interpreter_evaluates_a_row_reduction_once_per_row(monkeypatch, tmp_path, name):
    C, R = 4096, 2
    path = tmp_path / f"{name}.yaml"
    path.write_text(_with_width(name, C))
    d = derive(load_spec_file(path), str(path), seed=1)
    for prog in (d.programs[0], d.programs[-1]):
        largest = _largest_array(monkeypatch, prog, {"R": R, "C": C})
        assert largest <= 4 * R * C, f"{largest} points: the reduction is evaluated per element"
        assert largest <= program_points(prog, {"R": R, "C": C})  # the estimate bounds it


@pytest.mark.parametrize("name", ROW_EXAMPLES)
def test_estimate_is_linear_in_the_row(name):
    prog = lower_spec(parse_spec_text(_with_width(name, 50257)))
    assert program_points(prog, {"R": 2, "C": 50257}) <= 4 * 2 * 50257


@pytest.mark.parametrize("C", [50257, 128256])
def test_vocabulary_width_softmax_derives_in_seconds(tmp_path, C):
    doc = yaml.safe_load((ROOT / "examples" / "softmax_vocab.yaml").read_text())
    doc["sizes"]["C"] = C
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    start = time.process_time()
    d = derive(load_spec_file(path), str(path), seed=3)  # every step checked at R = 1, C
    assert time.process_time() - start < 20
    assert d.programs and C * C > MAX_CHECK_POINTS  # the old per-element count would refuse it
