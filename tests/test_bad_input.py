"""One test per bad input: exit 2 (invalid input) or 3 (derivation failed), one error line
naming the file and the field or step, and no output directory left behind."""
from __future__ import annotations

from pathlib import Path

import pytest
from derivc_testing import GEMM, GOOD_GEMM, assert_fails, gemm_yaml, spec_yaml

ATTN = {
    "name": "attn",
    "sizes": {"N": "dynamic", "D": 4},
    "inputs": {"Q": {"shape": ["N", "D"], "dtype": "f16"}, "K": {"shape": ["N", "D"], "dtype": "f16"}},
    "statements": ["S[i, j] = sum(e: Q[i, e] * K[j, e])", "P[i, j] = softmax(j: S[i, j])"],
    "output": {"tensor": "P", "dtype": "f32"},
}


def test_good_gemm_builds():
    import tempfile
    from pathlib import Path

    from derivc_testing import run_cli

    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "g.yaml"
        f.write_text(GOOD_GEMM)
        rc, _, err = run_cli(["build", str(f), "-o", str(Path(tmp) / "out"), "--no-codegen"])
        assert rc == 0, err


def test_malformed_yaml():
    assert_fails(GOOD_GEMM.replace("{M: dynamic,", "{M: dynamic,,["), 2, "malformed YAML", "line")


def test_not_a_mapping():
    assert_fails("- just\n- a list\n", 2, "expected a mapping")


def test_missing_field():
    assert_fails(GOOD_GEMM.replace("output: {tensor: C, dtype: f16}\n", ""), 2, "output", "required")


def test_unknown_field():
    assert_fails(GOOD_GEMM + "shedule: []\n", 2, "shedule", "unknown field")


def test_unknown_tensor_in_statement():
    bad = GOOD_GEMM.replace("B[k, j])", "X[k, j])")
    assert_fails(bad, 2, "statements[0]", "unknown tensor 'X'")


def test_unknown_index():
    bad = GOOD_GEMM.replace("B[k, j])", "B[k + q, j])")
    assert_fails(bad, 2, "statements[0]", "unknown index 'q'")


def test_wrong_rank():
    bad = GOOD_GEMM.replace("A[i, k] *", "A[i] *")
    assert_fails(bad, 2, "statements[0]", "A has 2 dimensions")


def test_unknown_size_in_shape():
    bad = GOOD_GEMM.replace("shape: [K, N]", "shape: [K, Q]")
    assert_fails(bad, 2, "inputs.B.shape[1]", "unknown size 'Q'")


def test_bad_dtype():
    bad = GOOD_GEMM.replace("shape: [M, K], dtype: f16", "shape: [M, K], dtype: f8")
    assert_fails(bad, 2, "inputs.A.dtype")


def test_bad_size_value():
    bad = GOOD_GEMM.replace("M: dynamic", "M: -4")
    assert_fails(bad, 2, "sizes", "positive")


def test_output_not_defined():
    bad = GOOD_GEMM.replace("tensor: C", "tensor: Z")
    assert_fails(bad, 2, "output.tensor", "'Z'")


def test_statement_parse_error():
    bad = GOOD_GEMM.replace("sum(k: A[i, k] * B[k, j])", "sum(k: A[i, k] ** B[k, j])")
    assert_fails(bad, 2, "statements[0]", "cannot parse")


def test_softmax_over_missing_index():
    doc = dict(ATTN, statements=["S[i, j] = sum(e: Q[i, e] * K[j, e])", "P[i] = softmax(j: S[i, j])"])
    assert_fails(spec_yaml(doc), 2, "statements[1]", "softmax over index j")


def test_statement_not_quoted():
    bad = GOOD_GEMM.replace('  - "C[i, j] = sum(k: A[i, k] * B[k, j])"', "  - C[i, j] = sum(k: A[i, k] * B[k, j])")
    assert_fails(bad, 2, "statements", "quote it")


def test_unknown_check_size():
    assert_fails(gemm_yaml([], check_sizes={"Z": 3}), 2, "check_sizes.Z", "unknown size")


