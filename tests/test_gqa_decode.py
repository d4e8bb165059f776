"""Grouped-query decode with the group's query heads packed into the mma rows (MAP-MMA's packed
rows, the mma.sync fold printer's 'pack' role): one block per (split, query tile, K / V head,
batch) reads each K / V tile once for all G query heads of the group.

The partial-fold kernels (examples/decode_splitkv_gqa.yaml: one new row, G = 4, 4 query rows
per head in the tile; examples/decode_splitkv_nq.yaml: speculative decoding's Nq new rows,
bottom-right causal, both variants) are printed and their text run on the CPU through the
emulation against float64 — query tails, key tails (Nk not a multiple of 32), empty splits,
Nk = 1 — the chained pair is compared with attention at every query head; a packing that pairs
a row with another head's query (or writes it to another head's output) is caught; what the
printer does not implement (a mask reading the packed head) and what MAP-MMA does not accept
(packed rows out of loop order, on wgmma) are refused by name.  The mutations of the printed
packing (test_kernel_mutations.py: gqa_packed_*) make `derivc build` fail at the kernel step.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from codegen.build import CodegenError
from codegen.emu import host_compiler
from codegen.multi_kernel import check_stages, stages
from compiler.derive import DerivationError, derive
from compiler.ir import Program
from compiler.spec import parse_spec_text

pytestmark = pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler")

ROOT = Path(__file__).resolve().parents[1]
GQA = ROOT / "examples" / "decode_splitkv_gqa.yaml"
NQ = ROOT / "examples" / "decode_splitkv_nq.yaml"
TILES = {"Nk": 32}
MMA = "online_fold_mma_sync"


def variant(path: Path, **choice: int) -> str:
    """The schedule text with `variants:` resolved to one choice (the first values otherwise)."""
    text = path.read_text()
    found = re.search(r"^variants: \{(.*)\}\n", text, flags=re.M)
    if found:
        text = text.replace(found.group(0), "")
        for part in found.group(1).split("],"):
            name, values = part.split(":", 1)
            first = int(values.strip(" []").split(",")[0])
            text = text.replace("$" + name.strip(), str(choice.get(name.strip(), first)))
    return text


def final(text: str) -> Program:
    return derive(parse_spec_text(text), check=False).final


@pytest.fixture(scope="module")
def gqa() -> Program:
    return final(variant(GQA))


def packed_sizes(nq: int, nk: int, hk: int = 2) -> dict[str, int]:
    return {"B": 1, "HK": hk, "G": 4, "Nq": nq, "Nk": nk, "D": 128}


@pytest.mark.parametrize("nq, nk", [(1, 4100), (1, 1), (1, 100), (5, 77), (3, 300)])
def test_packed_gqa_kernels_pass_the_emulation(gqa, nq, nk):
    """Nk = 1 (63 empty splits of 64), Nk = 100 (60), key tails; Nq = 5: a second query tile
    holding one row per head (the packed rows 1–3 of each head past Nq are not stored)."""
    sizes = packed_sizes(nq, nk)
    found = stages(gqa, "gqa", sizes, 1)
    assert [s.printed.mapping for s in found] == [MMA, "simt"]
    assert found[0].printed.plan.pack == 4 and found[0].printed.plan.block_m == 4
    assert [ln.var for ln in found[0].kernel.lanes] == ["g", "ii", "d"]
    assert all(r["passed"] for r in check_stages(found, sizes, 3, TILES))


def test_the_grid_holds_no_query_head(gqa):
    """One block per (split and query tile, K / V head, batch): B·HK·64 blocks for one row, a
    quarter of the per-query-head grid; K and V are read at hk only."""
    part = stages(gqa, "gqa", packed_sizes(1, 300), 1)[0]
    assert [g.var for g in part.kernel.grid] == ["b", "hk", "ks", "io"]
    plan = part.printed.plan
    assert "pack" not in plan.k.roles and "pack" not in plan.v.roles
    assert plan.q.roles == ("b", "hk", "pack", "seq", "head") and plan.o.roles[2] == "pack"


@pytest.mark.parametrize("q_rows, warps, nq, nk", [(4, 1, 5, 77), (4, 1, 2, 4100), (16, 4, 16, 77),
                                                   (16, 4, 7, 33), (16, 4, 1, 1)])
def test_speculative_rows_pass_the_emulation(q_rows, warps, nq, nk):
    """Nq new rows, bottom-right causal (row i sees keys j <= Nk - Nq + i): 16 rows on one warp
    or 64 on four (a warp per head); the mask cuts the last key tile per row, splits past the
    cache are empty, Nk = Nq = 1 is plain decode."""
    prog = final(variant(NQ, q_rows=q_rows, warps=warps))
    sizes = packed_sizes(nq, nk)
    found = stages(prog, "nq", sizes, 1)
    assert found[0].printed.mapping == MMA and found[0].printed.plan.warps == warps
    assert all(r["passed"] for r in check_stages(found, sizes, 4, TILES))


@pytest.mark.parametrize("g, q_rows, warps, nq, nk", [(1, 16, 1, 5, 77), (8, 2, 1, 1, 100), (8, 16, 8, 3, 33)])
def test_other_group_sizes_pass_the_emulation(g, q_rows, warps, nq, nk):
    """G = 1 (a packed extent of one: the unpacked tile), G = 8 with 2 rows per head on one warp
    and 16 rows per head on eight warps."""
    text = re.sub(r"G: \d+,", f"G: {g},", variant(NQ, q_rows=q_rows, warps=warps), count=1)
    sizes = {**packed_sizes(nq, nk), "G": g}
    found = stages(final(text), "nq", sizes, 1)
    assert found[0].printed.mapping == MMA and found[0].printed.plan.pack == g
    assert all(r["passed"] for r in check_stages(found, sizes, 4, TILES))


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """float64 attention of every query head against its group's K / V head."""
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    s = np.einsum("bhgie,bhje->bhgij", q64, k64) / np.sqrt(q.shape[-1])
    nq, nk = q.shape[3], k.shape[2]
    if causal:
        s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhgij,bhjd->bhgid", p / p.sum(-1, keepdims=True), v64)


