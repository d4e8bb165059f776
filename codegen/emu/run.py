"""Run a printed kernel on the CPU: geometry as the CUDA runtime computes it, every tensor in a
guarded buffer (poisoned zones before and after, checked after the run), the output pre-filled
with NaN poison, TMA tensor maps in the emulation's encoding through the mapping's host hook."""
from __future__ import annotations

import ctypes
import mmap
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from compiler.machine import DTYPES

from ..mappings import Printed, mapping_named
from ..cuda.runtime import geometry
from ..cuda.tma import encode_emulated
from .launch import EmuError, compile_emulated

GUARD = 4096    # poisoned bytes on each side of a tensor
PAGE = mmap.PAGESIZE
FENCE = 1 << 24  # inaccessible bytes beyond the guard zones (address space only)
BASE_ALIGN = 256  # as cudaMalloc: TMA and cp.async need 16, vector loads 16
POISON = 0xFF   # NaN in f32, f16 and bf16


def to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """The array as the kernel stores it: float32, float16, or bf16 bits in uint16 (a uint16
    array given for bf16 is taken as bits already), rounded to nearest even."""
    if dtype == "bf16":
        if x.dtype == np.uint16:
            return np.ascontiguousarray(x)
        bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        nan = (bits & 0x7FFFFFFF) > 0x7F800000
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)
    return np.ascontiguousarray(x, dtype=DTYPES[dtype].numpy)


def from_storage(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A kernel's stored values as floats (bf16 bits widened to float32)."""
    if dtype == "bf16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw


@lru_cache(maxsize=None)
def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return lib


class VariantUnavailable(ValueError):
    """The variant cannot run at these sizes / pointers (the mapping's host side picks another)."""


class _Guarded:
    """One tensor between two poisoned guard zones, its data BASE_ALIGN-aligned, inside an
    anonymous mapping whose far ends are inaccessible (FENCE bytes of PROT_NONE pages on each
    side): a store a few bytes past the tensor changes the poison (checked after the run), one
    a tile past it faults in the kernel thread (an EmuError), never into Python's heap."""

    def __init__(self, name: str, nbytes: int):
        self.name, self.nbytes = name, nbytes
        inner = -(-(2 * GUARD + nbytes + BASE_ALIGN) // PAGE) * PAGE
        self._map = mmap.mmap(-1, 2 * FENCE + inner)
        whole = np.frombuffer(self._map, dtype=np.uint8)
        base = whole.ctypes.data
        for at in (base, base + FENCE + inner):
            if _libc().mprotect(ctypes.c_void_p(at), ctypes.c_size_t(FENCE), 0) != 0:
                raise OSError(ctypes.get_errno(), f"mprotect of the fence around {name}")
        self.raw = whole[FENCE:FENCE + inner]
        self.raw[:] = POISON
        self.start = GUARD + (-(self.raw.ctypes.data + GUARD) % BASE_ALIGN)
        self.ptr = self.raw.ctypes.data + self.start

    def data(self) -> np.ndarray:
        return self.raw[self.start:self.start + self.nbytes]

    def check_guards(self) -> None:
        before = self.raw[self.start - GUARD:self.start]
        after = self.raw[self.start + self.nbytes:self.start + self.nbytes + GUARD]
        for zone, where in ((before, "before"), (after, "after")):
            bad = np.flatnonzero(zone != POISON)
            if bad.size:
                off = (int(bad[0]) - GUARD) if where == "before" else self.nbytes + int(bad[0])
                raise EmuError(f"wrote outside {self.name}: {bad.size} bytes {where} it changed "
                               f"(first at byte offset {off})")


def run_printed(printed: Printed, variant_index: int, inputs: Sequence[np.ndarray],
                given_sizes: Mapping[str, int] | None = None, order: str = "forward", seed: int = 0,
                include_dirs: tuple[str, ...] = ()) -> np.ndarray | tuple[np.ndarray, ...]:
    """The output of variant `variant_index` of `printed` run on the CPU (floats; bf16 widened);
    a tuple (output, further outputs…) for a kernel that writes several.
    EmuError with a one-line reason when the run fails or writes outside its tensors."""
    kernel = printed.kernel
    ins = kernel.inputs
    if len(inputs) != len(ins):
        raise ValueError(f"expected {len(ins)} inputs ({', '.join(t.name for t in ins)}), got {len(inputs)}")
    if not 0 <= variant_index < len(printed.variants):
        raise ValueError(f"variant {variant_index}: {printed.mapping} has {len(printed.variants)}")
    stored = [to_storage(np.asarray(x), t.dtype) for x, t in zip(inputs, ins)]
    geo = geometry(printed, tuple(s.shape for s in stored), dict(given_sizes or {}))
    outs_t = kernel.outputs
    nps = [np.uint16 if t.dtype == "bf16" else np.dtype(DTYPES[t.dtype].numpy) for t in outs_t]
    if geo.empty:
        empty = tuple(from_storage(np.zeros(shape, dtype=n), t.dtype) for t, n, shape in zip(outs_t, nps, geo.out_shapes))
        return empty[0] if len(empty) == 1 else empty
    variant = printed.variants[variant_index]
    launch = variant.launch
    bufs = []
    for s, t in zip(stored, ins):
        b = _Guarded(t.name, s.nbytes)
        b.data()[:] = s.reshape(-1).view(np.uint8)
        bufs.append(b)
    # each output's data is poison until written
    outs = [_Guarded(t.name, int(np.prod(shape)) * DTYPES[t.dtype].bytes) for t, shape in zip(outs_t, geo.out_shapes)]
    ptrs = tuple(b.ptr for b in bufs)
    extras: list = []
    maps = None
    if launch.extras:
        host = mapping_named(printed.mapping).host
        if host is None or launch.extras != ("tma_maps",):
            raise ValueError(f"{variant.stem}: no host hook for its extra arguments {launch.extras}")
        index, raw = host(printed, geo.sizes, ptrs, encode_emulated)
        if index != variant_index or raw is None:
            raise VariantUnavailable(f"{variant.stem} cannot run at sizes {geo.sizes} (the host picks variant {index})")
        maps = np.zeros(len(raw) + 64, dtype=np.uint8)
        at = -maps.ctypes.data % 64
        maps[at:at + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        extras.append(maps.ctypes.data + at)
    module = compile_emulated(variant.source.source, variant.source.entry, include_dirs)
    args = [*ptrs, *(o.ptr for o in outs), *geo.size_args, *extras]
    module.launch(geo.grids[variant_index], launch.threads, launch.smem_bytes, args, order, seed)
    for b, s in zip(bufs, stored):
        b.check_guards()
        if not np.array_equal(b.data(), s.reshape(-1).view(np.uint8)):
            raise EmuError(f"wrote into input {b.name}")
    results = []
    for o, t, n, shape in zip(outs, outs_t, nps, geo.out_shapes):
        o.check_guards()
        results.append(from_storage(o.data().copy().view(n).reshape(shape), t.dtype))
    return results[0] if len(results) == 1 else tuple(results)  # (O, LSE) for a kernel with further outputs
