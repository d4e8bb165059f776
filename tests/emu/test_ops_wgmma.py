"""wgmma m64nNk16 of derivc_emu_ops.h against numpy models:

- the canonical shared-memory layouts of the PTX ISA, in the CuTe notation make_gmma_desc states
  them (a layout ((shape)):((stride)) in elements, T = 8 elements = 16 bytes, L / S the
  descriptor's leading / stride byte offsets, then Swizzle<b, 4, 3> on the byte address),
  evaluated literally for every swizzle mode, K-major and MN-major, A from shared memory or
  registers, every N our templates use, both dtypes;
- the tile layouts and descriptor arithmetic the templates' comments and code state
  (constructs/wgmma.cu.j2, wgmma_attn.cu.j2, contraction_wgmma.cu.j2, online_fold_wgmma.cu.j2).
"""
from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from emu_ops_testing import OpsError, a_fragment, matmul_k_order, random_elements, to_f32

T = 8
LAYOUT_CODE = {0: 0, 128: 1, 64: 2, 32: 3}
# (major, swizzle span) -> (mn shape, mn stride), (k shape, k stride); None: the rest of the extent
CANONICAL = {
    ("K", 0): (((8, None), (T, "S")), ((T, 2), (1, "L"))),
    ("K", 32): (((8, None), (2 * T, "S")), ((T, 2), (1, T))),
    ("K", 64): (((8, None), (4 * T, "S")), ((T, 2), (1, T))),
    ("K", 128): (((8, None), (8 * T, "S")), ((T, 2), (1, T))),
    ("MN", 0): (((T, 1, None), (1, T, "S")), ((8, None), (T, "L"))),
    ("MN", 32): (((T, 2, None), (1, T, "L")), ((8, None), (2 * T, "S"))),
    ("MN", 64): (((T, 4, None), (1, T, "L")), ((8, None), (4 * T, "S"))),
    ("MN", 128): (((T, 8, None), (1, T, "L")), ((8, None), (8 * T, "S"))),
}


