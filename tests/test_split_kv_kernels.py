"""SPLIT-KV's two kernels (codegen/multi_kernel.py): the partial folds (mma.sync: strided key
tiles, the state m, l stored beside the unnormalised acc), then the combine, each lowered and
validated against its cut of the program, printed, and its text run on the CPU through the
emulation against float64 — at the example's check sizes, Nk = 1 (fifteen empty splits of
sixteen), Nk = 100 (four tiles: twelve empty splits), for 2, 3, 8 and 16 splits with key tails,
under a key mask (a window at the end of the cache, speculative decoding's causal rows) — and a
combine printed without its rescale caught by the emulation.  The mma.sync printer's mutations
(strided tile dropped, acc / l stored, m left in log2 units) are in tests/test_kernel_mutations.py.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from codegen.build import CodegenError
from codegen.emu import host_compiler
from codegen.multi_kernel import check_stages, kernel_programs, stages
from compiler.derive import derive
from compiler.ir import Program
from compiler.spec import load_spec_file, parse_spec_text

pytestmark = pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler")

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "examples" / "decode_splitkv.yaml"
TILES = {"Nk": 32}
MMA = "online_fold_mma_sync"


@pytest.fixture(scope="module")
def final():
    return derive(load_spec_file(DECODE), str(DECODE), check=False).final


def test_one_kernel_per_definition_in_order(final):
    cuts = kernel_programs(final)
    assert [c.output for c in cuts] == ["O_part", "O"]
    assert cuts[0].also_outputs() == ("O_part_m", "O_part_l")
    assert [d.computed_by for d in cuts[1].defs] == ["kernel O_part", ""]


@pytest.mark.parametrize("nk", [1100, 1, 100])
def test_both_kernels_pass_the_emulation(final, nk):
    sizes = {"B": 2, "H": 2, "Nq": 1, "Nk": nk, "D": 128}
    found = stages(final, "decode", sizes, 1)
    assert [s.name for s in found] == ["O_part", "O"]
    assert [s.printed.mapping for s in found] == [MMA, "simt"]
    assert [t.name for t in found[0].kernel.outputs] == ["O_part", "O_part_m", "O_part_l"]
    assert [t.name for t in found[1].kernel.inputs] == ["O_part", "O_part_m", "O_part_l"]
    records = check_stages(found, sizes, 3, TILES)
    assert all(r["passed"] for r in records)


def test_a_combine_without_its_rescale_is_caught(final, monkeypatch):
    """The combine kernel printed from a program whose denominator drops e^(m_k - m): the
    lowering validation (kernel IR vs its cut) still agrees with the mutated cut, so the
    emulation is compared with the unmutated cut's O, and must disagree."""
    from dataclasses import replace

    from compiler.ir import Bin

    d = final.def_named("O")
    num, den = d.body.body.a, d.body.body.b
    bad = final.with_def(replace(d, body=replace(d.body, body=Bin("/", num, replace(den, body=den.body.a)))))
    sizes = {"B": 2, "H": 2, "Nq": 1, "Nk": 1100, "D": 128}
    bad_stage = stages(bad, "decode", sizes, 1)[1]
    good_stage = stages(final, "decode", sizes, 1)[1]
    with pytest.raises(CodegenError, match="kernel O"):
        check_stages([replace(bad_stage, program=good_stage.program)], sizes, 3, TILES)


def test_a_single_definition_is_refused(final):
    from dataclasses import replace

    with pytest.raises(CodegenError, match="one kernel"):
        kernel_programs(replace(final, defs=final.defs[:1], output="O_part"))


