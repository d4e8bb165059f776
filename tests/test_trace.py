"""derivation.json round trip: replaying the recorded steps gives the identical program
(after TVM's verify_trace_roundtrip)."""
from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
import yaml
from derivc_testing import gemm_yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.derive import derive
from compiler.errors import DerivationError, SpecError
from compiler.lower_spec import lower_spec
from compiler.printer import show_program
from compiler.rules import RULES
from compiler.spec import parse_spec_text
from compiler.trace import (
    replay,
    replay_programs,
    spec_of_trace,
    verify_roundtrip,
    write_trace,
)

needs_tile = pytest.mark.skipif(
    not {"tile", "reorder"} <= set(RULES), reason="tile/reorder rules not written yet"
)

TILED = [
    {"rule": "tile", "def": "C", "index": "i", "size": 4},
    {"rule": "tile", "def": "C", "index": "k", "size": 3},
    {"rule": "tile", "def": "C", "index": "io", "size": 2},
    {"rule": "reorder", "def": "C", "outer": "ii", "inner": "j"},
]


def derivation(schedule, **kw):
    return derive(parse_spec_text(gemm_yaml(schedule), "gemm.yaml"), "gemm.yaml", seed=1, **kw)


def test_roundtrip_empty_schedule():
    d = derivation([])
    verify_roundtrip(d)
    assert replay(d.spec, write_trace(d)) == d.initial


def test_roundtrip_test_rules(test_rules):
    d = derivation([{"rule": "test_identity"}, {"rule": "test_identity"}])
    verify_roundtrip(d)
    trace = json.loads(json.dumps(write_trace(d)))
    assert [s["index"] for s in trace["steps"]] == [1, 2]
    assert trace["steps"][0]["numeric"]["tolerance"] == 1e-12


@needs_tile
def test_roundtrip_tiled_gemm():
    d = derivation(TILED)
    verify_roundtrip(d)
    trace = json.loads(json.dumps(write_trace(d)))
    final = replay(spec_of_trace(trace), trace)
    assert final == d.final and final.digest() == trace["final_digest"]
    # partial replays give every intermediate program
    progs = replay_programs(d.spec, trace)
    assert [p.digest() for p in progs] == [p.digest() for p in d.programs]
    assert replay(d.spec, trace, upto=2) == d.programs[2]
    # the check sizes leave a partial tile along every tiled size (i: 4 then io: 2 → 8; k: 3)
    assert d.check_sizes["M"] % 4 and d.check_sizes["M"] % 8 and d.check_sizes["K"] % 3


@needs_tile
def test_replay_detects_tampered_params():
    d = derivation(TILED)
    trace = copy.deepcopy(write_trace(d))
    trace["steps"][0]["params"]["size"] = 8
    with pytest.raises(DerivationError, match="diverged"):
        replay(d.spec, trace)


def test_replay_detects_other_spec(test_rules):
    d = derivation([{"rule": "test_identity"}])
    other = parse_spec_text(gemm_yaml([], statements=["C[i, j] = sum(k: A[i, k] * B[k, j]) * 2"]))
    with pytest.raises(DerivationError, match="trace was made from"):
        replay(other, write_trace(d))


def test_replay_unknown_rule_is_spec_error(test_rules):
    d = derivation([{"rule": "test_identity"}])
    trace = write_trace(d)
    trace["steps"][0]["rule"] = "gone"
    with pytest.raises(SpecError, match="unknown rule"):
        replay(d.spec, trace)


def test_replay_step_out_of_range(test_rules):
    d = derivation([{"rule": "test_identity"}])
    with pytest.raises(DerivationError, match="out of range"):
        replay(d.spec, write_trace(d), upto=5)


def test_derive_upto_and_no_check(test_rules):
    d = derivation([{"rule": "test_identity"}, {"rule": "test_corrupt"}], upto=1)
    assert len(d.steps) == 1
    d = derivation([{"rule": "test_identity"}, {"rule": "test_corrupt"}], check=False)
    assert len(d.steps) == 2 and d.steps[1].numeric is None
    verify_roundtrip(d)


