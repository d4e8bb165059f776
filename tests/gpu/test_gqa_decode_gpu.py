"""Grouped-query decode with packed rows on the GPU: one block per (split, query tile, K / V
head, batch) holds the G query heads of a group times q_rows query rows in its mma tile's rows,
so each K / V tile is read once per K / V head (examples/decode_splitkv_gqa.yaml, Nq = 1;
examples/decode_splitkv_nq.yaml, speculative decoding's Nq new rows, bottom-right causal: row i
sees keys j <= Nk - Nq + i).  Built by `derivc build` into the two-kernel chain and run through
`derivc.load`, against float64 torch on the fp16 inputs, for G = 1, 4, 8 (the spec's G set per
case, q_rows and warps chosen so the tile rows are 16 per warp), Nq = 1, 4, 16, Nk = 1, 77, 4096.

    python -m pytest -q -m gpu tests/gpu/test_gqa_decode_gpu.py
    python tests/gpu/test_gqa_decode_gpu.py        # timings vs SDPA (enable_gqa=True), same process
"""
from __future__ import annotations

import math
import re
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.gpu
GQA = ROOT / "examples" / "decode_splitkv_gqa.yaml"
NQ = ROOT / "examples" / "decode_splitkv_nq.yaml"
# (G, q_rows, warps): 16 tile rows per warp; a warp per head when q_rows = 16
TILINGS = {1: ((16, 1),), 4: ((4, 1), (16, 4)), 8: ((2, 1), (16, 8))}
BENCH_SHAPES = ((1, 32768), (8, 4096))  # (B, Nk) at H = 32 query heads over 8 K / V heads, d128
SPLITS_BENCH = (16, 32, 64)  # the examples' 16 first: B = 1 has B·HK·16 = 128 one-warp blocks only


def spec_text(g: int, q_rows: int, warps: int, splits: int = 16) -> str:
    """decode_splitkv_nq.yaml with G = g, the variant (q_rows, warps) and `splits` written in."""
    text = NQ.read_text()
    text = re.sub(r"^variants: .*\n", "", text, flags=re.M)
    text = text.replace("$q_rows", str(q_rows)).replace("$warps", str(warps))
    text = re.sub(r"G: \d+,", f"G: {g},", text, count=1)
    if g * q_rows > 64:  # the numeric checks' budget: fewer keys at the check sizes for 8 heads x 16 rows
        text = text.replace("Nk: 4100}", "Nk: 2052}")
    return with_splits(text, splits)


def with_splits(text: str, splits: int) -> str:
    return re.sub(r"splits: \d+}", f"splits: {splits}}}", text)


def tiling(g: int, nq: int) -> tuple[int, int]:
    """The smaller tile that holds Nq rows per head in one query tile, else the largest."""
    for q_rows, warps in TILINGS[g]:
        if nq <= q_rows:
            return q_rows, warps
    return TILINGS[g][-1]


@lru_cache(maxsize=None)
def load_text(text: str, stem: str):
    import derivc
    from compiler.cli import build_to

    src = Path(tempfile.mkdtemp(prefix="derivc-gqa-src-")) / f"{stem}.yaml"
    src.write_text(text)
    out = Path(tempfile.mkdtemp(prefix="derivc-gqa-")) / stem
    build_to(src, out, seed=0, proofs=False)
    chain = derivc.load(out)
    assert [k.name for k in chain.kernels] == ["O_part", "O"]
    return chain


def load_case(g: int, nq: int):
    q_rows, warps = tiling(g, nq)
    return load_text(spec_text(g, q_rows, warps), f"decode_nq_g{g}_r{q_rows}_w{warps}")


def reference(torch, q, k, v, causal: bool):
    """q [B, HK, G, Nq, D], k / v [B, HK, Nk, D] -> float64 O [B, HK, G, Nq, D]."""
    s = torch.einsum("bhgie,bhje->bhgij", q.double(), k.double()) / math.sqrt(q.shape[-1])
    nq, nk = q.shape[3], k.shape[2]
    if causal:
        keep = torch.arange(nk, device=q.device)[None, :] <= torch.arange(nq, device=q.device)[:, None] + nk - nq
        s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("bhgij,bhjd->bhgid", torch.softmax(s, dim=-1), v.double())


