"""Names a schedule step introduces (tile outer / inner, cache buffers, split / split_softmax /
unfuse names, online_agg name bases) and the spec's own names are checked at parse time: an
identifier in Coq, Lean 4 and CUDA C++, not reserved there, not already used (issue 9, item 5).
Before, `outer: fun` built and then failed its Coq obligations."""
from __future__ import annotations

from pathlib import Path

import pytest
from derivc_testing import assert_fails, gemm_yaml, run_cli, spec_yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler import names
from compiler.names import ALL_RESERVED, COQ_RESERVED, CUDA_RESERVED, LEAN_RESERVED, name_problem

ATTN = {
    "name": "attn",
    "sizes": {"N": "dynamic", "D": 8},
    "inputs": {"Q": {"shape": ["N", "D"], "dtype": "f16"}, "K": {"shape": ["N", "D"], "dtype": "f16"},
               "V": {"shape": ["N", "D"], "dtype": "f16"}},
    "statements": ["S[i, j] = sum(e: Q[i, e] * K[j, e])", "P[i, j] = softmax(j: S[i, j])",
                   "O[i, d] = sum(j: P[i, j] * V[j, d])"],
    "output": {"tensor": "O", "dtype": "f16"},
}


def tile(**extra):
    return [{"rule": "tile", "def": "C", "index": "i", "size": 4, **extra}]


@pytest.mark.parametrize("name, langs", [
    ("fun", "Coq and Lean 4"), ("match", "Coq and Lean 4"), ("Type", "Coq and Lean 4"),
    ("do", "Lean 4 and CUDA C++"), ("int", "CUDA C++"), ("threadIdx", "CUDA C++"), ("Qed", "Coq"),
    ("theorem", "Lean 4"),
])
def test_reserved_outer_name(name, langs):
    assert_fails(gemm_yaml(tile(outer=name)), 2, "schedule[0]", "step 1 (tile)", "parameter outer",
                 f"'{name}' is reserved in {langs}")


@pytest.mark.parametrize("name", ["2x", "a-b", "_x", "x y", "é", "a.b", ""])
def test_inner_name_must_be_an_identifier(name):
    assert_fails(gemm_yaml(tile(inner=name)), 2, "schedule[0]", "parameter inner", "not an identifier")


def test_name_that_is_not_a_string():
    assert_fails(gemm_yaml(tile(outer=12)), 2, "schedule[0]", "parameter outer")


def test_too_long_name():
    assert_fails(gemm_yaml(tile(outer="x" * 65)), 2, "schedule[0]", "parameter outer", "longer than 64")


def test_outer_clashes_with_a_spec_name():
    assert_fails(gemm_yaml(tile(outer="j")), 2, "schedule[0].outer", "name 'j' is already used by the spec")
    assert_fails(gemm_yaml(tile(inner="A")), 2, "schedule[0].inner", "name 'A' is already used by the spec")


def test_name_clashes_with_an_earlier_step():
    sched = tile(outer="x") + [{"rule": "tile", "def": "C", "index": "k", "size": 4, "inner": "x"}]
    assert_fails(gemm_yaml(sched), 2, "schedule[1].inner", "step 2 (tile)", "already used by step 1")


def test_name_clash_is_found_before_any_step_runs(test_rules):
    # step 1 would fail its numeric check (exit 3); the bad name in step 2 is reported first
    sched = [{"rule": "test_corrupt"}, {"rule": "tile", "def": "C", "index": "i", "size": 4, "outer": "end"}]
    assert_fails(gemm_yaml(sched), 2, "schedule[1]", "step 2 (tile)", "reserved")


def test_clash_with_a_default_name_is_an_input_error():
    # step 1 names its loops io / ii by default; step 2 asks for ii again
    sched = tile() + [{"rule": "tile", "def": "C", "index": "j", "size": 4, "outer": "ii"}]
    assert_fails(gemm_yaml(sched), 2, "step 2 (tile)", "parameter outer", "already used")


def test_cache_buffer_name_reserved():
    sched = [{"rule": "tile", "def": "C", "index": "k", "size": 4},
             {"rule": "cache", "def": "C", "tensor": "A", "at": "ko", "over": ["i", "ki"], "name": "float"}]
    assert_fails(gemm_yaml(sched), 2, "schedule[1]", "step 2 (cache)", "parameter name", "reserved in CUDA C++")