def test_the_two_kernels_chained_on_the_cpu_are_attention(final):
    """End to end as the GPU runs them: the partial kernel's own outputs (f32 partials, m with
    -inf for empty splits) fed to the combine kernel, against float64 attention."""
    import numpy as np

    from codegen.emu.run import run_printed

    sizes = {"B": 1, "H": 2, "Nq": 1, "Nk": 300, "D": 128}
    part, combine = stages(final, "decode", sizes, 1)
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(s).astype(np.float16) for s in ((1, 2, 1, 128), (1, 2, 300, 128), (1, 2, 300, 128)))
    o_part, m, l = run_printed(part.printed, 0, [q, k, v])
    assert np.all(np.isneginf(m[..., 10:])) and np.all(l[..., 10:] == 0)  # 10 tiles over 16 splits
    assert np.all(np.isfinite(m[..., :10])) and np.all(l[..., :10] >= 1)
    o = run_printed(combine.printed, 0, [o_part, m, l])
    s = np.einsum("bhie,bhje->bhij", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(128)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhij,bhjd->bhid", p / p.sum(-1, keepdims=True), v.astype(np.float64))
    assert np.linalg.norm(np.asarray(o, np.float64) - want) / np.linalg.norm(want) < 2e-3


def test_gqa_kernels_pass_the_emulation():
    """32 query / 8 K-V heads: a query head's 16-row tile per block on mma.sync, K / V read at
    the group's head, then the combine; Nk = 300 leaves six of sixteen splits empty."""
    path = ROOT / "examples" / "decode_splitkv_gqa.yaml"
    prog = derive(load_spec_file(path), str(path), check=False).final
    sizes = {"B": 1, "HK": 2, "G": 4, "Nq": 1, "Nk": 300, "D": 128}
    found = stages(prog, "gqa", sizes, 1)
    assert [s.printed.mapping for s in found] == [MMA, "simt"]
    assert all(r["passed"] for r in check_stages(found, sizes, 3, TILES))


def decode_variant(splits: int, mask: str = "", sizes: str = "") -> Program:
    text = re.sub(r"splits: \d+}", f"splits: {splits}}}", DECODE.read_text())
    if mask:
        text = text.replace("softmax(j: S[b, h, i, j])", f"softmax(j | {mask}: S[b, h, i, j])")
    if sizes:
        text = re.sub(r"^sizes: .*$", f"sizes: {sizes}", text, count=1, flags=re.M)
    return derive(parse_spec_text(text), check=False).final


@pytest.mark.parametrize("splits, nk, nq", [(2, 1100, 1), (3, 257, 1), (8, 1100, 1), (8, 1, 1), (16, 100, 1),
                                            (16, 1100, 17)])
def test_mma_partial_fold_for_several_splits(splits, nk, nq):
    """Split ks folds the key tiles ks, S + ks, …: tails, more splits than tiles (empty splits
    keep (-inf, 0, 0)), one key, and two query tiles (Nq = 17: the second holds one row)."""
    sizes = {"B": 1, "H": 2, "Nq": nq, "Nk": nk, "D": 128}
    part = stages(decode_variant(splits), "decode", sizes, 1)[0]
    assert part.printed.mapping == MMA
    assert all(r["passed"] for r in check_stages([part], sizes, 5, TILES))


@pytest.mark.parametrize("mask, extra, nq", [
    ("j + W >= Nk", {"W": 200}, 1),     # a window over the cache's end: the first splits see no live key
    ("j <= i + Nk - Nq", {}, 5),         # speculative decoding: each new row sees the cache and the rows before it
])
def test_mma_partial_fold_under_a_key_mask(mask, extra, nq):
    dyn = "{B: dynamic, H: dynamic, Nq: dynamic, Nk: dynamic, D: 128" + "".join(f", {k}: dynamic" for k in extra) + "}"
    prog = decode_variant(8, mask, dyn)
    for nk in (1100, 70):
        sizes = {"B": 1, "H": 2, "Nq": nq, "Nk": nk, "D": 128, **extra}
        found = stages(prog, "decode", sizes, 1)
        assert found[0].printed.mapping == MMA
        assert all(r["passed"] for r in check_stages(found, sizes, 6, TILES))