@pytest.mark.parametrize("nk", [1, 77, 4096])
@pytest.mark.parametrize("nq", [1, 4, 16])
@pytest.mark.parametrize("g", [1, 4, 8])
def test_packed_decode_against_float64(torch, g, nq, nk):
    if nq > nk:
        pytest.skip("the new rows are part of the cache: Nq <= Nk")
    chain = load_case(g, nq)
    b, hk = 2, 3
    gen = torch.Generator(device="cuda").manual_seed(1000 * g + 10 * nq + nk)
    q = torch.randn(b, hk, g, nq, 128, device="cuda", generator=gen).half()
    k = torch.randn(b, hk, nk, 128, device="cuda", generator=gen).half()
    v = torch.randn(b, hk, nk, 128, device="cuda", generator=gen).half()
    o = chain(q, k, v)
    torch.cuda.synchronize()
    want = reference(torch, q, k, v, causal=True)
    assert not torch.isnan(o).any()
    err = (o.double() - want).norm() / want.norm()
    assert err < 5e-3, f"relative error {err:.3g} at G={g} Nq={nq} Nk={nk} tiling {tiling(g, nq)}"
    for hg in range(g):  # every head of the group on its own (a row paired with another head fails here)
        e = (o[:, :, hg].double() - want[:, :, hg]).norm() / want[:, :, hg].norm()
        assert e < 5e-3, f"head {hg} of the group: relative error {e:.3g}"


@pytest.mark.parametrize("b,nk", [(1, 1), (2, 77), (1, 4097)])
def test_gqa_example_against_float64(torch, b, nk):
    """examples/decode_splitkv_gqa.yaml as shipped: torch's [B, 32, 1, D] viewed [B, 8, 4, 1, D]."""
    chain = load_text(GQA.read_text(), GQA.stem)
    gen = torch.Generator(device="cuda").manual_seed(nk + 1)
    q = torch.randn(b, 8, 4, 1, 128, device="cuda", generator=gen).half()
    k = torch.randn(b, 8, nk, 128, device="cuda", generator=gen).half()
    v = torch.randn(b, 8, nk, 128, device="cuda", generator=gen).half()
    o = chain(q, k, v)
    torch.cuda.synchronize()
    want = reference(torch, q, k, v, causal=False)
    err = (o.double() - want).norm() / want.norm()
    assert err < 5e-3, f"relative error {err:.3g} at B={b} Nk={nk}"


def bench(iters: int = 50) -> None:
    """Ours vs torch SDPA (enable_gqa=True) in one process: H = 32 query / 8 K-V heads, d128,
    Nq = 1 (the GQA example, and the speculative one's tilings), 4 and 16 (the tilings that hold
    Nq rows per head in one query tile), each at 16, 32 and 64 splits; KV GB/s counts K and V
    read once."""
    import torch
    import torch.nn.functional as F

    def time_ms(fn) -> float:
        for _ in range(5):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(40_000_000)  # device time: the host queues every call while the GPU waits
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters

    print(f"{'B':>3} {'Nk':>6} {'Nq':>3} {'schedule':>14}  {'derivc ms':>9}  {'SDPA ms':>8}  {'ratio':>6}  {'KV GB/s':>8}")
    for b, nk in BENCH_SHAPES:
        k = torch.randn(b, 8, nk, 128, device="cuda").half()
        v = torch.randn(b, 8, nk, 128, device="cuda").half()
        for nq in (1, 4, 16):
            q = torch.randn(b, 32, nq, 128, device="cuda").half()
            qv = q.view(b, 8, 4, nq, 128)
            runs = [(f"gqa s{sp}", load_text(with_splits(GQA.read_text(), sp), f"{GQA.stem}_s{sp}"))
                    for sp in SPLITS_BENCH] if nq == 1 else []
            runs += [(f"r{r}w{w} s{sp}", load_text(spec_text(4, r, w, sp), f"decode_nq_g4_r{r}_w{w}_s{sp}"))
                     for r, w in TILINGS[4] if nq <= r or r == TILINGS[4][-1][0] for sp in SPLITS_BENCH]
            # the new rows' bottom-right causal mask (row i sees keys <= Nk - Nq + i); none for one row
            keep = None if nq == 1 else \
                torch.arange(nk, device="cuda")[None, :] <= torch.arange(nq, device="cuda")[:, None] + nk - nq
            try:
                sdpa = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True))
            except TypeError:  # torch < 2.5: no enable_gqa; SDPA on K / V repeated per query head
                kr, vr = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
                sdpa = time_ms(lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=keep))
                print("(torch without enable_gqa: SDPA timed on repeated K / V)")
            for name, chain in runs:
                ours = time_ms(lambda: chain(qv, k, v))
                gbs = 2 * b * 8 * nk * 128 * 2 / (ours * 1e-3) / 1e9
                print(f"{b:>3} {nk:>6} {nq:>3} {name:>14}  {ours:>9.3f}  {sdpa:>8.3f}  {sdpa / ours:>6.2f}  {gbs:>8.0f}")


if __name__ == "__main__":
    bench()