def mode_offset(index: np.ndarray, shape: tuple, stride: tuple, lbo: int, sbo: int) -> np.ndarray:
    """Offset (elements) of a 1-d index in one hierarchical mode, first sub-mode fastest."""
    off = np.zeros_like(index)
    rest = index
    for size, st in zip(shape, stride):
        st = {"L": lbo // 2, "S": sbo // 2}.get(st, st)
        coord = rest if size is None else rest % size
        off = off + coord * st
        rest = rest if size is None else rest // size
    return off


def swizzle(addr: np.ndarray, span: int) -> np.ndarray:
    bits = {0: 0, 32: 1, 64: 2, 128: 3}[span]
    mask = ((1 << bits) - 1) << 7                     # Swizzle<bits, 4, 3>: yyy at bit 7, to bit 4
    return addr ^ ((addr & mask) >> 3)


def canonical_addresses(major: str, span: int, rows: int, start: int, lbo: int, sbo: int) -> np.ndarray:
    """[rows][16] byte addresses of element (mn, k) of an operand tile."""
    (mn_shape, mn_stride), (k_shape, k_stride) = CANONICAL[(major, span)]
    mn, k = np.meshgrid(np.arange(rows), np.arange(16), indexing="ij")
    off = mode_offset(mn, mn_shape, mn_stride, lbo, sbo) + mode_offset(k, k_shape, k_stride, lbo, sbo)
    return swizzle(start + 2 * off, span)


def descriptor(start: int, lbo: int, sbo: int, span: int) -> int:
    return (start >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (LAYOUT_CODE[span] << 62)


def accumulator_index(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of d[t][i], t = 32 w + 4 g + q, i = 4 j + e."""
    t, i = np.meshgrid(np.arange(128), np.arange(n // 2), indexing="ij")
    w, g, q, j, e = t // 32, (t % 32) // 4, t % 4, i // 4, i % 4
    return 16 * w + g + 8 * (e >> 1), 8 * j + 2 * q + (e & 1)


def place(smem16: np.ndarray, addr: np.ndarray, values: np.ndarray) -> None:
    assert len(np.unique(addr)) == addr.size, "model layout overlaps itself"
    smem16[addr.reshape(-1) // 2] = values.reshape(-1)


def operand_params(rng: np.random.Generator, major: str, span: int, rows: int) -> tuple[int, int, int]:
    """(start offset inside the region, LBO, SBO): canonical strides, padded or reordered at random;
    a stride the layout does not use gets a junk value."""
    groups = rows // 8
    if major == "K" and span == 0:                  # core matrices 128 B: (row group, k chunk)
        lbo, sbo = [(128, 256 * rng.integers(1, 3)), (groups * 128, 128)][rng.integers(2)]
        return 0, lbo, sbo
    if major == "K":                                # rows of `span` bytes; k-step j at +32 j
        return 32 * int(rng.integers(span // 32)), 0x3FFF0, 8 * span * int(rng.integers(1, 3))
    panels = -(-rows // (T if span == 0 else span // 2))
    if span == 0:                                   # core matrices 8 k rows x 8 mn
        sbo, lbo = [(128 * rng.integers(1, 3), 128 * 2 * panels), (256, 128)][rng.integers(2)]
        return 0, lbo, sbo
    sbo, lbo = [(8 * span, 16 * span * int(rng.integers(1, 3))), (8 * span * panels, 8 * span)][rng.integers(2)]
    return 0, lbo, sbo


N_VALUES = [8, 24, 64, 128, 256]
CASES = [c for c in itertools.product(["f16", "bf16"], N_VALUES, ["K", "MN", "regs"], ["K", "MN"], [0, 32, 64, 128])]


@pytest.mark.parametrize("dtype,n,a_major,b_major,span", CASES)
def test_wgmma_canonical_layouts(ops, dtype, n, a_major, b_major, span):
    rng = np.random.default_rng(zlib.crc32(repr((dtype, n, a_major, b_major, span)).encode()))
    size, b_region = 1 << 18, 1 << 16
    smem = rng.integers(0, 2**16, size // 2, dtype=np.uint16)       # garbage around the operands
    A, B = random_elements(rng, (64, 16), dtype), random_elements(rng, (16, n), dtype)
    a_span = [0, 32, 64, 128][rng.integers(4)]                       # A's mode differs from B's
    b_start, b_lbo, b_sbo = operand_params(rng, b_major, span, n)
    place(smem, canonical_addresses(b_major, span, n, b_region + b_start, b_lbo, b_sbo), B.T)
    desc_b = descriptor(b_region + b_start, b_lbo, b_sbo, span)
    a_regs, desc_a = None, 0
    if a_major == "regs":
        a_regs = np.concatenate([a_fragment(A[16 * w:16 * w + 16]) for w in range(4)])
    else:
        a_start, a_lbo, a_sbo = operand_params(rng, a_major, a_span, 64)
        place(smem, canonical_addresses(a_major, a_span, 64, a_start, a_lbo, a_sbo), A)
        desc_a = descriptor(a_start, a_lbo, a_sbo, a_span)
    row, col = accumulator_index(n)
    for scale_d in (1, 0):
        C = rng.standard_normal((64, n)).astype(np.float32)
        got = ops.wgmma(dtype, n, smem.view(np.uint8), desc_a, a_regs, desc_b, int(a_major == "MN"),
                        int(b_major == "MN"), scale_d, C[row, col])
        want = matmul_k_order(to_f32(A, dtype), to_f32(B, dtype), C if scale_d else np.zeros_like(C))
        assert np.array_equal(got.view(np.uint32), want[row, col].view(np.uint32))


def test_wgmma_refuses_bad_operands(ops):
    smem = np.zeros(1 << 16, np.uint8)
    good = descriptor(0, 16, 1024, 128)
    cases = [
        (dict(n=12), "N = 12"),
        (dict(desc_a=good | (1 << 49)), "base offset"),
        (dict(desc_b=good | (1 << 14)), "reserved"),
        (dict(desc_a=descriptor(128, 16, 1024, 128)), "repeat"),
        (dict(desc_b=descriptor(1 << 16, 16, 1024, 128)), "outside"),
        (dict(a_regs=np.zeros((128, 4), np.uint32), tnsp_a=1), "registers"),
    ]
    for change, message in cases:
        args = dict(n=64, desc_a=good, a_regs=None, desc_b=good, tnsp_a=0, tnsp_b=0)
        args.update(change)
        with pytest.raises(OpsError, match=message):
            ops.wgmma("f16", args["n"], smem, args["desc_a"], args["a_regs"], args["desc_b"],
                      args["tnsp_a"], args["tnsp_b"], 1, np.zeros((128, args["n"] // 2), np.float32))


# ------------------------------------------------------------------ the templates' own layouts

def swz(r: np.ndarray, cc: np.ndarray) -> np.ndarray:
    """constructs/wgmma.cu.j2 swz(r, cc): byte offset of 16-byte chunk cc of row r."""
    return (r << 7) + ((cc ^ (r & 7)) << 4)


def k_major_tile_offsets(rows: int, k: int) -> np.ndarray:
    """[rows][k] byte offsets of a K-major tile: [k/64 panel][row][64 k], 128-byte swizzle."""
    r, kk = np.meshgrid(np.arange(rows), np.arange(k), indexing="ij")
    return (kk // 64) * rows * 128 + swz(r, (kk % 64) // 8) + (kk % 8) * 2


def mn_major_tile_offsets(k: int, n: int) -> np.ndarray:
    """[k][n] byte offsets of an MN-major tile: [n/64 panel][k row][64 n], 128-byte swizzle."""
    kk, c = np.meshgrid(np.arange(k), np.arange(n), indexing="ij")
    return (c // 64) * k * 128 + swz(kk, (c % 64) // 8) + (c % 8) * 2


def wg_desc(addr: int, lbo: int, sbo: int) -> int:
    return ((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32) | (1 << 62)


GEMM_CASES = [(dt, kn, wn_size, wm, wn, mi)
              for dt in ("f16", "bf16") for kn in (False, True)
              for wn_size, wm, wn, mi in [(64, 1, 1, 1), (128, 1, 1, 1), (256, 0, 0, 2)]]


@pytest.mark.parametrize("dtype,kn,WN,wm,wn,MI", GEMM_CASES)
def test_wgmma_gemm_template_tile(ops, dtype, kn, WN, wm, wn, MI):
    """contraction_wgmma.cu.j2: warpgroup (wm, wn) of a BM x BN x BK block tile, MI row tiles of
    64, BK / 16 k-steps; descriptors advanced as the template adds them (16-byte units)."""
    rng = np.random.default_rng(7 * WN + 3 * kn + (dtype == "bf16"))
    WM, BK = 64 * MI, 128
    BM, BN = WM * (wm + 1), WN * (wn + 1)
    A, B = random_elements(rng, (BM, BK), dtype), random_elements(rng, (BK, BN), dtype)
    sA = 0
    sB = -(-BM * BK * 2 // 1024) * 1024
    smem = rng.integers(0, 2**16, (sB + BK * BN * 2 + 4096) // 2, dtype=np.uint16)
    smem[(sA + k_major_tile_offsets(BM, BK)) // 2] = A
    if kn:
        smem[(sB + mn_major_tile_offsets(BK, BN)) // 2] = B
    else:
        smem[(sB + k_major_tile_offsets(BN, BK)) // 2] = B.T
    dA = wg_desc(sA + wm * WM * 128, 16, 1024)
    dB = (wg_desc(sB + wn * (WN // 64) * BK * 128, BK * 128, 1024) if kn
          else wg_desc(sB + wn * WN * 128, 16, 1024))
    row, col = accumulator_index(WN)
    acc = [np.zeros((128, WN // 2), np.float32) for _ in range(MI)]
    for ks in range(BK // 16):
        for mi in range(MI):
            da = dA + (ks >> 2) * BM * 8 + mi * 64 * 8 + (ks & 3) * 2
            db = dB + ks * 16 * 8 if kn else dB + (ks >> 2) * BN * 8 + (ks & 3) * 2
            acc[mi] = ops.wgmma(dtype, WN, smem.view(np.uint8), da, None, db, 0, int(kn), int(ks > 0), acc[mi])
    Af, Bf = to_f32(A, dtype), to_f32(B, dtype)
    for mi in range(MI):
        r0, c0 = wm * WM + mi * 64, wn * WN
        want = matmul_k_order(Af[r0:r0 + 64], Bf[:, c0:c0 + WN], np.zeros((64, WN), np.float32))
        assert np.array_equal(acc[mi], want[row, col])


ATTN_CASES = list(itertools.product(["f16", "bf16"], [64, 128], [64, 128], [0, 1]))


@pytest.mark.parametrize("dtype,D,BN,cw", ATTN_CASES)
def test_wgmma_attention_template_tiles(ops, dtype, D, BN, cw):
    """online_fold_wgmma.cu.j2: S = Q K^T (Q rows 64 cw.. of a 128-row tile, K-major, BN keys),
    then O = P V with P from registers packed from S's accumulator layout as wgmma_attn.cu.j2's
    pack_p does (a_r = d[8 kk + 2r], d[8 kk + 2r + 1]) and V stored [key][d] (MN-major)."""
    rng = np.random.default_rng(D * 1000 + BN * 10 + cw + (dtype == "bf16"))
    BM = 128
    Q, K = random_elements(rng, (BM, D), dtype), random_elements(rng, (BN, D), dtype)
    V, P = random_elements(rng, (BN, D), dtype), random_elements(rng, (64, BN), dtype)
    sQ, sK = 0, BM * D * 2
    sV = sK + 2 * BN * D * 2                     # two K slots: slot 1 is used
    smem = rng.integers(0, 2**16, (sV + 2 * BN * D * 2) // 2, dtype=np.uint16)
    kv_stage = BN * D * 2
    smem[(sQ + k_major_tile_offsets(BM, D)) // 2] = Q
    smem[(sK + kv_stage + k_major_tile_offsets(BN, D)) // 2] = K
    smem[(sV + kv_stage + mn_major_tile_offsets(BN, D)) // 2] = V
    dQ, dK, dV = (wg_desc(sQ + cw * 64 * 128, 16, 1024), wg_desc(sK, 16, 1024) + kv_stage // 16,
                  wg_desc(sV, BN * 128, 1024) + kv_stage // 16)
    s = np.zeros((128, BN // 2), np.float32)
    for ks in range(D // 16):
        s = ops.wgmma(dtype, BN, smem.view(np.uint8), dQ + (ks >> 2) * BM * 8 + (ks & 3) * 2, None,
                      dK + (ks >> 2) * BN * 8 + (ks & 3) * 2, 0, 0, int(ks > 0), s)
    row, col = accumulator_index(BN)
    Qf, Kf = to_f32(Q, dtype), to_f32(K, dtype)
    want_s = matmul_k_order(Qf[64 * cw:64 * cw + 64], Kf.T, np.zeros((64, BN), np.float32))
    assert np.array_equal(s, want_s[row, col])
    p = P[row, col].astype(np.uint32)            # P in S's accumulator positions, as bits
    o = np.zeros((128, D // 2), np.float32)
    for kk in range(BN // 16):
        pa = np.stack([p[:, 8 * kk + 2 * r] | (p[:, 8 * kk + 2 * r + 1] << 16) for r in range(4)], axis=1)
        o = ops.wgmma(dtype, D, smem.view(np.uint8), 0, pa, dV + kk * 128, 0, 1, int(kk > 0), o)
    row, col = accumulator_index(D)
    want_o = matmul_k_order(to_f32(P, dtype), to_f32(V, dtype), np.zeros((64, D), np.float32))
    assert np.array_equal(o, want_o[row, col])
