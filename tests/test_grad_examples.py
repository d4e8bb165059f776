"""What the examples with gradients rely on, on the CPU: every examples/*_grad.yaml has its
float64 torch reference in the GPU test; the numeric checks accept a -inf the spec has (a row the
mask empties has log-sum-exp -inf) only where the checked program has it too; an f16 output is
compared with the reference rounded to f16; a per-lane let buffer of the SIMT mapping is not
computed past a tail (it read rows >= N)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import yaml

from codegen.kernel_check import compare
from compiler.cli import build_to
from compiler.interp import rel_error

ROOT = Path(__file__).resolve().parents[1]


def _gpu_test_module():
    path = ROOT / "tests" / "gpu" / "test_grad_examples_gpu.py"
    spec = importlib.util.spec_from_file_location("grad_examples_gpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_grad_example_has_a_gpu_reference():
    gpu = _gpu_test_module()
    stems = [p.stem for p in gpu.EXAMPLES + gpu.PENDING]
    assert "flash_attention_grad" in stems and len(gpu.EXAMPLES) >= 16
    assert not [s for s in stems if s not in gpu.REFERENCES], "add the example's torch math to REFERENCES"
    for p in gpu.EXAMPLES + gpu.PENDING:  # the reference's sizes are the spec's sizes
        sizes = yaml.safe_load(p.read_text())["sizes"]
        for case in gpu.REFERENCES[p.stem].cases:
            assert set(case.sizes) == set(sizes), (p.stem, case.sizes)
            assert all(case.sizes[n] == v for n, v in sizes.items() if v != "dynamic"), (p.stem, case.sizes)


def test_a_matched_infinity_is_exact_and_an_unmatched_one_is_not():
    ref = np.array([-np.inf, 1.0, 2.0])
    assert rel_error(np.array([-np.inf, 1.0, 2.0]), ref) == 0.0
    assert not rel_error(np.array([0.0, 1.0, 2.0]), ref) <= 1.0  # NaN: an infinity the output misses
    assert rel_error(np.array([np.inf, 1.0, 2.0]), ref) == float("inf")
    assert rel_error(np.array([np.nan, 1.0, 2.0]), ref) == float("inf")
    assert compare(np.array([-np.inf, 1.0, 2.0], np.float32), ref, "f32")["passed"]
    for got in ([-3e38, 1.0, 2.0], [np.nan, 1.0, 2.0], [np.inf, 1.0, 2.0]):
        assert not compare(np.array(got, np.float32), ref, "f32")["passed"], got


def test_an_f16_output_is_compared_with_what_f16_can_hold():
    """GELU's derivative at a very negative pre-activation is ~1e-10 in float64, 0 in f32 and in
    f16: an f16 output of such values is right at 0 (the wide draw of gemm_bias_gelu_grad's dA)."""
    tiny = np.array([4.3e-10, -1e-9])
    assert compare(np.zeros(2), tiny, "f16")["passed"]
    assert not compare(np.zeros(2), tiny, "f32")["passed"]
    assert not compare(np.array([0.5, 0.0]), tiny, "f16")["passed"]


def _row_lse_spec(tmp_path: Path) -> Path:
    """A log-sum-exp per row whose max is a per-lane let buffer, rows tiled by 32 with a tail."""
    spec = {
        "name": "row_lse_tail", "sizes": {"R": "dynamic", "C": 1024},
        "inputs": {"X": {"shape": ["R", "C"], "dtype": "f32"}},
        "statements": ["M[r] = max(c: X[r, c])", "Y[r] = M[r] + log(sum(c: exp(X[r, c] - M[r])))"],
        "output": {"tensor": "Y", "dtype": "f32"}, "check_sizes": {"R": 37},
        "schedule": [{"rule": "fuse_let", "producer": "M", "def": "Y"},
                     {"rule": "tile", "def": "Y", "index": "r", "size": 32},
                     {"rule": "parallel", "def": "Y", "index": "ro", "to": "grid.x"},
                     {"rule": "parallel", "def": "Y", "index": "ri", "to": "thread"}],
    }
    path = tmp_path / "row_lse_tail.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_a_let_buffer_past_the_tail_reads_nothing(tmp_path):
    out = tmp_path / "out"
    build_to(_row_lse_spec(tmp_path), out, seed=0, proofs=False)  # the kernel step runs it on the CPU
    text = (out / "kernel.cu").read_text()
    fill = next(line for line in text.splitlines() if "lb_M" in line and "=" in line and "p_X" in line)
    assert "< (sz_R)" in fill and "? " in fill, fill  # the fill is guarded by the store's guard
