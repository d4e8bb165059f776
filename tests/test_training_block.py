"""The training block's pieces (tests/trainblock.py) on the CPU: each spec builds with its
backward (GRAD validated, every backward kernel run in the emulation at the check sizes), its
grad.json gives one gradient per wrt input, and the training runtime on the emulation — forward,
then the backward kernels in manifest order — matches the float64 gradient formulas of the op."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trainblock  # noqa: E402
from derivc_testing import EXAMPLES_DIR  # noqa: E402

pytestmark = pytest.mark.slow  # about 70 s: five builds, each running its kernels in the emulation

TOL = 1e-3  # fp16 outputs of fp16 inputs, fp32 math (relative Frobenius error; seen: 2e-4)
EPS = 1e-6  # rmsnorm_grad.yaml's eps
GELU_K, GELU_C = 0.7978845608, 0.044715

Arrays = dict[str, np.ndarray]


def _gemm(a: Arrays, dy: np.ndarray) -> tuple[np.ndarray, Arrays]:
    return a["A"] @ a["B"], {"A": dy @ a["B"].T, "B": a["A"].T @ dy}


def _gemm_residual(a: Arrays, dy: np.ndarray) -> tuple[np.ndarray, Arrays]:
    y, g = _gemm(a, dy)
    return y + a["C0"], {**g, "C0": dy}


def _gemm_bias_gelu(a: Arrays, dy: np.ndarray) -> tuple[np.ndarray, Arrays]:
    x = a["A"] @ a["B"] + a["bias"]
    t = np.tanh(GELU_K * (x + GELU_C * x ** 3))
    dx = dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_K * (1 + 3 * GELU_C * x * x))
    return 0.5 * x * (1 + t), {"A": dx @ a["B"].T, "B": a["A"].T @ dx, "bias": dx.sum(axis=0)}


def _rmsnorm(a: Arrays, dy: np.ndarray) -> tuple[np.ndarray, Arrays]:
    x, w = a["X"], a["W"]
    s = 1 / np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS)
    row = (dy * w * x).sum(axis=1, keepdims=True)
    return x * s * w, {"X": dy * w * s - x * s ** 3 * row / x.shape[1], "W": (dy * x * s).sum(axis=0)}


def _attention(a: Arrays, dy: np.ndarray) -> tuple[np.ndarray, Arrays]:
    q, k, v = a["Q"], a["K"], a["V"]
    n, scale = q.shape[2], q.shape[3] ** -0.5
    s = np.where(np.tril(np.ones((n, n), dtype=bool)), scale * q @ k.swapaxes(-1, -2), -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dp = dy @ v.swapaxes(-1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    return p @ v, {"Q": scale * ds @ k, "K": scale * ds.swapaxes(-1, -2) @ q, "V": p.swapaxes(-1, -2) @ dy}


# piece -> (input: (shape at small sizes, standard deviation), the op and its gradients in float64);
# B's deviation 1/sqrt(K) keeps the GEMM's outputs near 1, where GELU is not yet linear or zero
GEMM = {"A": ((20, 40), 1.0), "B": ((40, 24), 40 ** -0.5)}
Formula = Callable[[Arrays, np.ndarray], tuple[np.ndarray, Arrays]]  # (inputs, dY) -> (Y, {input: dX})
CASES: dict[str, tuple[dict[str, tuple[tuple[int, ...], float]], Formula]] = {
    "rmsnorm": ({"X": ((5, trainblock.D_MODEL), 1.0), "W": ((trainblock.D_MODEL,), 1.0)}, _rmsnorm),
    "gemm": (GEMM, _gemm),
    "attention": ({n: ((1, 2, 21, trainblock.HEAD_DIM), 1.0) for n in ("Q", "K", "V")}, _attention),
    "gemm_residual": ({**GEMM, "C0": ((20, 24), 1.0)}, _gemm_residual),
    "gemm_bias_gelu": ({**GEMM, "bias": ((24,), 0.5)}, _gemm_bias_gelu),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory, example_build) -> Callable[[str], Path]:
    """Builds a piece on first use (once per module); a piece that is an example (attention) is
    the run's shared build of it (conftest.example_build)."""
    root = tmp_path_factory.mktemp("train_block")
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            spec = trainblock.PIECES[name][0]
            if spec.parent == EXAMPLES_DIR:
                b = example_build(spec)
                assert b.rc == 0, b.stderr[-2000:]
                cache[name] = b.out
            else:
                cache[name] = trainblock.build_piece(name, root)
        return cache[name]

    return get


def piece_params() -> list:
    """The pieces, the tests of one piece in one xdist group (its build is made once): an example's
    in that example's group (with the run's shared build)."""
    return [pytest.param(name, marks=pytest.mark.xdist_group(f"example-{spec.stem}" if spec.parent == EXAMPLES_DIR
                                                              else f"train-block-{name}"))
            for name, (spec, _) in trainblock.PIECES.items()]


def test_cases_cover_every_piece():
    assert set(CASES) == set(trainblock.PIECES)


@pytest.mark.parametrize("piece", piece_params())
def test_piece_builds_with_its_backward(built, piece):
    out = built(piece)
    wrt = trainblock.PIECES[piece][1]
    manifest = json.loads((out / "grad.json").read_text())
    assert manifest["grads"] == {x: f"d{x}" for x in wrt}
    assert manifest["grad"]["numeric"]["passed"]
    produced = [k["output"] for k in manifest["kernels"]]
    assert all(f"d{x}" in produced for x in wrt)
    for k in manifest["kernels"]:
        assert (out / k["dir"] / "kernel.cu").is_file(), k["dir"]


@pytest.mark.parametrize("piece", piece_params())
def test_piece_backward_in_the_emulation_matches_float64(built, piece):
    import derivc

    inputs, formula = CASES[piece]
    t = derivc.load_training(built(piece), device="emu")
    rng = np.random.default_rng(sorted(trainblock.PIECES).index(piece))
    xs = {n: (rng.standard_normal(shape) * std).astype(np.float16) for n, (shape, std) in inputs.items()}
    y, saved = t.forward_with_saved(**xs)
    dy = rng.standard_normal(np.shape(y)).astype(np.float16)
    grads = t.backward(saved, dy)
    y_ref, g_ref = formula({n: x.astype(np.float64) for n, x in xs.items()}, dy.astype(np.float64))
    assert _rel(y, y_ref) < TOL, (piece, _rel(y, y_ref))
    assert set(grads) == set(g_ref)
    for n, g in grads.items():
        assert g.shape == xs[n].shape and g.dtype == xs[n].dtype, n
        assert _rel(g, g_ref[n]) < TOL, (piece, n, _rel(g, g_ref[n]))


def _rel(got: Any, want: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(got, dtype=np.float64) - want) / np.linalg.norm(want))
