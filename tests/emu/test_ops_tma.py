"""TMA tile loads (derivc_emu_ops.h tma_load_tile) through maps from codegen/emu/tensor_map.py,
against a numpy model: the box at signed coords (innermost first), zeros outside the tensor,
written row after row, 16-byte chunk c of each 128-byte shared row r moved to c ^ (r % (span / 16)).
"""
from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from emu_ops_testing import OpsError

try:
    from codegen.emu import tensor_map
except ImportError:  # before the package exists (codegen/emu/__init__.py is the harness's)
    _SPEC = importlib.util.spec_from_file_location(
        "codegen_emu_tensor_map", Path(__file__).resolve().parents[2] / "codegen" / "emu" / "tensor_map.py")
    tensor_map = importlib.util.module_from_spec(_SPEC)
    sys.modules[_SPEC.name] = tensor_map
    _SPEC.loader.exec_module(tensor_map)

NP_DTYPE = {"f16": np.uint16, "bf16": np.uint16, "f32": np.uint32}
SPAN = {"none": 0, "32B": 32, "64B": 64, "128B": 128}
POISON = 0xA5


def aligned_buffer(nbytes: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes starting at a 64-byte aligned address (a tensor's global memory)."""
    raw = rng.integers(0, 256, nbytes + 64, dtype=np.uint8)
    skip = (-raw.ctypes.data) % 64
    return raw[skip:skip + nbytes]


def tma_model(buf: np.ndarray, eb: int, dims: list[int], strides: list[int], box: list[int],
              coords: list[int], span: int, elem_strides: list[int] | None = None,
              fill: int = 0) -> np.ndarray:
    """The shared bytes of the box (strides in elements, dims 1..); with element strides es, dim d
    loads ceil(box / es) elements at coords + i * es; outside the tensor: `fill` (a bit pattern)."""
    es = elem_strides or [1] * len(box)
    counts = [-(-b // e) for b, e in zip(box, es)]
    elem = buf.view({2: np.uint16, 4: np.uint32}[eb])
    idx = np.indices(counts[::-1]).reshape(len(box), -1)[::-1]   # innermost first, innermost fastest
    inside = np.ones(idx.shape[1], bool)
    flat = np.zeros(idx.shape[1], np.int64)
    for d, (c0, n, st) in enumerate(zip(coords, dims, [1] + strides)):
        c = c0 + idx[d] * es[d]
        inside &= (c >= 0) & (c < n)
        flat += np.where(inside, c, 0) * st
    values = np.where(inside, elem[np.where(inside, flat, 0)], fill).astype(elem.dtype)
    dense = values.view(np.uint8)
    if span == 0:
        return dense
    out = np.empty_like(dense)
    o = np.arange(dense.size)
    row, chunk = o // 128, (o % 128) // 16
    out[row * 128 + (chunk ^ (row % (span // 16))) * 16 + o % 16] = dense
    return out


def run_case(ops, rng, dtype, dims, box, strides, coords, swizzle, dst=1024):
    eb = tensor_map.DATA_TYPES[dtype][1]
    st = strides
    if st is None:
        st, acc = [], 1
        for d in dims[:-1]:
            acc *= d
            st.append(acc)
    extent = 1 + sum((n - 1) * s for n, s in zip(dims, [1] + st))
    buf = aligned_buffer(extent * eb, rng)
    raw = tensor_map.encode_tiled_emulated(dtype, buf.ctypes.data, dims, box, strides, swizzle)
    smem = np.full(1 << 17, POISON, np.uint8)
    nbytes = ops.tma(raw, coords, smem, dst)
    want = tma_model(buf, eb, dims, st, box, coords, SPAN[swizzle])
    assert nbytes == int(np.prod(box)) * eb
    assert np.array_equal(smem[dst:dst + want.size], want)
    assert (smem[:dst] == POISON).all() and (smem[dst + want.size:] == POISON).all()


def edge_coords(n: int, b: int) -> list[int]:
    """Box starts at every edge of a dim of n: inside, straddling each end, outside each end."""
    return sorted({0, -1, -(b - 1), -b, n - b, n - b + 1, n - 1, n, max(0, (n - b) // 2), -b - 5})


@pytest.mark.parametrize("dtype,swizzle", [("f16", "128B"), ("bf16", "64B"), ("f16", "32B"),
                                           ("f16", "none"), ("f32", "128B")])
def test_tma_2d_every_edge(ops, dtype, swizzle):
    rng = np.random.default_rng(len(swizzle) + len(dtype))
    eb = tensor_map.DATA_TYPES[dtype][1]
    inner = (SPAN[swizzle] or 64) // eb
    dims, box = [inner * 2 + 8, 37], [inner, 16]
    for c0, c1 in itertools.product(edge_coords(dims[0], box[0]), edge_coords(dims[1], box[1])):
        run_case(ops, rng, dtype, dims, box, None, [c0, c1], swizzle)


@pytest.mark.parametrize("rank", [1, 3, 4, 5])
def test_tma_higher_rank_strided_views(ops, rank):
    """[B, N, H, D]-like views: rows of one head H * D apart, padded outer strides."""
    rng = np.random.default_rng(rank)
    dims = [64, 9, 3, 2, 2][:rank]
    box = [64, 8, 2, 1, 2][:rank]
    strides = [64 * 3 + 8, 64 + 16, 64 * 3 * 9 + 24, 40000][:rank - 1]   # elements, 16-byte multiples
    strides = sorted(strides) if rank > 1 else []
    views = [None, strides] if rank > 1 else [None]
    for st in views:
        for _ in range(12):
            coords = [int(rng.integers(-b - 1, n + 1)) for n, b in zip(dims, box)]
            run_case(ops, rng, "f16", dims, box, st, coords, "128B")


def test_tma_inner_box_narrower_than_swizzle(ops):
    """32-byte box rows under the 128B swizzle: shared 128-byte rows hold four box rows."""
    rng = np.random.default_rng(5)
    for coords in ([0, 0], [-3, 5], [8, 30]):
        run_case(ops, rng, "f16", [40, 33], [16, 24], None, coords, "128B", dst=2048)


def test_tma_bytes_count_fully_outside(ops):
    rng = np.random.default_rng(6)
    run_case(ops, rng, "bf16", [64, 10], [64, 4], None, [-64, 10], "128B")


def test_tma_refuses_bad_destinations_and_maps(ops):
    rng = np.random.default_rng(7)
    buf = aligned_buffer(64 * 64 * 2, rng)
    raw = tensor_map.encode_tiled_emulated("f16", buf.ctypes.data, [64, 64], [64, 64])
    smem = np.zeros(1 << 14, np.uint8)
    with pytest.raises(OpsError, match="aligned"):
        ops.tma(raw, [0, 0], smem, 512)                       # 128B swizzle repeats at 1024
    with pytest.raises(OpsError, match="outside"):
        ops.tma(raw, [0, 0], smem, (1 << 14) - 1024)
    with pytest.raises(OpsError, match="magic"):
        ops.tma(b"\0" * 128, [0, 0], smem, 0)
    plain = tensor_map.encode_tiled_emulated("f16", buf.ctypes.data, [64, 64], [8, 8], swizzle="none")
    with pytest.raises(OpsError, match="aligned"):
        ops.tma(plain, [0, 0], smem, 64)


def test_tma_element_strides_and_nan_fill(ops):
    """Map fields encode_tiled_emulated leaves at their defaults, patched into the bytes."""
    rng = np.random.default_rng(8)
    dims, box = [64, 40], [64, 7]
    buf = aligned_buffer(64 * 40 * 2, rng)
    raw = bytearray(tensor_map.encode_tiled_emulated("f16", buf.ctypes.data, dims, box))
    raw[123], raw[27] = 3, 1                               # element stride 3 along dim 1, NaN fill
    for coords in ([0, 0], [-5, 35], [3, -4]):
        smem = np.full(1 << 14, POISON, np.uint8)
        nbytes = ops.tma(bytes(raw), coords, smem, 0, rank=2)
        want = tma_model(buf, 2, dims, [64], box, coords, 128, [1, 3], fill=0xFFFF)
        assert nbytes == 64 * 3 * 2 and np.array_equal(smem[:want.size], want)


def test_tma_refuses_corrupt_maps_and_rank_mismatch(ops):
    buf = aligned_buffer(64 * 64 * 2, np.random.default_rng(9))
    raw = tensor_map.encode_tiled_emulated("f16", buf.ctypes.data, [64, 64], [64, 64])
    smem = np.zeros(1 << 14, np.uint8)
    with pytest.raises(OpsError, match="3d load through a rank-2"):
        ops.tma(raw, [0, 0, 0], smem, 0, rank=3)
    for offset, value, message in [(115, 1, "box"), (122, 9, "element stride"), (122, 2, "dim 0"), (24, 1, "interleave"),
                                   (112, 72, "swizzle span"), (4, 6, "rank")]:
        bad = bytearray(raw)
        bad[offset] = value
        with pytest.raises(OpsError, match=message):
            ops.tma(bytes(bad), [0, 0], smem, 0)


BAD_ENCODINGS = [
    (dict(dims=[]), "rank"),
    (dict(dims=[64] * 6, box=[8] * 6), "rank"),
    (dict(box=[64, 257]), "box dims"),
    (dict(box=[72, 8]), "swizzle span"),
    (dict(box=[4, 8]), "16 bytes"),
    (dict(strides_elems=[100]), "multiples of 16"),
    (dict(strides_elems=[2**40 // 2]), "below 2"),
    (dict(strides_elems=[64, 64]), "strides"),
    (dict(ptr=8), "aligned"),
    (dict(dtype="f64"), "dtype"),
    (dict(swizzle="16B"), "swizzle"),
    (dict(box=[64]), "box dims"),
    (dict(dims=[0, 4]), "dims"),
]


@pytest.mark.parametrize("change,message", BAD_ENCODINGS)
def test_encode_refuses_what_the_driver_refuses(change, message):
    args = dict(dtype="f16", ptr=4096, dims=[64, 64], box=[64, 8], strides_elems=None, swizzle="128B")
    args.update(change)
    with pytest.raises(ValueError, match=message):
        tensor_map.encode_tiled_emulated(**args)


def test_encode_layout_round_trip():
    raw = tensor_map.encode_tiled_emulated("bf16", 0x7F0000001000, [128, 7, 5], [32, 4, 1], [136, 136 * 9],
                                           swizzle="64B")
    assert len(raw) == 128 and raw[:4] == b"DTMA"
    f = tensor_map.decode_emulated(raw)
    assert (f.rank, f.address, f.data_type, f.elem_bytes, f.swizzle) == (3, 0x7F0000001000, 9, 2, 2)
    assert f.dims == (128, 7, 5) and f.strides == (2, 272, 272 * 9) and f.box == (32, 4, 1)
    assert f.elem_strides == (1, 1, 1) and (f.interleave, f.oob_fill) == (0, 0)
    assert raw[32:40] == (128).to_bytes(8, "little") and raw[112:114] == (32).to_bytes(2, "little")
