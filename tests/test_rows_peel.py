"""Fixed rows the vector does not divide (codegen/mappings/rowwise_peel.py): a vocabulary row of
50257 f16 elements is read in 16-byte vectors from each row's first 16-byte boundary, the head
and the tail one element per thread.  Run through the CPU emulation against float64 on rows
whose heads take every value 0..7 (R = 9 consecutive rows of an odd width), at widths shorter
than a head (C = 3) and in between (1001); mutations of the head, the tail and the clamp of the
head to the row are caught."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from codegen.emu import EmuError, run_printed
from codegen.kir.lower import lower
from codegen.mappings import print_kernel
from compiler.derive import derive
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
R = 9

pytestmark = pytest.mark.xdist_group("rows_peel")


def _printed(tmp: Path, example: str, C: int):
    doc = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    doc["sizes"]["C"] = C
    path = tmp / f"{example}_{C}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    d = derive(load_spec_file(path), str(path), seed=3)
    return print_kernel(lower(d.programs[-1], example), ())


def _rows(C: int, seed: int):
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((R, C)) * 4).astype(np.float16).astype(np.float64)
    T = rng.integers(0, C, R).astype(np.float64)
    T[0], T[1] = C - 1, -100
    return X, T


def _cross_entropy(X, T):
    m = X.max(axis=1)
    lse = m + np.log(np.exp(X - m[:, None]).sum(axis=1))
    rows = np.arange(X.shape[0])
    return np.where(T >= 0, lse - X[rows, np.clip(T, 0, None).astype(int)], 0.0)


def _softmax(X):
    e = np.exp(X - X.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _run(printed, named):
    args = [named[t.name] for t in printed.kernel.inputs]
    return np.asarray(run_printed(printed, 0, args, {}), dtype=np.float64)


def _mutated(printed, old: str, new: str):
    src = printed.variants[0].source
    assert old in src.source, old
    return replace(printed, variants=(replace(printed.variants[0], source=replace(src, source=src.source.replace(old, new))),))


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("peel")
    return {(ex, C): _printed(tmp, ex, C) for ex in ("cross_entropy", "softmax_vocab") for C in (3, 1001, 50257)}


@pytest.mark.parametrize("C", [3, 1001, 50257])
def test_cross_entropy_rows_peeled(kernels, C):
    printed = kernels[("cross_entropy", C)]
    assert printed.plan.peeled and printed.plan.vec == 8
    assert "hd_" in printed.variants[0].source.source and "uint4" in printed.variants[0].source.source
    X, T = _rows(C, seed=C)
    want = _cross_entropy(X, T)
    got = _run(printed, {"X": X, "T": T})
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("C", [3, 1001, 50257])
def test_softmax_rows_peeled(kernels, C):
    printed = kernels[("softmax_vocab", C)]
    assert printed.plan.peeled
    X, _ = _rows(C, seed=C + 1)
    got = _run(printed, {"X": X})
    assert np.abs(got - _softmax(X)).max() <= 1e-3  # f16 output in [0, 1]


@pytest.mark.parametrize("old,new", [
    ("const long long tl_ = (", "const long long tl_ = 0 * ("),  # the tail dropped
    ("(long long)threadIdx.x < hd_)", "(long long)threadIdx.x <= hd_)"),  # one head element twice
    (" < 1001LL ? ", " < 0LL ? "),  # the head not clamped to the row (here: no head at all)
])
def test_peel_mutations_are_caught(kernels, old, new):
    """On all-equal logits the loss is log C: an element missed or counted twice moves it by ~1/C."""
    printed = _mutated(kernels[("cross_entropy", 1001)], old, new)
    X, T = _rows(1001, seed=5)
    X[:] = 0.5
    want = _cross_entropy(X, T)
    try:
        got = _run(printed, {"X": X, "T": T})
    except EmuError:  # the emulation's bounds check
        return
    assert not np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_short_rows_need_the_clamp(kernels):
    printed = _mutated(kernels[("cross_entropy", 3)], " < 3LL ? ", " < 100LL ? ")
    X, T = _rows(3, seed=8)
    X[:] = 0.5
    want = _cross_entropy(X, T)
    try:
        got = _run(printed, {"X": X, "T": T})
    except EmuError:
        return
    assert not np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_rows_of_different_offsets_are_not_peeled(tmp_path):
    """RMSNorm reads the weight row W[c] (offset 0 on every row) beside X[r, c]: no common head."""
    doc = yaml.safe_load((ROOT / "examples" / "rmsnorm.yaml").read_text())
    doc["sizes"]["C"] = 1001
    doc["schedule"] = [s for s in doc["schedule"] if s["rule"] != "cache_row"]
    path = tmp_path / "rms.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    d = derive(load_spec_file(path), str(path), seed=3)
    printed = print_kernel(lower(d.programs[-1], "rms"), ())
    assert printed.mapping == "rowwise" and not printed.plan.peeled and printed.plan.vec == 1


def test_the_plan_counts_the_passes_over_each_row(tmp_path):
    """The row mapping says how often each row is moved in memory: the cross-entropy reads X twice
    (max, sum; the target's logit is one element), its dX three times (max, sum, the store's
    exp) and writes dX once; the streaming softmax, whose row is cached, once."""
    from compiler.derive_grad import derive_gradient

    def plan(example: str):
        path = ROOT / "examples" / f"{example}.yaml"
        d = derive(load_spec_file(path), str(path), seed=3, check=False)
        return print_kernel(lower(d.programs[-1], example), ()).plan

    assert plan("cross_entropy").row_passes == (("X", 2),)
    assert plan("softmax_online").row_passes == (("X", 1), ("Y", 1))
    assert plan("softmax_vocab").row_passes == (("X", 3), ("Y", 1))
    path = ROOT / "examples" / "cross_entropy_grad.yaml"
    (dx,) = derive_gradient(load_spec_file(path), str(path), seed=3, check=False).kernels
    assert print_kernel(lower(dx.final, "dx"), ()).plan.row_passes == (("X", 3), ("dX", 1))
