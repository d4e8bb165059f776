"""f16 / bf16 conversions of derivc_emu_ops.h against numpy (f16) and a nearest-value model
written from IEEE 754 round-to-nearest-even (bf16), plus the cvt.rn.{f16,bf16}x2.f32 pack order."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

CANONICAL_NAN = 0x7FFF
EDGES = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65519.996, 65520.0, -65520.0, 65536.0, 1e30,
                  np.inf, -np.inf, 2.0**-14, 2.0**-14 * (1 - 2.0**-12), 2.0**-24, 2.0**-25,
                  2.0**-25 * (1 + 2.0**-20), 3 * 2.0**-25, 5 * 2.0**-25, 2.0**-26, 1e-45,
                  np.finfo(np.float32).max, np.finfo(np.float32).tiny, 1 + 2.0**-11,
                  1 + 3 * 2.0**-11, 2049.0, 2051.0], dtype=np.float32)


def f16_model(x: np.ndarray) -> np.ndarray:
    """numpy's float32 -> float16 (round to nearest even); NaN -> the canonical NaN."""
    with np.errstate(over="ignore"):
        out = x.astype(np.float16).view(np.uint16)
    return np.where(np.isnan(x), np.uint16(CANONICAL_NAN), out)


@np.errstate(invalid="ignore")
def bf16_model(x: np.ndarray) -> np.ndarray:
    """bf16 by definition: the nearer of the two bf16 neighbours of x (computed in float64, inf
    standing for 2^128, the next step past the largest finite bf16), ties to the even pattern."""
    bits = x.view(np.uint32)
    lo = (bits >> 16).astype(np.uint32)                         # truncation toward zero
    hi = lo + 1

    def value(b: np.ndarray) -> np.ndarray:
        mag = (b & 0x7FFF).astype(np.uint32)
        v = (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return np.where(mag == 0x7F80, np.copysign(2.0**128, v), v)
    xv = np.abs(x.astype(np.float64))
    d_lo, d_hi = np.abs(xv - np.abs(value(lo))), np.abs(np.abs(value(hi)) - xv)
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (lo & 1 == 1))
    out = np.where(pick_hi, hi, lo).astype(np.uint16)
    exact_special = np.isinf(x) | (x == 0)
    out = np.where(exact_special, lo.astype(np.uint16), out)
    return np.where(np.isnan(x), np.uint16(CANONICAL_NAN), out)


def random_f32(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def test_f16_edges(ops):
    assert np.array_equal(ops.convert("f32_to_f16", EDGES), f16_model(EDGES))
    assert np.array_equal(ops.convert("f32_to_f16", -EDGES), f16_model(-EDGES))


def test_f16_random_bit_patterns(ops):
    x = random_f32(1 << 20, 1)
    assert np.array_equal(ops.convert("f32_to_f16", x), f16_model(x))
    # the f16 range densely: every exponent from subnormal to overflow
    rng = np.random.default_rng(2)
    y = (rng.uniform(-1, 1, 1 << 18) * 2.0 ** rng.integers(-27, 17, 1 << 18)).astype(np.float32)
    assert np.array_equal(ops.convert("f32_to_f16", y), f16_model(y))


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=64))
def test_f16_hypothesis(ops, xs):
    x = np.array(xs, dtype=np.float32)
    assert np.array_equal(ops.convert("f32_to_f16", x), f16_model(x))


def test_f16_to_f32_every_pattern(ops):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = ops.convert("f16_to_f32", h)
    want = h.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_bf16_edges(ops):
    ties = np.array([0x3F808000, 0x3F818000, 0x7F7F8000, 0x7F7F7FFF, 0x00008000, 0x00018000,
                     0x80008000, 0xFF7F8000, 0x7F800000, 0x7FC00000, 0xFFFFFFFF, 0x00000001],
                    dtype=np.uint32).view(np.float32)
    x = np.concatenate([EDGES, -EDGES, ties])
    got = ops.convert("f32_to_bf16", x)
    assert np.array_equal(got, bf16_model(x))
    assert list(got[-12:-6]) == [0x3F80, 0x3F82, 0x7F80, 0x7F7F, 0x0000, 0x0002]


def test_bf16_random_bit_patterns(ops):
    x = random_f32(1 << 20, 4)
    assert np.array_equal(ops.convert("f32_to_bf16", x), bf16_model(x))


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=64))
def test_bf16_hypothesis(ops, xs):
    x = np.array(xs, dtype=np.float32)
    assert np.array_equal(ops.convert("f32_to_bf16", x), bf16_model(x))


def test_bf16_to_f32_every_pattern(ops):
    h = np.arange(1 << 16, dtype=np.uint32)
    got = ops.convert("bf16_to_f32", h.astype(np.uint16))
    assert np.array_equal(got.view(np.uint32), h << 16)


def test_pack_order_first_source_upper_half(ops):
    assert ops.pack("f16", 1.0, 2.0) == 0x3C00_4000
    assert ops.pack("bf16", 1.0, -2.0) == 0x3F80_C000
    assert ops.pack("f16", 65520.0, 2.0**-25 * 3) == 0x7C00_0002