def test_unknown_rule():
    assert_fails(gemm_yaml([{"rule": "frobnicate"}]), 2, "schedule[0].rule", "step 1", "frobnicate", "known rules")


def test_unknown_rule_parameter(test_rules):
    assert_fails(gemm_yaml([{"rule": "test_identity", "bogus": 1}]), 2, "schedule[0]", "step 1", "test_identity", "bogus", "unknown parameter")


def test_bad_parameter_type(test_rules):
    sched = [{"rule": "test_identity"}, {"rule": "test_corrupt", "factor": "lots"}]
    assert_fails(gemm_yaml(sched), 2, "schedule[1]", "step 2", "test_corrupt", "factor")


def test_missing_rule_field():
    assert_fails(gemm_yaml([{"def": "C", "index": "i"}]), 2, "schedule[0].rule", "required")


def test_failed_precondition(test_rules):
    sched = [{"rule": "test_identity"}, {"rule": "test_refuse"}]
    assert_fails(gemm_yaml(sched), 3, "step 2", "(test_refuse)", "precondition never holds")


def test_failed_numeric_check(test_rules):
    msg = assert_fails(gemm_yaml([{"rule": "test_corrupt"}]), 3, "step 1", "(test_corrupt)", "numeric check failed", "relative error")
    assert "M=" in msg and "seed" in msg


def test_corrupt_rewrite_named_at_its_step(test_rules):
    sched = [{"rule": "test_identity"}, {"rule": "test_identity"}, {"rule": "test_corrupt", "factor": 1.001}]
    assert_fails(gemm_yaml(sched), 3, "step 3", "test_corrupt")


@pytest.mark.skipif("tile" not in __import__("compiler.rules").rules.RULES, reason="tile rule not written yet")
def test_tile_unknown_parameter_real_rule():
    sched = [{"rule": "tile", "def": "C", "index": "i", "size": 16, "sise": 3}]
    assert_fails(gemm_yaml(sched), 2, "schedule[0]", "step 1", "tile", "sise")


@pytest.mark.skipif("tile" not in __import__("compiler.rules").rules.RULES, reason="tile rule not written yet")
def test_tile_bad_parameter_type_real_rule():
    sched = [{"rule": "tile", "def": "C", "index": "i", "size": "big"}]
    assert_fails(gemm_yaml(sched), 2, "schedule[0]", "step 1", "tile", "size")


def test_gemm_constant_is_unchanged():
    # the shared spec dict must not be mutated by the helpers
    gemm_yaml([{"rule": "x"}], name="other")
    assert GEMM["name"] == "gemm" and "schedule" not in GEMM


# --------------------------------------------------------------------------- rule preconditions at the CLI
# Each violated precondition is exit 3 with one line naming the file, the step, the rule, the reason.

FA_YAML = (Path(__file__).resolve().parents[1] / "examples" / "flash_attention.yaml").read_text()


def _fa_with(schedule: list[dict]) -> str:
    import yaml as _yaml

    doc = _yaml.safe_load(FA_YAML)
    doc["schedule"] = schedule
    return _yaml.safe_dump(doc, sort_keys=False)


def test_cli_tile_that_does_not_divide_without_guard():
    sched = [{"rule": "tile", "def": "C", "index": "i", "size": 16, "guard": False}]
    assert_fails(gemm_yaml(sched), 3, "step 1", "(tile)", "needs a guard", "dynamic")


def test_cli_illegal_reorder_across_fold():
    doc = __import__("yaml").safe_load(FA_YAML)
    prefix = doc["schedule"][:6]  # up to online_agg
    sched = prefix + [{"rule": "reorder", "def": "O", "outer": "jo", "inner": "ji_max"}]
    assert_fails(_fa_with(sched), 3, "step 7", "(reorder)", "fold carrying state", "in order")


def test_cli_fuse_across_mismatched_tilings():
    sched = [{"rule": "tile", "def": "S", "index": "j", "size": 32}, {"rule": "split_softmax", "def": "P"},
             {"rule": "fuse", "producer": "S"}]
    assert_fails(_fa_with(sched), 3, "step 3", "(fuse)", "mismatched tilings")


