"""Differential testing, CPU part: generated specs and schedules (tests/specgen.py) through the
whole build — derivation checks, lowering to the kernel IR and its validation, the mapping the
schedule asks for, the kernel text run on the CPU (the `kernel` step), NVRTC and the SASS
promises.  The GPU part (tests/gpu/test_differential_gpu.py) runs the same cases against the
float64 reference."""
from __future__ import annotations

import json
import os

import pytest

from derivc_testing import sweep_sample, sweep_seed
from specgen import cases, build_case

# A sweep: 4 of 12 cases generated from the run's sweep seed (DERIVC_SWEEP_FULL=1: all 12;
# DERIVC_DIFF_SEED / DERIVC_DIFF_CASES: other generated cases, all of them)
N_CASES = int(os.environ.get("DERIVC_DIFF_CASES", "12"))
SEED = int(os.environ.get("DERIVC_DIFF_SEED", sweep_seed()))
CASES = cases(N_CASES, seed=SEED)
if "DERIVC_DIFF_CASES" not in os.environ:
    CASES = sweep_sample(CASES, 4, "differential")


@pytest.mark.sweep
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_generated_case_builds_with_the_expected_mapping(case, tmp_path):
    code, err, out = build_case(case, tmp_path)
    if case.mapping == "refuse":
        assert code == 3, f"expected a refusal, got exit {code}"
        assert case.refusal in err, err
        assert not out.exists(), "a refused build must leave no output directory"
        return
    assert code == 0, err
    plan = json.loads((out / "plan.json").read_text())
    assert plan["mapping"] == case.mapping
    trace = json.loads((out / "derivation.json").read_text())
    low, kern = trace["steps"][-2:]
    assert low["rule"] == "lowering" and low["numeric"]["passed"] and low["numeric"]["rel_error"] <= 1e-12
    # the kernel text itself ran on the CPU: every draw passed, every variant was reached
    assert kern["rule"] == "kernel" and kern["numeric"]["passed"], kern
    draws = kern["numeric"]["draws"]
    assert {d["draw"] for d in draws} >= {"plain", "large", "wide"} and all(d["passed"] for d in draws)
    assert {d["variant"] for d in draws} == {v["stem"] for v in plan["variants"]}
    assert (out / "kir.txt").exists() and (out / "kernel.cu").exists()


def test_generator_covers_the_language():
    tags = {t for c in cases(60, seed=11) for t in c.tags}
    maps = {c.mapping for c in cases(60, seed=11)}
    assert {"transposed", "mask", "batch", "bnhd", "skip"} <= tags
    assert {"simt", "contraction_mma_sync", "contraction_wgmma", "online_fold_mma_sync", "online_fold_wgmma"} <= maps
    written = " ".join(" ".join(c.spec["statements"]) for c in cases(120, seed=11))
    for op in (" < ", " <= ", " > ", " >= ", " == ", " && "):
        assert op in written, f"no generated spec uses {op.strip()}"