def test_cache_buffer_name_clash():
    sched = [{"rule": "tile", "def": "C", "index": "k", "size": 4},
             {"rule": "cache", "def": "C", "tensor": "A", "at": "ko", "over": ["i", "ki"], "name": "B"}]
    assert_fails(gemm_yaml(sched), 2, "schedule[1].name", "already used by the spec")


def test_split_softmax_names():
    assert_fails(spec_yaml(ATTN, [{"rule": "split_softmax", "def": "P", "max_name": "let"}]), 2,
                 "schedule[0]", "parameter max_name", "reserved")
    assert_fails(spec_yaml(ATTN, [{"rule": "split_softmax", "def": "P", "sum_name": "Q"}]), 2,
                 "schedule[0].sum_name", "already used")


def test_online_agg_name_bases():
    sched = [{"rule": "online_agg", "def": "O", "index": "jo", "names": ["m", "l", "with"]}]
    assert_fails(spec_yaml(ATTN, sched), 2, "schedule[0]", "parameter names[2]", "'with' is reserved")


def test_unfuse_and_split_names():
    sched = [{"rule": "unfuse", "def": "C", "index": "k", "name": "class"}]
    assert_fails(gemm_yaml(sched), 2, "schedule[0]", "parameter name", "reserved")
    sched = [{"rule": "split", "def": "C", "index": "k", "at": 2, "second": "1k"}]
    assert_fails(gemm_yaml(sched, sizes={"M": "dynamic", "N": "dynamic", "K": 8}), 2, "parameter second", "identifier")


@pytest.mark.parametrize("field, doc", [
    ("inputs.Type", {"inputs": {"Type": {"shape": ["M", "K"], "dtype": "f16"}, "B": {"shape": ["K", "N"], "dtype": "f16"}},
                     "statements": ["C[i, j] = sum(k: Type[i, k] * B[k, j])"]}),
    ("sizes.for", {"sizes": {"M": "dynamic", "N": "dynamic", "K": "dynamic", "for": 4}}),
    ("statements[0]", {"statements": ["C[i, in] = sum(k: A[i, k] * B[k, in])"]}),
    ("statements[0]", {"statements": ["C[i, j] = sum(fun: A[i, fun] * B[fun, j])"]}),
    ("name", {"name": "main"}),
])
def test_spec_names_are_checked_too(field, doc):
    assert_fails(gemm_yaml([], **doc), 2, field, "reserved")


def test_default_tile_names_avoid_keywords(tmp_path: Path):
    """Tiling index d used to name its outer loop `do` (a Lean and C++ keyword)."""
    f = tmp_path / "attn.yaml"
    f.write_text(spec_yaml(ATTN, [{"rule": "tile", "def": "O", "index": "d", "size": 4}]))
    out = tmp_path / "out"
    rc, _, err = run_cli(["build", str(f), "-o", str(out), "--no-codegen", "--no-proofs", "--seed", "0"])
    assert rc == 0, err
    text = (out / "program.txt").read_text()
    assert " do <" not in text and "do2 <" in text


def test_valid_names_build(tmp_path: Path):
    f = tmp_path / "g.yaml"
    f.write_text(gemm_yaml(tile(outer="row_tile", inner="row")))
    rc, _, err = run_cli(["build", str(f), "-o", str(tmp_path / "out"), "--no-codegen", "--no-proofs"])
    assert rc == 0, err


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(ALL_RESERVED)))
def test_every_reserved_word_is_refused(word):
    problem = name_problem(word)
    assert problem is not None and ("reserved" in problem or "identifier" in problem)


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,20}", fullmatch=True))
def test_identifiers_are_accepted_unless_reserved(name):
    assert (name_problem(name) is None) == (name not in ALL_RESERVED)


def test_keyword_lists_live_in_one_module():
    assert {"Coq": COQ_RESERVED, "Lean 4": LEAN_RESERVED, "CUDA C++": CUDA_RESERVED} == names.RESERVED
    assert {"fun", "match", "Qed"} <= COQ_RESERVED and {"do", "fun", "theorem"} <= LEAN_RESERVED
    assert {"int", "do", "threadIdx"} <= CUDA_RESERVED