def test_cli_online_agg_with_mismatched_tiles():
    doc = __import__("yaml").safe_load(FA_YAML)
    sched = doc["schedule"][:4] + [{"rule": "tile", "def": "L", "index": "j_", "size": 32},
                                   {"rule": "online_agg", "def": "O", "index": "jo"}]
    assert_fails(_fa_with(sched), 3, "step 6", "(online_agg)", "mismatched tilings")


def test_cli_softmax_over_index_the_tensor_lacks():
    doc = __import__("yaml").safe_load(FA_YAML)
    doc["statements"][1] = "P[b, h, i, j] = softmax(e: S[b, h, i, j])"
    doc["schedule"] = []
    text = __import__("yaml").safe_dump(doc, sort_keys=False)
    assert_fails(text, 2, "statements[1]", "softmax", "index")


def test_cli_map_mma_on_f32_operands():
    sched = [{"rule": "tile", "def": "C", "index": "k", "size": 16},
             {"rule": "map_mma", "def": "C", "index": "ki", "instr": "mma_sync"}]
    text = gemm_yaml(sched, inputs={"A": {"shape": ["M", "K"], "dtype": "f32"}, "B": {"shape": ["K", "N"], "dtype": "f32"}})
    assert_fails(text, 3, "step 2", "(map_mma)")


# --------------------------------------------------------------------------- strict input (issue 10, item 3)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from compiler.spec import param_value, parse_spec_text  # noqa: E402


def test_duplicate_top_level_key():
    bad = GOOD_GEMM + "output: {tensor: C, dtype: f32}\n"
    assert_fails(bad, 2, "line 9", "duplicate key 'output'", "first at line 8")


def test_duplicate_nested_key_in_flow_mapping():
    bad = GOOD_GEMM.replace("{M: dynamic, N: dynamic, K: dynamic}", "{M: dynamic, N: dynamic, M: 64}")
    assert_fails(bad, 2, "line 2", "duplicate key 'M'")


def test_duplicate_key_in_a_schedule_step():
    bad = GOOD_GEMM + "schedule:\n  - {rule: tile, def: C, index: i, size: 16, size: 32}\n"
    assert_fails(bad, 2, "line 10", "duplicate key 'size'")


@pytest.mark.parametrize("value, shown", [
    ("true", "bool True"), ('"128"', "the string '128'"), ("0x80", "the string '0x80'"),
    ("1.5", "float 1.5"), ("yes", "the string 'yes'"), ("[1]", "list"), ("1e3", "float 1000.0"),
])
def test_sizes_are_integers_not_coerced(value, shown):
    assert_fails(GOOD_GEMM.replace("K: dynamic", f"K: {value}"), 2, "sizes.K", "positive integer or dynamic", shown)


@pytest.mark.parametrize("value", ["true", '"5"', "0x5", "5.0"])
def test_check_sizes_are_integers_not_coerced(value):
    assert_fails(GOOD_GEMM + f"check_sizes: {{M: {value}}}\n", 2, "check_sizes.M", "positive integer")


def test_fixed_size_at_2_31_is_refused():
    assert_fails(GOOD_GEMM.replace("K: dynamic", f"K: {2**31}"), 2, "sizes.K", "too large", "2^31")


def test_fixed_size_just_below_2_31_is_refused_by_the_check_budget():
    msg = assert_fails(GOOD_GEMM.replace("K: dynamic", f"K: {2**31 - 1}"), 2, "sizes", "numeric checks")
    assert "MemoryError" not in msg


def test_check_sizes_too_large():
    assert_fails(GOOD_GEMM + "check_sizes: {M: 100000, N: 100000, K: 64}\n", 2, "check_sizes", "numeric checks", "limit")


def test_tile_size_is_not_coerced():
    for value in ("true", '"16"', "0x10", "16.0"):
        text = GOOD_GEMM + f"schedule:\n  - {{rule: tile, def: C, index: i, size: {value}}}\n"
        assert_fails(text, 2, "schedule[0]", "step 1 (tile)", "parameter size")


