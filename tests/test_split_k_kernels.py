"""SPLIT-K's two kernels (examples/gemm_splitk.yaml): the partial sums on the wgmma GEMM mapping
(split ks's k tiles S·kt + ks, the bound read from the kernel IR), then the combine on SIMT,
each lowered, validated against its cut of the program, printed, and its text run on the CPU
through the emulation against float64 — at the example's check sizes, with empty splits (K = 100:
2 tiles over 8 splits; K = 1) and tails — and a partial kernel printed without the split's
offset caught by the emulation.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from codegen.build import CodegenError
from codegen.emu import host_compiler
from codegen.multi_kernel import check_stages, stages
from compiler.derive import derive
from compiler.spec import parse_spec_text

pytestmark = pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler")

ROOT = Path(__file__).resolve().parents[1]
GEMM = ROOT / "examples" / "gemm_splitk.yaml"
TILES = {"M": 128, "N": 256, "K": 64}


def final_program(splits: int):
    text = GEMM.read_text().replace("index: ko, splits: 4}", f"index: ko, splits: {splits}}}")
    return derive(parse_spec_text(text), check=False).final


@pytest.fixture(scope="module")
def final():
    return final_program(4)


def test_partial_on_wgmma_combine_on_simt(final):
    sizes = {"M": 150, "N": 270, "K": 300}
    found = stages(final, "gemm_splitk", sizes, 1)
    assert [s.name for s in found] == ["C_part", "C"]
    assert [s.printed.mapping for s in found] == ["contraction_wgmma", "simt"]
    plan = found[0].printed.plan
    assert plan.k_split is not None and plan.k_split.splits == 4 and plan.guard_k
    assert [g.axis for g in plan.grid] == ["z", "y", "x"]
    for v in found[0].printed.variants:  # the cp.async and the TMA kernel: split ks's tiles
        assert "* 4 + (int)bi_splits_" in v.source.source
    assert [t.name for t in found[1].kernel.inputs] == ["C_part"]


@pytest.mark.parametrize("splits,k", [(4, 300), (8, 100), (3, 1)])
def test_both_kernels_pass_the_emulation(splits, k):
    """Tails in M, N and K; 8 splits of 2 tiles (six empty: one zero-filled tile, zeros
    written); K = 1."""
    prog = final_program(splits)
    sizes = {"M": 150, "N": 270, "K": k}
    found = stages(prog, "gemm_splitk", sizes, 1)
    records = check_stages(found, sizes, 3, TILES)
    assert all(r["passed"] for r in records)


def test_a_partial_kernel_without_the_split_offset_is_caught(final, monkeypatch):
    """The partial kernel printed with every block reading the tiles of split 0: the emulation
    disagrees with the program."""
    from codegen.mappings import render_wgmma

    orig = render_wgmma._context

    def bad(p, tma=False):
        ctx = orig(p, tma)
        ctx["split_index"] = "0"
        return ctx

    monkeypatch.setattr(render_wgmma, "_context", bad)
    sizes = {"M": 150, "N": 270, "K": 300}
    found = stages(final, "gemm_splitk", sizes, 1)
    with pytest.raises(CodegenError, match="kernel C_part"):
        check_stages(found[:1], sizes, 3, TILES)


def test_the_two_kernels_chained_on_the_cpu_are_the_product(final):
    """End to end as the GPU runs them: the partial kernel's f32 workspace fed to the combine,
    against the float64 product; the combine gives the same bits twice (split order fixed)."""
    from codegen.emu.run import run_printed

    sizes = {"M": 130, "N": 260, "K": 150}
    part, combine = stages(final, "gemm_splitk", sizes, 1)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((130, 150)).astype(np.float16)
    b = rng.standard_normal((150, 260)).astype(np.float16)
    ws = run_printed(part.printed, 0, [a, b])
    ws = ws[0] if isinstance(ws, tuple) else ws
    assert ws.shape == (4, 130, 260) and ws.dtype == np.float32
    assert np.all(ws[3] == 0) and np.all(ws[2] != 0)  # 3 tiles of 64 over 4 splits: split 3 is empty
    c = run_printed(combine.printed, 0, [ws])
    c = c[0] if isinstance(c, tuple) else c
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(np.asarray(c, np.float64) - want) / np.linalg.norm(want) < 2e-3
    again = run_printed(combine.printed, 0, [ws])
    again = again[0] if isinstance(again, tuple) else again
    assert np.array_equal(np.asarray(c).view(np.uint16), np.asarray(again).view(np.uint16))


def test_a_mma_sync_partial_is_refused_by_name(final):
    from codegen.mappings.contraction import _print

    k = stages(final, "gemm_splitk", {"M": 150, "N": 270, "K": 300}, 1)[0].printed.kernel
    red = k.body[0].state[0].update.b
    mma = replace(red.mma, instr="mma_sync")
    loop = k.body[0]
    acc = replace(loop.state[0], update=replace(loop.state[0].update, b=replace(red, mma=mma)))
    k2 = replace(k, body=(replace(loop, state=(acc,)), *k.body[1:]))
    from codegen.kir.lower import UnsupportedMapping

    with pytest.raises(UnsupportedMapping, match="split-K partial sums"):
        _print(k2, (), "mma_sync")
