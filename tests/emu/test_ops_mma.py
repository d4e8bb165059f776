"""ldmatrix .x4 (.trans) and mma.sync m16n8k16 of derivc_emu_ops.h against numpy models of the
PTX ISA fragment layouts (index formulas, lane l = 4 g + q), and the template macros of
codegen/templates/constructs/mma.cu.j2 (ldsm_a / ldsm_b_nk / ldsm_b_kn) composed with them."""
from __future__ import annotations

import numpy as np
import pytest

from emu_ops_testing import (G, LANES, Q, OpsError, a_fragment, b_fragment, c_fragment_index,
                             matmul_k_order, pack, random_elements, to_f32)


# ------------------------------------------------------------------------------ ldmatrix

def ldmatrix_model(smem: np.ndarray, addr: np.ndarray, trans: bool) -> np.ndarray:
    rows = np.stack([smem[a:a + 16].view(np.uint16) for a in addr])   # row l%8 of matrix l/8
    mats = rows.reshape(4, 8, 8)
    if trans:
        mats = mats.transpose(0, 2, 1)
    return np.stack([pack(mats[i, G, 2 * Q], mats[i, G, 2 * Q + 1]) for i in range(4)], axis=1)


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_scattered_rows(ops, trans):
    rng = np.random.default_rng(10 + trans)
    for _ in range(20):
        smem = rng.integers(0, 256, 4096, dtype=np.uint8)
        addr = rng.permutation(4096 // 16)[:32].astype(np.uint32) * 16
        assert np.array_equal(ops.ldmatrix(smem, addr, trans), ldmatrix_model(smem, addr, trans))


def test_ldmatrix_refuses_misaligned_and_out_of_window(ops):
    smem = np.zeros(1024, dtype=np.uint8)
    addr = np.arange(32, dtype=np.uint32) * 16
    bad = addr.copy()
    bad[5] += 8
    with pytest.raises(OpsError, match="aligned"):
        ops.ldmatrix(smem, bad, False)
    bad = addr.copy()
    bad[31] = 1024
    with pytest.raises(OpsError, match="outside"):
        ops.ldmatrix(smem, bad, True)


# ------------------------------------------------------------------------------ mma.sync

@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_m16n8k16(ops, dtype):
    rng = np.random.default_rng(20 + (dtype == "bf16"))
    row, col = c_fragment_index()
    for _ in range(20):
        A, B = random_elements(rng, (16, 16), dtype), random_elements(rng, (16, 8), dtype)
        C = rng.standard_normal((16, 8)).astype(np.float32)
        got = ops.mma(dtype, a_fragment(A), b_fragment(B), C[row, col])
        want = matmul_k_order(to_f32(A, dtype), to_f32(B, dtype), C)
        assert np.array_equal(got.view(np.uint32), want[row, col].view(np.uint32))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_from_template_ldmatrix_addressing(ops, dtype):
    """A [row][k] through ldsm_a, B [n][k] through ldsm_b_nk and B [k][n] through ldsm_b_kn
    (.trans), as mma.cu.j2 computes the lane addresses; the fragments feed mma_m16n8k16, which must
    give A B for both n-tiles."""
    rng = np.random.default_rng(30 + (dtype == "bf16"))
    lane = LANES
    A, B = random_elements(rng, (16, 16), dtype), random_elements(rng, (16, 16), dtype)  # B: k x n
    ld = 24                                            # padded row (elements), 16-byte multiple
    sA = np.zeros((16, ld), np.uint16); sA[:, :16] = A
    sBnk = np.zeros((16, ld), np.uint16); sBnk[:, :16] = B.T
    sBkn = np.zeros((16, ld), np.uint16); sBkn[:, :16] = B
    smem = np.concatenate([s.reshape(-1) for s in (sA, sBnk, sBkn)]).view(np.uint8)
    tile = 16 * ld * 2
    off = lambda r, c: 2 * (r * ld + c)               # noqa: E731 - the templates' off(row, col)
    a = ops.ldmatrix(smem, off(lane & 15, (lane >> 4) << 3), False)
    b_nk = ops.ldmatrix(smem, tile + off((lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) << 3), False)
    b_kn = ops.ldmatrix(smem, 2 * tile + off((lane & 7) + (((lane >> 3) & 1) << 3), (lane >> 4) << 3), True)
    assert np.array_equal(a, a_fragment(A))
    row, col = c_fragment_index()
    want = matmul_k_order(to_f32(A, dtype), to_f32(B, dtype), np.zeros((16, 16), np.float32))
    for b in (b_nk, b_kn):
        for nt in range(2):
            assert np.array_equal(b[:, 2 * nt:2 * nt + 2], b_fragment(B[:, 8 * nt:8 * nt + 8]))
            got = ops.mma(dtype, a, b[:, 2 * nt:2 * nt + 2], np.zeros((32, 4), np.float32))
            assert np.array_equal(got, want[:, 8 * nt:8 * nt + 8][row, col])