def test_tile_guard_is_a_real_boolean():
    text = GOOD_GEMM + "schedule:\n  - {rule: tile, def: C, index: i, size: 16, guard: no}\n"
    assert_fails(text, 2, "schedule[0]", "parameter guard")


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=-1e30, max_value=1e30, allow_nan=False, allow_infinity=False).filter(lambda x: x != 0),
       st.sampled_from(["{:e}", "{:E}", "{!r}", "{:.3e}", "{:g}", "{:.12f}"]))
def test_yaml_floats_in_any_form(x, form):
    text = form.format(x)
    doc = parse_spec_text(GOOD_GEMM + f"params: {{alpha: {text}}}\n")
    assert param_value(doc, "alpha") == float(text)


@pytest.mark.parametrize("text, value", [("1e-6", 1e-6), (".5", 0.5), ("5.", 5.0), ("-2E3", -2000.0), ("+1.5e+2", 150.0)])
def test_small_float_forms_build(tmp_path: Path, text, value):
    from derivc_testing import run_cli

    f = tmp_path / "g.yaml"
    f.write_text(GOOD_GEMM.replace('"C[i, j] = sum(k: A[i, k] * B[k, j])"', '"C[i, j] = alpha * sum(k: A[i, k] * B[k, j])"')
                 + f"params: {{alpha: {text}}}\n")
    rc, _, err = run_cli(["build", str(f), "-o", str(tmp_path / "out"), "--no-codegen", "--no-proofs"])
    assert rc == 0, err
    assert parse_spec_text(f.read_text()).params["alpha"] == value


def test_did_you_mean_rule():
    assert_fails(gemm_yaml([{"rule": "tilee", "def": "C", "index": "i", "size": 4}]), 2,
                 "schedule[0].rule", "did you mean 'tile'", "known rules")


def test_did_you_mean_field():
    assert_fails(GOOD_GEMM + "shedule: []\n", 2, "shedule", "unknown field", "did you mean 'schedule'")


def test_did_you_mean_nested_field():
    assert_fails(GOOD_GEMM.replace("{shape: [M, K], dtype: f16}", "{shape: [M, K], dtpye: f16}"), 2,
                 "inputs.A", "did you mean 'dtype'")


def test_did_you_mean_rule_parameter():
    sched = [{"rule": "tile", "def": "C", "index": "i", "sise": 4}]
    assert_fails(gemm_yaml(sched), 2, "schedule[0]", "sise", "did you mean 'size'")


def test_did_you_mean_tensor():
    assert_fails(GOOD_GEMM.replace("B[k, j])", "Bb[k, j])"), 2, "statements[0]", "unknown tensor 'Bb'", "did you mean 'B'")


def test_did_you_mean_size():
    assert_fails(GOOD_GEMM.replace("shape: [K, N]", "shape: [K, Nn]"), 2, "inputs.B.shape[1]", "did you mean 'N'")


def test_did_you_mean_check_size():
    assert_fails(gemm_yaml([], check_sizes={"KK": 3}), 2, "check_sizes.KK", "did you mean 'K'")


def test_did_you_mean_definition_is_input_error():
    """An unknown `def:` is invalid input (exit 2), not a failed derivation."""
    assert_fails(gemm_yaml([{"rule": "tile", "def": "Cc", "index": "i", "size": 4}]), 2,
                 "step 1", "parameter def", "no definition named 'Cc'", "did you mean 'C'")


def test_unknown_loop_after_a_rename_lists_the_loops_now():
    sched = [{"rule": "tile", "def": "C", "index": "i", "size": 4},
             {"rule": "tile", "def": "C", "index": "i", "size": 2}]
    assert_fails(gemm_yaml(sched), 2, "step 2 (tile)", "parameter index", "'i' is not bound in C",
                 "loops now: io, ii, j", "bound inside: k")


def test_reorder_of_a_renamed_loop_says_so():
    """Before: 'a loop of C cannot be exchanged with a reduction inside its body' (i was a loop)."""
    sched = [{"rule": "tile", "def": "C", "index": "i", "size": 4},
             {"rule": "reorder", "def": "C", "outer": "i", "inner": "j"}]
    msg = assert_fails(gemm_yaml(sched), 2, "step 2 (reorder)", "parameter outer", "'i' is not bound",
                       "loops now: io, ii, j", "did you mean")
    assert "reduction" not in msg


