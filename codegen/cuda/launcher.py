"""A cubin's kernel launched through the CUDA driver API (libcuda via ctypes).

The argument block is built once: one ctypes slot per kernel parameter and the array of their
addresses that cuLaunchKernel reads.  A launch writes the slots and makes one foreign call, so
the host cost of a call is a few microseconds.  The module is loaded into the context current
at construction (torch's or CuPy's primary context of that device); a launch never
synchronizes, so it can be captured in a CUDA graph.  Not thread-safe: one launch at a time.
"""
from __future__ import annotations

import ctypes
from typing import Sequence

_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class DriverError(RuntimeError):
    pass


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    lib.cuLaunchKernel.restype = ctypes.c_int
    lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
    lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return lib


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(status, ctypes.byref(name))
        raise DriverError(f"{what} failed: {name.value.decode() if name.value else status}")


class DriverKernel:
    """kinds: one letter per parameter, 'p' a 64-bit pointer, 'i' a 32-bit int."""

    def __init__(self, cubin: bytes, entry: str, smem_bytes: int, kinds: Sequence[str]):
        self.lib = lib = _lib()
        self._module = ctypes.c_void_p()
        _check(lib, lib.cuModuleLoadData(ctypes.byref(self._module), cubin), f"loading the cubin of {entry}")
        self._fn = ctypes.c_void_p()
        _check(lib, lib.cuModuleGetFunction(ctypes.byref(self._fn), self._module, entry.encode()), f"finding {entry}")
        if smem_bytes > 48 * 1024:
            _check(lib, lib.cuFuncSetAttribute(self._fn, _FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes),
                   f"raising the shared-memory limit of {entry}")
        self._slots = [ctypes.c_uint64() if k == "p" else ctypes.c_int32() for k in kinds]
        self._params = (ctypes.c_void_p * max(1, len(kinds)))(*[ctypes.addressof(s) for s in self._slots])
        self.entry = entry

    def launch(self, grid: tuple[int, int, int], threads: int, smem_bytes: int, stream: int,
               values: Sequence[int]) -> None:
        for slot, v in zip(self._slots, values):
            slot.value = v
        status = self.lib.cuLaunchKernel(self._fn, grid[0], grid[1], grid[2], threads, 1, 1, smem_bytes,
                                         stream, self._params, None)
        if status:
            _check(self.lib, status, f"launching {self.entry}")
