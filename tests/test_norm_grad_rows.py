"""The row backwards of softmax_online_grad, layernorm_grad and rmsnorm_grad (issue 17): dX is ONE
`rowwise` kernel per op (the row statistics and their adjoints bound once per row, the rows it
reads cached in registers: each read once, dX written once), and a statistic a column sum reads
again (S; mean, var) is a one-block-per-row `rowwise` kernel, not a thread per row.  Every kernel
is run on the CPU against its program by the build itself."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EPS = 1e-6  # the examples' eps

# example -> (the backward's kernels in order, the rows dX's kernel caches, the row-statistic kernels)
CASES = {
    "softmax_online_grad": (["dX"], {"Y", "dY"}, []),
    "rmsnorm_grad": (["dX", "S", "dWp", "dW"], {"X", "dY"}, ["S"]),
    "layernorm_grad": (["dX", "mean", "var", "dWp", "dW", "dBbp", "dBb"], {"X", "dY"}, ["mean", "var"]),
}


@pytest.fixture(scope="module")
def builds(example_build):
    """stem -> the example's build (the run's shared one, conftest.example_build)."""

    def get(stem: str) -> Path:
        b = example_build(ROOT / "examples" / f"{stem}.yaml")
        assert b.rc == 0, b.stderr[-2000:]
        return b.out

    return get


def stems(names) -> list:
    """The examples as parameters, each in its example's xdist group (with its build)."""
    return [pytest.param(n, marks=pytest.mark.xdist_group(f"example-{n}")) for n in names]


def _plan(out: Path, kernel: str) -> dict:
    return json.loads((out / "grad" / kernel / "plan.json").read_text())


@pytest.mark.parametrize("stem", stems(sorted(CASES)))
def test_dx_is_one_row_kernel_reading_each_row_once(stem: str, builds):
    out = builds(stem)
    kernels, cached, stats = CASES[stem]
    assert [k["output"] for k in json.loads((out / "grad.json").read_text())["kernels"]] == kernels
    plan = _plan(out, "dX")
    assert plan["mapping"] == "rowwise", plan["mapping"]
    assert {r.removesuffix("_row") for r in plan["plan"]["rows_cached"]} == cached, plan["plan"]
    body = (out / "grad" / "dX" / "kernel.cu").read_text().split("__global__", 1)[1]
    for t in cached | {"dX"}:  # one sweep loads each row into registers, one sweep stores dX
        assert body.count(f"p_{t} + ") == 1, (t, body.count(f"p_{t} + "))
    for k in stats:
        assert _plan(out, k)["mapping"] == "rowwise", k


@pytest.mark.parametrize("stem", stems(["rmsnorm_grad", "layernorm_grad"]))
def test_partial_column_sums_cover_every_row(stem: str, builds):
    """dW / dB as 64 strided partial sums: R = 70 leaves partials 6..63 one row short and the
    guard must drop rows past R; the emulated backward matches float64 numpy."""
    import derivc

    t = derivc.load_training(builds(stem), device="emu")
    rng = np.random.default_rng(5)
    r, c = 70, 8192
    x = rng.standard_normal((r, c)).astype(np.float16)
    w = (1 + 0.1 * rng.standard_normal(c)).astype(np.float16)
    dy = rng.standard_normal((r, c)).astype(np.float16)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    if stem == "rmsnorm_grad":
        s = 1 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + EPS)
        refs = {"W": (dy64 * x64 * s).sum(axis=0)}
        given = {"X": x, "W": w}
    else:
        b = rng.standard_normal(c).astype(np.float16)
        mean = x64.mean(axis=1, keepdims=True)
        rstd = 1 / np.sqrt(((x64 - mean) ** 2).mean(axis=1, keepdims=True) + EPS)
        refs = {"W": (dy64 * (x64 - mean) * rstd).sum(axis=0), "Bb": dy64.sum(axis=0)}
        given = {"X": x, "W": w, "Bb": b}
    _, saved = t.forward_with_saved(**given)
    grads = t.backward(saved, dy)
    for n, ref in refs.items():
        err = np.linalg.norm(grads[n].astype(np.float64) - ref) / np.linalg.norm(ref)
        assert err < 2e-3, (n, err)  # f16 storage of the gradient
