"""The emulated CUtensorMap: what codegen/tma.py's encode_tiled asks cuTensorMapEncodeTiled for,
encoded without a driver into the 128-byte layout derivc_emu_ops.h (struct TensorMap) reads.

Layout (little endian; entries past the rank are 0):
    0 u32 magic 'DTMA' (0x414d5444)      4 u32 rank (1..5)           8 u64 global address
   16 u32 CUtensorMapDataType            20 u32 element bytes
   24 u8 interleave (0)   25 u8 swizzle (0 none, 1 32B, 2 64B, 3 128B)   26 u8 L2 promotion
   27 u8 oob fill (0 zeros, 1 NaN)       28 u32 reserved (0)
   32 u64 dims[5] (innermost first)     72 u64 byte strides[5] (strides[0] = element bytes)
  112 u16 box[5]                       122 u8 element strides[5]   127 u8 reserved (0)

The arguments are validated as the driver validates them (CUDA driver API,
cuTensorMapEncodeTiled), so that a map the emulator accepts is one the GPU accepts.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0x414D5444
SIZE = 128
MAX_RANK = 5

# dtype name -> (CUtensorMapDataType, element bytes)
DATA_TYPES: dict[str, tuple[int, int]] = {"f16": (6, 2), "f32": (7, 4), "bf16": (9, 2)}
# swizzle name -> (CUtensorMapSwizzle, span in bytes; 0: none)
SWIZZLES: dict[str, tuple[int, int]] = {"none": (0, 0), "32B": (1, 32), "64B": (2, 64), "128B": (3, 128)}
_L2_PROMOTION_256B = 3  # as codegen/tma.py asks the driver for

_LAYOUT = struct.Struct("<IIQIIBBBBI5Q5Q5H5BB")
assert _LAYOUT.size == SIZE


@dataclass(frozen=True)
class TensorMapFields:
    """A decoded emulated tensor map (dims, strides in bytes, box, element strides: per rank)."""

    rank: int
    address: int
    data_type: int
    elem_bytes: int
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    elem_strides: tuple[int, ...]


def _pad(values: list[int], fill: int = 0) -> list[int]:
    return list(values) + [fill] * (MAX_RANK - len(values))


def encode_tiled_emulated(dtype: str, ptr: int, dims: list[int], box: list[int],
                          strides_elems: list[int] | None = None, swizzle: str = "128B") -> bytes:
    """The 128 bytes of an emulated tiled tensor map, from the arguments codegen/tma.encode_tiled
    takes: dims and box innermost first (dim 0 has stride 1), strides_elems the element strides of
    dims 1.. (contiguous when omitted), zero fill out of bounds, element strides 1."""
    if dtype not in DATA_TYPES:
        raise ValueError(f"TMA dtype must be one of {sorted(DATA_TYPES)}, got {dtype!r}")
    if swizzle not in SWIZZLES:
        raise ValueError(f"TMA swizzle must be one of {list(SWIZZLES)}, got {swizzle!r}")
    code, eb = DATA_TYPES[dtype]
    swizzle_code, span = SWIZZLES[swizzle]
    rank = len(dims)
    if not 1 <= rank <= MAX_RANK:
        raise ValueError(f"TMA rank must be 1..{MAX_RANK}, got {rank} (dims {dims})")
    if len(box) != rank:
        raise ValueError(f"a rank-{rank} map takes {rank} box dims, got {box}")
    if ptr % 16:
        raise ValueError(f"TMA global address 0x{ptr:x} is not 16-byte aligned")
    bad_dims = [d for d in dims if not 1 <= d <= 2**32]
    if bad_dims:
        raise ValueError(f"TMA dims must be 1..2^32, got {dims}")
    bad_box = [b for b in box if not 1 <= b <= 256]
    if bad_box:
        raise ValueError(f"TMA box dims must be 1..256, got {box}")
    inner = box[0] * eb
    if inner % 16:
        raise ValueError(f"TMA inner box must be a multiple of 16 bytes, got {inner} (box {box})")
    if span and inner > span:
        raise ValueError(f"TMA inner box {inner} bytes exceeds the {swizzle} swizzle span (box {box})")
    if strides_elems is None:
        strides, acc = [], eb
        for d in dims[:-1]:
            acc *= d
            strides.append(acc)
    else:
        if len(strides_elems) != rank - 1:
            raise ValueError(f"a rank-{rank} map takes {rank - 1} strides, got {strides_elems}")
        strides = [s * eb for s in strides_elems]
    bad = [s for s in strides if s % 16 or not 0 < s < 2**40]
    if bad:
        raise ValueError(f"TMA strides must be multiples of 16 bytes below 2^40, got {bad} (dims {dims})")
    return _LAYOUT.pack(MAGIC, rank, ptr, code, eb, 0, swizzle_code, _L2_PROMOTION_256B, 0, 0,
                        *_pad(dims), *_pad([eb] + strides), *_pad(box), *_pad([1] * rank), 0)


def decode_emulated(raw: bytes) -> TensorMapFields:
    """The fields of an emulated tensor map (one clear error for anything else)."""
    if len(raw) != SIZE:
        raise ValueError(f"an emulated tensor map is {SIZE} bytes, got {len(raw)}")
    v = _LAYOUT.unpack(raw)
    magic, rank = v[0], v[1]
    if magic != MAGIC or not 1 <= rank <= MAX_RANK:
        raise ValueError(f"not an emulated tensor map (magic 0x{magic:08x}, rank {rank})")
    dims, strides, box, es = v[10:15], v[15:20], v[20:25], v[25:30]
    return TensorMapFields(rank, v[2], v[3], v[4], v[5], v[6], v[7], v[8], tuple(dims[:rank]),
                           tuple(strides[:rank]), tuple(box[:rank]), tuple(es[:rank]))
