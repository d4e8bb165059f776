"""TMA tensor maps: one tiled map's parameters computed once in pure Python (`tiled_map`), then
encoded either by the driver (libcuda cuTensorMapEncodeTiled via ctypes, `encode_driver`) for the
GPU or into the emulation's own 128-byte layout (`encode_emulated`, codegen.emu.tensor_map) for
the CPU. 128-byte swizzle, zero fill out of bounds; contiguous or with the strides of a strided
view (any order: [B, N, H, D] rows are H * D apart)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from compiler.machine import DTYPES

_TMA_DTYPE = {"f16": 6, "bf16": 9}  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16 / _BFLOAT16
_SWIZZLE_128B, _L2_PROMO_256B = 3, 3


@dataclass(frozen=True)
class TiledMap:
    """dims and box innermost first (dim 0 has stride 1); strides_elems: element strides of dims 1.."""

    dtype: str
    ptr: int
    dims: tuple[int, ...]
    box: tuple[int, ...]
    strides_elems: tuple[int, ...]


Encoder = Callable[[TiledMap], bytes]


def tiled_map(dtype: str, ptr: int, dims: list[int], box: list[int],
              strides_elems: list[int] | None = None) -> TiledMap:
    """strides_elems: element strides of dims 1.. (a strided view, e.g. the rows of [B, N, H, D] at
    H * D), contiguous when omitted."""
    rank = len(dims)
    eb = DTYPES[dtype].bytes
    if strides_elems is None:
        strides, acc = [], 1
        for d in dims[:-1]:
            acc *= d
            strides.append(acc)
    else:
        if len(strides_elems) != rank - 1:
            raise ValueError(f"a rank-{rank} map takes {rank - 1} strides, got {strides_elems}")
        strides = list(strides_elems)
        bad = [s * eb for s in strides if (s * eb) % 16 or s * eb >= 2**40]
        if bad:
            raise ValueError(f"TMA strides must be multiples of 16 bytes below 2^40, got {bad} (dims {dims})")
    return TiledMap(dtype, ptr, tuple(dims), tuple(box), tuple(strides))


@lru_cache(maxsize=None)
def _libcuda():
    import ctypes
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
    return lib


def encode_driver(m: TiledMap) -> bytes:
    """The CUtensorMap the driver encodes (needs libcuda)."""
    import ctypes
    lib = _libcuda()
    rank, eb = len(m.dims), DTYPES[m.dtype].bytes
    strides = [s * eb for s in m.strides_elems]
    raw = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(raw) + 63) // 64 * 64
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    st = lib.cuTensorMapEncodeTiled(
        ctypes.c_void_p(addr), ctypes.c_int(_TMA_DTYPE[m.dtype]), u32(rank), ctypes.c_void_p(m.ptr),
        (u64 * rank)(*m.dims), (u64 * max(1, rank - 1))(*strides), (u32 * rank)(*m.box),
        (u32 * rank)(*([1] * rank)), ctypes.c_int(0), ctypes.c_int(_SWIZZLE_128B),
        ctypes.c_int(_L2_PROMO_256B), ctypes.c_int(0))
    if st != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({st}): dims {list(m.dims)} box {list(m.box)}")
    return ctypes.string_at(addr, 128)


def encode_emulated(m: TiledMap) -> bytes:
    """The same map in the CPU emulation's layout (codegen.emu.tensor_map)."""
    from codegen.emu.tensor_map import encode_tiled_emulated
    return encode_tiled_emulated(m.dtype, m.ptr, list(m.dims), list(m.box), list(m.strides_elems), "128B")
