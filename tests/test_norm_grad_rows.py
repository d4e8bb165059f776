"""The row backwards of softmax_online_grad, layernorm_grad and rmsnorm_grad (issue 17): dX is ONE
`rowwise` kernel per op (the row statistics and their adjoints bound once per row, the rows it
reads cached in registers: each read once, dX written once), and a statistic a column sum reads
again (S; mean, var) is a one-block-per-row `rowwise` kernel, not a thread per row.  Every kernel
is run on the CPU against its program by the build itself."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler.cli import build_to

ROOT = Path(__file__).resolve().parents[1]

# example -> (the backward's kernels in order, the rows dX's kernel caches, the row-statistic kernels)
CASES = {
    "softmax_online_grad": (["dX"], {"Y", "dY"}, []),
    "rmsnorm_grad": (["dX", "S", "dW"], {"X", "dY"}, ["S"]),
    "layernorm_grad": (["dX", "mean", "var", "dW", "dBb"], {"X", "dY"}, ["mean", "var"]),
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("norm_grad")
    done: dict[str, Path] = {}

    def get(stem: str) -> Path:
        if stem not in done:
            build_to(ROOT / "examples" / f"{stem}.yaml", root / stem, seed=0, proofs=False)
            done[stem] = root / stem
        return done[stem]

    return get


def _plan(out: Path, kernel: str) -> dict:
    return json.loads((out / "grad" / kernel / "plan.json").read_text())


@pytest.mark.parametrize("stem", sorted(CASES))
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