def test_numeric_failure_names_step_and_sizes(test_rules):
    with pytest.raises(DerivationError) as exc:
        derivation([{"rule": "test_identity"}, {"rule": "test_corrupt", "factor": 1.5}])
    e = exc.value
    assert e.step == 2 and e.rule == "test_corrupt" and e.file == "gemm.yaml"
    assert "relative error" in e.reason and "M=5" in e.reason


def test_check_sizes_override():
    spec = parse_spec_text(gemm_yaml([], check_sizes={"M": 3, "K": 2}))
    assert derive(spec, seed=0).check_sizes == {"M": 3, "N": 5, "K": 2}


@needs_tile
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ti=st.integers(2, 8),
    tk=st.integers(2, 8),
    tj=st.integers(2, 4),
    swap=st.booleans(),
)
def test_roundtrip_random_tilings(ti, tk, tj, swap):
    sched = [
        {"rule": "tile", "def": "C", "index": "i", "size": ti},
        {"rule": "tile", "def": "C", "index": "j", "size": tj},
        {"rule": "tile", "def": "C", "index": "k", "size": tk},
    ]
    if swap:
        sched.append({"rule": "reorder", "def": "C", "outer": "ii", "inner": "jo"})
    d = derivation(sched)
    assert all(s.numeric["passed"] for s in d.steps)
    sizes = d.check_sizes
    assert sizes["M"] % ti and sizes["N"] % tj and sizes["K"] % tk
    verify_roundtrip(d)


# --------------------------------------------------------------------------- the recorded spec text


def test_trace_records_the_spec_file_text(tmp_path):
    """derivation.json holds the schedule file byte for byte (what `derivc verify` rebuilds from)."""
    import hashlib

    text = gemm_yaml([]) + "# a comment the canonical JSON loses\r\n"
    f = tmp_path / "gemm.yaml"
    f.write_bytes(text.encode())
    d = derive(parse_spec_text(text, str(f)), str(f), seed=1)
    trace = json.loads(json.dumps(write_trace(d)))
    assert trace["spec_text"] == text
    assert trace["spec_file_sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert parse_spec_text(trace["spec_text"]) == spec_of_trace(trace) == d.spec
    f.write_text(gemm_yaml([], statements=["C[i, j] = sum(k: A[i, k] * B[k, j]) * 2"]))
    assert write_trace(d)["spec_text"] is None  # the file changed since: not the derived spec
    d.spec_text = text  # a derivation rebuilt from a trace carries its text; the file is not read
    assert write_trace(d)["spec_text"] == text


# --------------------------------------------------------------------------- constants in digests


FA = Path(__file__).resolve().parents[1] / "examples" / "flash_attention.yaml"


def _fa(scale: object):
    doc = yaml.safe_load(FA.read_text())
    doc["params"] = {"scale": scale}
    return derive(parse_spec_text(yaml.safe_dump(doc, sort_keys=False)), check=False)


def test_flash_attention_scale_value_changes_the_digests():
    exact, other = _fa("1/sqrt(D)"), _fa(0.05)
    assert exact.final.digest() != other.final.digest()
    assert exact.initial.digest() != other.initial.digest()
    assert f"scale(={1 / math.sqrt(128)!r})" in show_program(exact.final)
    assert "scale(=0.05)" in show_program(other.final)


@settings(max_examples=40, deadline=None)
@given(a=st.floats(allow_nan=False, allow_infinity=False), b=st.floats(allow_nan=False, allow_infinity=False))
def test_labelled_constant_prints_its_value(a, b):
    def prog(v: float):
        return lower_spec(parse_spec_text(gemm_yaml(
            [], params={"scale": v}, statements=["C[i, j] = scale * sum(k: A[i, k] * B[k, j])"])))

    pa, pb = prog(a), prog(b)
    printed = re.search(r"scale\(=([^)]*)\)", show_program(pa)).group(1)
    assert float(printed) == a
    assert (pa.digest() == pb.digest()) == (a == b)
