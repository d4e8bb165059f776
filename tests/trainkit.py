"""A build with gradients for the training runtime's tests: row softmax Y = softmax(c: X[r, c])
with `grad:` — GRAD gives dX[r, c] = Y[r, c] (dY[r, c] - sum(c2: Y[r, c2] dY[r, c2])); the
gradient schedule unfuses the row term into D[r]; two backward kernels, D (reads the saved
output Y and the seed dY) then dX (reads D, the earlier kernel's output)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

C = 128


def spec(dtype: str) -> dict[str, Any]:
    return {
        "name": f"softmax_rows_grad_{dtype}", "sizes": {"R": "dynamic", "C": C},
        "inputs": {"X": {"shape": ["R", "C"], "dtype": dtype}},
        "statements": ["Y[r, c] = softmax(c: X[r, c])"], "output": {"tensor": "Y", "dtype": dtype},
        "check_sizes": {"R": 3},
        "schedule": [{"rule": "split_softmax", "def": "Y"}, {"rule": "fuse_let", "producer": "L", "def": "Y"},
                     {"rule": "fuse_let", "producer": "M", "def": "Y"},
                     {"rule": "cache_row", "def": "Y", "tensor": "X"},
                     {"rule": "parallel", "def": "Y", "index": "r", "to": "grid.x"},
                     {"rule": "parallel", "def": "Y", "index": "c", "to": "thread", "count": 32}],
        "grad": {
            "of": "Y", "wrt": ["X"],
            "schedule": [{"rule": "unfuse", "def": "dX", "index": "c2", "name": "D"}],
            "kernels": [
                {"output": "D", "schedule": [{"rule": "parallel", "def": "D", "index": "r", "to": "grid.x"}]},
                {"output": "dX", "schedule": [{"rule": "parallel", "def": "dX", "index": "r", "to": "grid.x"},
                                              {"rule": "parallel", "def": "dX", "index": "c_", "to": "thread",
                                               "count": 32}]}]},
    }


def build_softmax_training(root: Path, dtype: str = "f32") -> Path:
    """root/out: the forward build, root/out/grad/{D,dX} and root/out/grad.json, by `build`."""
    from compiler.cli import build_to

    path = root / f"softmax_rows_grad_{dtype}.yaml"
    path.write_text(yaml.safe_dump(spec(dtype), sort_keys=False))
    build_to(path, root / "out", seed=1, proofs=False)
    return root / "out"


def read_manifest(out: Path) -> dict[str, Any]:
    return json.loads((out / "grad.json").read_text())


def write_manifest(out: Path, m: Any) -> None:
    (out / "grad.json").write_text(json.dumps(m, indent=1) + "\n")


def forward_program(dtype: str = "f32") -> Any:
    """IR0 of the forward spec (the float64 reference of the tests)."""
    from compiler.lower_spec import lower_spec
    from compiler.spec import parse_spec_text

    return lower_spec(parse_spec_text(yaml.safe_dump(spec(dtype), sort_keys=False)))


def softmax_grad_fd(x: np.ndarray, dy: np.ndarray, dtype: str = "f32", h: float = 1e-5) -> np.ndarray:
    """d/dX of sum(Y * dY) by central finite differences of the forward spec in the float64
    interpreter (independent of GRAD and of the backward kernels)."""
    from compiler.interp import run_program

    prog = forward_program(dtype)
    x = np.asarray(x, dtype=np.float64)
    sizes = {"R": x.shape[0], "C": x.shape[1]}

    def forward(xx: np.ndarray) -> np.ndarray:
        return run_program(prog, sizes, {"X": xx})["Y"]

    grad = np.zeros_like(x)
    for c in range(x.shape[1]):  # a column at a time: rows are independent
        e = np.zeros_like(x)
        e[:, c] = h
        grad[:, c] = ((forward(x + e) - forward(x - e)) * dy).sum(axis=1) / (2 * h)
    return grad
