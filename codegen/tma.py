"""TMA tensor maps: one tiled map encoded on the host through the driver (libcuda
cuTensorMapEncodeTiled, via ctypes): 128-byte swizzle, zero fill out of bounds; contiguous or
with the strides of a strided view (any order: [B, N, H, D] rows are H * D apart)."""
from __future__ import annotations

from compiler.machine import DTYPES

_TMA_DTYPE = {"f16": 6, "bf16": 9}  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16 / _BFLOAT16
_SWIZZLE_128B, _L2_PROMO_256B = 3, 3


def encode_tiled(lib, dtype: str, ptr: int, dims: list[int], box: list[int],
                 strides_elems: list[int] | None = None) -> bytes:
    """dims innermost first (dim 0 has stride 1); strides_elems: element strides of dims 1..
    (a strided view, e.g. the rows of [B, N, H, D] at H * D), contiguous when omitted."""
    import ctypes
    rank = len(dims)
    eb = DTYPES[dtype].bytes
    if strides_elems is None:
        strides, acc = [], eb
        for d in dims[:-1]:
            acc *= d
            strides.append(acc)
    else:
        if len(strides_elems) != rank - 1:
            raise ValueError(f"a rank-{rank} map takes {rank - 1} strides, got {strides_elems}")
        strides = [s * eb for s in strides_elems]
        bad = [s for s in strides if s % 16 or s >= 2**40]
        if bad:
            raise ValueError(f"TMA strides must be multiples of 16 bytes below 2^40, got {bad} (dims {dims})")
    raw = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(raw) + 63) // 64 * 64
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    st = lib.cuTensorMapEncodeTiled(
        ctypes.c_void_p(addr), ctypes.c_int(_TMA_DTYPE[dtype]), u32(rank), ctypes.c_void_p(ptr),
        (u64 * rank)(*dims), (u64 * max(1, rank - 1))(*strides), (u32 * rank)(*box),
        (u32 * rank)(*([1] * rank)), ctypes.c_int(0), ctypes.c_int(_SWIZZLE_128B),
        ctypes.c_int(_L2_PROMO_256B), ctypes.c_int(0))
    if st != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({st}): dims {dims} box {box}")
    return ctypes.string_at(addr, 128)