def test_cache_unknown_index_in_over():
    sched = [{"rule": "tile", "def": "C", "index": "k", "size": 4},
             {"rule": "cache", "def": "C", "tensor": "A", "at": "ko", "over": ["i", "kii"]}]
    assert_fails(gemm_yaml(sched), 2, "step 2 (cache)", "parameter over[1]", "did you mean 'ki'")


def test_deep_yaml_is_an_input_error():
    msg = assert_fails(GOOD_GEMM + "description: " + "[" * 5000 + "]" * 5000 + "\n", 2, "nested deeper")
    assert "RecursionError" not in msg


def test_deep_block_yaml_is_an_input_error():
    deep = "".join("  " * k + f"k{k}:\n" for k in range(200)) + "  " * 200 + "x: 1\n"
    assert_fails(deep, 2, "nested deeper")


def test_nested_parentheses_are_an_input_error():
    body = "(" * 300 + "A[i, k] * B[k, j]" + ")" * 300
    bad = GOOD_GEMM.replace("sum(k: A[i, k] * B[k, j])", f"sum(k: {body})")
    assert_fails(bad, 2, "statements[0]", "nested deeper")


def test_long_sum_is_an_input_error():
    terms = " + ".join(["A[i, k] * B[k, j]"] * 1000)
    bad = GOOD_GEMM.replace("sum(k: A[i, k] * B[k, j])", f"sum(k: {terms})")
    assert_fails(bad, 2, "statements[0]")


def test_deep_sum_is_an_input_error():
    terms = "+".join(["A[i,k]"] * 400)
    bad = GOOD_GEMM.replace("sum(k: A[i, k] * B[k, j])", f"sum(k: {terms})")
    assert_fails(bad, 2, "statements[0]", "levels deep", "limit")


def test_many_unary_minus_is_an_input_error():
    bad = GOOD_GEMM.replace("sum(k: A[i, k] * B[k, j])", "sum(k: " + "-" * 2000 + "A[i, k])")
    assert_fails(bad, 2, "statements[0]", "nested deeper")


def test_a_sum_within_the_limits_builds(tmp_path: Path):
    from derivc_testing import run_cli

    terms = " + ".join(["A[i, k] * B[k, j]"] * 60)
    f = tmp_path / "g.yaml"
    f.write_text(GOOD_GEMM.replace("sum(k: A[i, k] * B[k, j])", f"sum(k: {terms})"))
    rc, _, err = run_cli(["build", str(f), "-o", str(tmp_path / "out"), "--no-codegen", "--no-proofs"])
    assert rc == 0, err


@settings(max_examples=40, deadline=None)
@given(st.lists(st.from_regex(r"[a-z]{1,6}", fullmatch=True) | st.sampled_from(["true", "false", "null"]),
                min_size=1, max_size=6, unique=True), st.data())
def test_any_duplicate_key_is_named_with_its_line(keys, data):
    """Named as written, also where YAML reads the key as a boolean or null."""
    from compiler.errors import SpecError

    dup = data.draw(st.sampled_from(keys))
    lines = [f"{k}: 1" for k in keys]
    at = data.draw(st.integers(min_value=keys.index(dup) + 1, max_value=len(lines)))
    lines.insert(at, f"{dup}: 2")
    with pytest.raises(SpecError) as exc:
        parse_spec_text("\n".join(lines) + "\n", "f.yaml")
    assert exc.value.where == f"line {at + 1}" and f"duplicate key {dup!r}" in exc.value.reason


@pytest.mark.parametrize("example", sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_check_budget_accepts_every_example_without_check_sizes(example):
    """The work limit refuses absurd sizes only: the examples pass it even with the sizes
    derivc would choose itself."""
    import yaml as _yaml

    from compiler.lower_spec import lower_spec

    doc = _yaml.safe_load(example.read_text())
    doc.pop("check_sizes", None)
    lower_spec(parse_spec_text(_yaml.safe_dump(doc, sort_keys=False)))
