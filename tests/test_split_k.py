"""SPLIT-K (split-K GEMM): a sum's tiles over S splits, f32 partial sums, a combine in split order.

Property: the split program equals the float64 product for split factors 1, 2, 3, 4, 8 and K
that leaves empty splits (more splits than tiles, K smaller than S tiles, K = 1) and partial
last tiles; the partial sums of a split with no tile are 0; an epilogue stays in the combine.
Negative: the preconditions refuse by name.
Mutation: a combine that drops the last split, a split's tile bound off by one or a tile index
without the split's offset fails the step's numeric check (CPU), and the step's Coq obligation
(coqc, when installed).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from compiler import obligations
from compiler.derive import derive
from compiler.errors import DerivationError
from compiler.interp import run_program
from compiler.ir import Aff, Ext, Reduce, subst_index
from compiler.rules import RULES
from compiler.spec import parse_spec_text

ROOT = Path(__file__).resolve().parents[1]
GEMM = ROOT / "examples" / "gemm_splitk.yaml"
SPLIT_STEP = 2  # gemm_splitk.yaml: step 2 is split_k


def splitk_text(splits: int = 4, statement: str = "", check_sizes: str = "") -> str:
    text = GEMM.read_text().replace("index: ko, splits: 4}", f"index: ko, splits: {splits}}}")
    if statement:
        text = text.replace('"C[i, j] = sum(k: A[i, k] * B[k, j])"', statement)
    if check_sizes:
        text = text.replace("check_sizes: {M: 150, N: 270, K: 300}", f"check_sizes: {check_sizes}")
    return text


def run_split(text: str, sizes: dict[str, int], seed: int = 0):
    prog = derive(parse_spec_text(text), check=False, upto=SPLIT_STEP).final
    rng = np.random.default_rng(seed)
    ins = {"A": rng.standard_normal((sizes["M"], sizes["K"])), "B": rng.standard_normal((sizes["K"], sizes["N"]))}
    return prog, ins, run_program(prog, sizes, ins)


@pytest.mark.parametrize("splits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("k", [1, 63, 64, 65, 300, 1000])
def test_split_program_is_the_product(splits, k):
    """Every split factor; tails; K = 1; more splits than tiles (empty splits write 0)."""
    sizes = {"M": 5, "N": 7, "K": k}
    prog, ins, out = run_split(splitk_text(splits), sizes)
    assert [d.name for d in prog.defs] == ["C_part", "C"]
    assert dict(prog.facts)["kernels"] == "C_part,C"
    want = ins["A"] @ ins["B"]
    assert np.allclose(out["C"], want, rtol=1e-12, atol=1e-12)
    part = out["C_part"]
    assert part.shape == (splits, 5, 7)
    tiles = -(-k // 64)
    for s in range(splits):  # split s adds the tiles s, S + s, ...
        cols = [c for t in range(s, tiles, splits) for c in range(64 * t, min(64 * t + 64, k))]
        assert np.allclose(part[s], ins["A"][:, cols] @ ins["B"][cols], rtol=1e-12, atol=1e-12)
    assert np.all(part[tiles:] == 0)


def test_the_combine_adds_in_split_order():
    prog, _, _ = run_split(splitk_text(4), {"M": 2, "N": 2, "K": 70})
    body = prog.def_named("C").body
    assert isinstance(body, Reduce) and body.op == "sum" and body.ext == Ext.of(4)
    assert prog.def_named("C_part").type.dtype == "f32"


def test_an_epilogue_stays_in_the_combine():
    """C = max(A·B + bias, 0): the partial sums are the bare contraction, the combine applies
    bias and ReLU to their sum (checked numerically at every step)."""
    text = splitk_text(3, statement='"C[i, j] = max(sum(k: A[i, k] * B[k, j]) + Bias[j], 0)"')
    text = text.replace("  B: {shape: [K, N], dtype: f16}\n", "  B: {shape: [K, N], dtype: f16}\n  Bias: {shape: [N], dtype: f16}\n")
    d = derive(parse_spec_text(text), check=True, upto=SPLIT_STEP)
    combine = d.final.def_named("C")
    assert "Bias" in str(combine.body) and "max" in str(combine.body)
    assert "Bias" not in str(d.final.def_named("C_part").body)


@pytest.mark.parametrize("patch,reason", [
    (("index: ko, splits: 4}", "index: ko, splits: 0}"), "at least 1"),
    (('"C[i, j] = sum(k: A[i, k] * B[k, j])"', '"C[i, j] = max(k: A[i, k] * B[k, j])"'), "not a sum"),
    (("  - {rule: tile, def: C, index: k, size: 64}\n",
      "  - {rule: tile, def: C, index: k, size: 64}\n  - {rule: tile, def: C, index: i, size: 16}\n"),
     "not a plain statement"),
    (("index: ko, splits: 4}", "index: ki, splits: 4}"), "inside another reduction"),
])
def test_preconditions_refuse_by_name(patch, reason):
    text = splitk_text().replace(*patch)
    with pytest.raises(DerivationError, match=reason):
        derive(parse_spec_text(text), check=False, upto=SPLIT_STEP + (1 if "size: 16" in patch[1] else 0))


# --------------------------------------------------------------------------- mutations


def _mutated(monkeypatch, mutation: str) -> None:
    rule = RULES["split_k"]
    orig = type(rule).rewrite

    def bad(self, prog, p, facts):
        new = orig(self, prog, p, facts)
        part, comb = new.def_named(p.def_ + "_part"), new.def_named(p.def_)
        if mutation == "combine_drops_last_split":
            return new.with_def(replace(comb, body=replace(comb.body, ext=Ext.of(p.splits - 1))))
        red: Reduce = part.body
        if mutation == "bound_off_by_one":  # each split stops one tile early
            (num, div), = red.ext.parts
            return new.with_def(replace(part, body=replace(red, ext=Ext(((num - Aff.lit(div // p.splits), div),)))))
        # the tile index without the split's offset: every split adds tiles S·ko
        return new.with_def(replace(part, body=replace(red, body=subst_index(red.body, p.split_index, Aff.lit(0)))))

    # on the class: an instance attribute would outlive monkeypatch's undo
    monkeypatch.setattr(type(rule), "rewrite", bad)


MUTATIONS = ["combine_drops_last_split", "bound_off_by_one", "split_offset_dropped"]


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_mutations_fail_the_numeric_check(monkeypatch, mutation):
    _mutated(monkeypatch, mutation)
    with pytest.raises(DerivationError, match="numeric check failed"):
        derive(parse_spec_text(splitk_text()), check=True, upto=SPLIT_STEP)


needs_coq = pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")


@pytest.fixture(scope="module")
def coq_lib(tmp_path_factory):
    from proofs_ci import coqlib

    return coqlib.build_library(out_dir=tmp_path_factory.mktemp("coqlib") / "coq")


def _coq_ok(d, tmp: Path, lib: Path, step: int) -> bool:
    from proofs_ci import coqlib

    obligations.write_obligations(d, tmp / "proofs")
    index = {e["step"]: e for e in json.loads((tmp / "proofs" / "index.json").read_text())["steps"]}
    assert index[step]["status"] != "not generated", index[step]
    return coqlib.check_obligation(tmp / "proofs" / index[step]["files"]["coq"], lib).returncode == 0


@needs_coq
@pytest.mark.parametrize("splits", [4, 1])
def test_split_k_obligation_passes(tmp_path, coq_lib, splits):
    d = derive(parse_spec_text(splitk_text(splits)), check=False, upto=SPLIT_STEP)
    assert _coq_ok(d, tmp_path, coq_lib, SPLIT_STEP)


@needs_coq
def test_untiled_sum_obligation_passes(tmp_path, coq_lib):
    """split_k on the sum over k itself (no TILE first): theorem sumTo_strided."""
    text = splitk_text(3).replace("  - {rule: tile, def: C, index: k, size: 64}\n", "")
    text = text.replace("index: ko, splits: 3}", "index: k, splits: 3}")
    d = derive(parse_spec_text(text), check=True, upto=1)
    assert _coq_ok(d, tmp_path, coq_lib, 1)


@needs_coq
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_mutations_fail_coqc(monkeypatch, tmp_path, coq_lib, mutation):
    _mutated(monkeypatch, mutation)
    d = derive(parse_spec_text(splitk_text()), check=False, upto=SPLIT_STEP)
    assert not _coq_ok(d, tmp_path, coq_lib, SPLIT_STEP)
