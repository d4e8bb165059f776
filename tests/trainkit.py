"""A hand-made build with gradients for the training runtime's tests (until `grad:` specs build
them): forward Y = softmax over the rows of X; backward in two kernels, the row term
D[r] = sum(k: Y[r, k] dY[r, k]) (reads the saved output Y and the seed dY) and
dX[r, c] = Y[r, c] (dY[r, c] - D[r]) (reads the earlier kernel's D), with OUT/grad.json."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

C = 128


def _specs(dtype: str) -> dict[str, dict[str, Any]]:
    rows = {"shape": ["R", "C"], "dtype": dtype}
    sizes = {"R": "dynamic", "C": C}
    return {
        "forward": {
            "name": f"softmax_rows_{dtype}", "sizes": sizes, "inputs": {"X": rows},
            "statements": ["Y[r, c] = softmax(c: X[r, c])"], "output": {"tensor": "Y", "dtype": dtype},
            "check_sizes": {"R": 3},
            "schedule": [{"rule": "split_softmax", "def": "Y"}, {"rule": "fuse_let", "producer": "L", "def": "Y"},
                         {"rule": "fuse_let", "producer": "M", "def": "Y"},
                         {"rule": "cache_row", "def": "Y", "tensor": "X"},
                         {"rule": "parallel", "def": "Y", "index": "r", "to": "grid.x"},
                         {"rule": "parallel", "def": "Y", "index": "c", "to": "thread", "count": 32}]},
        "D": {
            "name": f"softmax_bwd_rowdot_{dtype}", "sizes": sizes, "inputs": {"Y": rows, "dY": rows},
            "statements": ["D[r] = sum(k: Y[r, k] * dY[r, k])"], "output": {"tensor": "D", "dtype": "f32"},
            "check_sizes": {"R": 3}, "schedule": [{"rule": "parallel", "def": "D", "index": "r", "to": "grid.x"}]},
        "dX": {
            "name": f"softmax_bwd_dx_{dtype}", "sizes": sizes,
            "inputs": {"Y": rows, "dY": rows, "D": {"shape": ["R"], "dtype": "f32"}},
            "statements": ["dX[r, c] = Y[r, c] * (dY[r, c] - D[r])"], "output": {"tensor": "dX", "dtype": dtype},
            "check_sizes": {"R": 3},
            "schedule": [{"rule": "parallel", "def": "dX", "index": "r", "to": "grid.x"},
                         {"rule": "parallel", "def": "dX", "index": "c", "to": "thread", "count": 32}]},
    }


def manifest(dtype: str) -> dict[str, Any]:
    return {"of": "Y", "seed": "dY", "wrt": ["X"], "grads": {"X": "dX"}, "saved": ["Y"],
            "kernels": [{"name": "D", "dir": "grad/D", "inputs": ["Y", "dY"], "output": "D", "dtype": "f32",
                         "shape": ["R"]},
                        {"name": "dX", "dir": "grad/dX", "inputs": ["Y", "dY", "D"], "output": "dX",
                         "dtype": dtype, "shape": ["R", "C"]}]}


def build_softmax_training(root: Path, dtype: str = "f32") -> Path:
    """root/out: the forward build, root/out/grad/{D,dX}, root/out/grad.json."""
    from compiler.cli import build_to

    out = root / "out"
    for name, spec in _specs(dtype).items():
        path = root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        build_to(path, out if name == "forward" else out / "grad" / name, seed=1, proofs=False)
    write_manifest(out, manifest(dtype))
    return out


def write_manifest(out: Path, m: Any) -> None:
    (out / "grad.json").write_text(json.dumps(m, indent=1) + "\n")


def forward_program(dtype: str = "f32") -> Any:
    """IR0 of the forward spec (the float64 reference of the tests)."""
    from compiler.lower_spec import lower_spec
    from compiler.spec import parse_spec_text

    return lower_spec(parse_spec_text(yaml.safe_dump(_specs(dtype)["forward"], sort_keys=False)))


def softmax_grad_fd(x: np.ndarray, dy: np.ndarray, dtype: str = "f32", h: float = 1e-5) -> np.ndarray:
    """d/dX of sum(Y * dY) by central finite differences of the forward spec in the float64
    interpreter (independent of the backward kernels' formula)."""
    from compiler.interp import run_program

    prog = forward_program(dtype)
    x = np.asarray(x, dtype=np.float64)
    sizes = {"R": x.shape[0], "C": x.shape[1]}

    def loss(xx: np.ndarray) -> np.ndarray:
        return run_program(prog, sizes, {"X": xx})["Y"]

    grad = np.zeros_like(x)
    for c in range(x.shape[1]):  # a column at a time: rows are independent
        e = np.zeros_like(x)
        e[:, c] = h
        grad[:, c] = ((loss(x + e) - loss(x - e)) * dy).sum(axis=1) / (2 * h)
    return grad
