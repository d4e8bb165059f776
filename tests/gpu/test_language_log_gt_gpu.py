"""log(e) and gt(a, b) on the GPU: the specs of tests/test_language_log_gt.py (row log-softmax on
the row-wise mapping, a row log-sum-exp and an element-wise kernel on SIMT, the ReLU backward on
wgmma and mma.sync and a tie-every-row step as GEMM epilogues) against the float64 interpreter, at
their check sizes and at larger ones with tails.  The tie specs (gt(M, X) at the row max,
gt(X, X[r, 0]) at column 0, gt(Z, Z[i, 0])) tell `>` from `>=`."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]


def _specs() -> dict:
    spec = importlib.util.spec_from_file_location("language_log_gt_specs", ROOT / "tests" / "test_language_log_gt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {name: doc for name, (doc, _, _) in mod.BUILDS.items()}


SPECS = _specs()
SIZES = {  # extra sizes beyond the check sizes: tails and many rows / tiles
    "log_softmax": [{"R": 1}, {"R": 77}],
    "row_lse": [{"R": 1}, {"R": 1000}],
    "simt_log_gt": [{"R": 5}, {"R": 513}],
    "gemm_relu_bwd": [{"M": 128, "N": 256, "K": 64}, {"M": 1000, "N": 1030, "K": 200}],
    "gemm_relu_bwd_mma": [{"M": 128, "N": 256, "K": 64}, {"M": 1000, "N": 1030, "K": 200}],
    "gemm_gt_ties": [{"M": 300, "N": 520, "K": 136}],
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_log_gt_kernels_on_the_gpu(tmp_path, name):
    import derivc
    from codegen.run_cmd import check_kernel
    from compiler.cli import build_to

    doc = SPECS[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    d = build_to(path, tmp_path / name, proofs=False, seed=1)
    kernel = derivc.load(tmp_path / name)
    assert json.loads((tmp_path / name / "plan.json").read_text())["mapping"]
    for k, sizes in enumerate([doc["check_sizes"], *SIZES.get(name, [])]):
        r = check_kernel(kernel, d.programs[0], sizes, seed=k + 1)
        assert not r["nan"] and r["passed"], r
    if name == "log_softmax":  # large logits: the max shift keeps exp finite
        r = check_kernel(kernel, d.programs[0], {"R": 33}, seed=9, scale=30.0)
        assert not r["nan"] and r["passed"], r