@pytest.mark.parametrize("path, nq, causal", [(GQA, 1, False), (NQ, 4, True)])
def test_chained_kernels_are_attention_at_every_head(path, nq, causal):
    """The partial kernel's own outputs fed to the combine, against float64 per query head: a
    row paired with another head's query or K / V head would fail here."""
    from codegen.emu.run import run_printed

    sizes = packed_sizes(nq, 300)
    part, combine = stages(final(variant(path)), "chain", sizes, 1)
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 2, 4, nq, 128)).astype(np.float16)
    k, v = (rng.standard_normal((1, 2, 300, 128)).astype(np.float16) for _ in range(2))
    o = np.asarray(run_printed(combine.printed, 0, list(run_printed(part.printed, 0, [q, k, v]))), np.float64)
    want = reference(q, k, v, causal)
    for hk in range(2):
        for g in range(4):
            err = np.linalg.norm(o[0, hk, g] - want[0, hk, g]) / np.linalg.norm(want[0, hk, g])
            assert err < 2e-3, (hk, g, err)


def test_a_packing_that_reads_another_heads_query_is_caught(gqa, monkeypatch):
    """The printer's row -> (head, query row) split mutated to head = r mod G (column-major for a
    row-major packing): every live row of Nq = 1 reads and writes head 0."""
    from codegen.mappings import render

    real = render._packed_rows

    def column_major(p, rows_w):
        ctx = real(p, rows_w)
        return {**ctx, "row_off": lambda r, ld, ldp: f"((long long)(({r}) % {p.pack}) * ({ldp}) + "
                                                      f"(long long)(({r}) % {p.block_m}) * ({ld}))"}

    monkeypatch.setattr(render, "_packed_rows", column_major)
    sizes = packed_sizes(1, 100)
    with pytest.raises(CodegenError, match="kernel O_part"):
        check_stages(stages(gqa, "gqa", sizes, 1)[:1], sizes, 3, TILES)


def test_a_mask_reading_the_packed_head_is_refused():
    text = variant(GQA).replace("softmax(j: S[b, hk, g, i, j])", "softmax(j | j + g < Nk: S[b, hk, g, i, j])")
    with pytest.raises(CodegenError, match="reads the packed head g: not implemented"):
        stages(final(text), "gqa", packed_sizes(1, 100), 1)


@pytest.mark.parametrize("edit, reason", [
    ("m: [g, ii]}", "m: [ii, g]}", ),
    ("instr: mma_sync, m: [g, ii]}", "instr: wgmma, m: [g, ii]}"),
])
def test_map_mma_refuses_packed_rows_it_does_not_implement(edit, reason):
    """Packed rows are read row-major in loop-nest order (row q_rows·g + ii) and on mma.sync only."""
    text = variant(GQA).replace(edit, reason)
    want = "not in the loop-nest order" if "ii, g" in reason else "packed rows .* mma_sync only|wgmma"
    with pytest.raises(DerivationError, match=want):
        derive(parse_spec_text(text), check=False)


def test_a_mask_at_the_head_index_instead_of_the_query_row_is_caught(monkeypatch):
    """The causal mask of packed row r must test query row q0 + r mod q_rows; printed at r / q_rows
    (the head) instead, rows see the wrong keys."""
    from codegen.mappings import render

    real = render._packed_rows

    def row_of_the_head(p, rows_w):
        return {**real(p, rows_w), "qrow": lambda r: f"(q0 + ({r}) / {p.block_m})"}

    monkeypatch.setattr(render, "_packed_rows", row_of_the_head)
    sizes = packed_sizes(4, 77)
    prog = final(variant(NQ))
    with pytest.raises(CodegenError, match="kernel O_part"):
        check_stages(stages(prog, "nq", sizes, 1)[:1], sizes, 4, TILES)
