"""One test per bad input: exit 2 (invalid input) or 3 (derivation failed), one error line
naming the file and the field or step, and no output directory left behind."""
from __future__ import annotations

from pathlib import Path

import pytest
from derivc_testing import GEMM, assert_fails, gemm_yaml, spec_yaml

GOOD_GEMM = """\
name: gemm
sizes: {M: dynamic, N: dynamic, K: dynamic}
inputs:
  A: {shape: [M, K], dtype: f16}
  B: {shape: [K, N], dtype: f16}
statements:
  - "C[i, j] = sum(k: A[i, k] * B[k, j])"
output: {tensor: C, dtype: f16}
"""

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
    bad = GOOD_GEMM.replace("shape: [M, K], dtype: f16", "shape: [M, K], dtype: f64")
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
