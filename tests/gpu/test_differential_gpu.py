"""Differential testing on the GPU: generated specs and schedules (tests/specgen.py), each built
through the whole pipeline and run on fresh random inputs with a NaN-poisoned output, compared
with the spec's IR₀ in the float64 interpreter.  DERIVC_DIFF_CASES sets how many (default 40;
devtools/device_check.py runs 200+ in parallel builds)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specgen import build_case, cases  # noqa: E402

N = int(os.environ.get("DERIVC_DIFF_CASES", "40"))
CASES = [c for c in cases(N, seed=int(os.environ.get("DERIVC_DIFF_SEED", "5"))) if c.mapping != "refuse"]


def run_case(case, folder: Path, large_logits: bool = False) -> dict:
    import derivc
    from codegen.run_cmd import check_kernel
    from compiler.trace import replay_programs, spec_of_trace
    import json

    code, err, out = build_case(case, folder)
    assert code == 0, err
    kernel = derivc.load(out)
    trace = json.loads((out / "derivation.json").read_text())
    ir0 = replay_programs(spec_of_trace(trace), trace, upto=0)[0]
    return check_kernel(kernel, ir0, dict(case.run_sizes), seed=3, scale=8.0 if large_logits else 1.0)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_generated_kernel_matches_the_spec(case, tmp_path):
    r = run_case(case, tmp_path, large_logits=case.name.startswith("a"))
    assert not r["nan"], f"NaN in the output at {r['sizes']}"
    assert r["passed"], f"rel error {r['rel_error']:.3e} > {r['tolerance']:.0e} at {r['sizes']}"
