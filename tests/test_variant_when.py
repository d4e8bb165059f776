"""`when:` on a schedule step (compiler/schedule_variants.py): the step applies to the variants
whose choices are among the listed values and is dropped from the others — how
examples/gemm_splitk_tiles_tuned.yaml holds the one-kernel GEMM (S = 1) beside its split-K chains.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from compiler.errors import SpecError
from compiler.schedule_variants import dropped_steps, expand, resolve
from compiler.spec import parse_spec_text

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "examples" / "gemm_splitk_tiles_tuned.yaml").read_text()
VARIANTS = "variants: {tile_i: [128, 64, 256], tile_j: [256, 128], split_k: [1, 2, 4, 8, 16]}"


def test_split_one_drops_the_split_and_keeps_the_one_kernel_gemm():
    spec = parse_spec_text(TEXT)
    one = resolve(spec, {"tile_i": 128, "tile_j": 256, "split_k": 1})
    assert [s.rule for s in one.schedule] == ["tile", "tile", "tile", "reorder", "cache", "cache", "parallel",
                                               "parallel", "parallel", "cache", "map_mma"]
    assert all(s.params()["def"] == "C" for s in one.schedule if "def" in s.params())
    assert all("when" not in s.params() for s in one.schedule)
    four = resolve(spec, {"tile_i": 64, "tile_j": 128, "split_k": 4})
    assert [s.params()["splits"] for s in four.schedule if s.rule == "split_k"] == [4]
    assert [s.params()["count"] for s in four.schedule if s.rule == "parallel" and s.params()["to"] == "warp"] == [4]
    dropped = dropped_steps(spec, {"tile_i": 128, "tile_j": 256, "split_k": 1})
    assert "split_k" in [d["rule"] for d in dropped] and all(d["when"] for d in dropped)
    assert len(expand(spec)) == 30


@pytest.mark.parametrize("edit, match", [
    (("when: {split_k: 1}", "when: {splits: 1}"), "splits is not declared in variants"),
    (("when: {split_k: 1}", "when: {split_k: 3}"), r"split_k: 3 is not one of"),
    (("when: {split_k: 1}", "when: []"), r"expected \{choice"),
])
def test_bad_when_is_one_clear_error(edit, match):
    with pytest.raises(SpecError, match=match):
        expand(parse_spec_text(TEXT.replace(*edit, 1)))


def test_when_without_variants_is_refused():
    text = TEXT.replace(VARIANTS, "").replace("$tile_i", "128").replace("$tile_j", "256").replace("$split_k", "4")
    with pytest.raises(SpecError, match="declares no variants"):
        expand(parse_spec_text(text))
