"""Load an emulated kernel (.so) with ctypes and launch it on numpy buffers."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from .compile import compile_shared

SCHEDULES = ("forward", "reverse", "random")


class EmuError(RuntimeError):
    """The emulated launch failed: a one-line reason (deadlock, out-of-window access, ...)."""


@dataclass(frozen=True)
class EmuModule:
    path: Path
    entry: str

    @property
    def _lib(self) -> ctypes.CDLL:
        return _load(str(self.path))

    def signature(self) -> str:
        """One letter per kernel parameter: p pointer, i 32-bit int, l 64-bit int."""
        return self._lib.derivc_emu_signature().decode()

    def launch(self, grid: tuple[int, int, int], threads: int, smem_bytes: int, args: Sequence,
               schedule: str = "forward", seed: int = 0) -> None:
        """Run the grid; args: numpy arrays (their data pointers) and python ints.  EmuError on failure."""
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule {schedule!r}: one of {', '.join(SCHEDULES)}")
        lib = self._lib
        sig = lib.derivc_emu_signature().decode()
        if len(sig) != len(args):
            raise ValueError(f"{self.entry} takes {len(sig)} arguments ({sig}), got {len(args)}")
        cells = []
        for i, (kind, a) in enumerate(zip(sig, args)):
            if isinstance(a, np.ndarray):
                if kind != "p":
                    raise ValueError(f"{self.entry} argument {i}: an array where the kernel takes an int")
                cells.append(ctypes.c_void_p(a.ctypes.data))
            elif isinstance(a, (int, np.integer)) and not isinstance(a, bool):
                if kind == "p":
                    cells.append(ctypes.c_void_p(int(a)))  # a raw address (a buffer the caller owns)
                elif kind == "l":
                    cells.append(ctypes.c_int64(int(a)))
                else:
                    if not -2**31 <= int(a) < 2**31:
                        raise ValueError(f"{self.entry} argument {i}: {a} does not fit int32")
                    cells.append(ctypes.c_int32(int(a)))
            else:
                raise ValueError(f"{self.entry} argument {i}: {type(a).__name__} (a numpy array or an int)")
        argv = (ctypes.c_void_p * max(1, len(cells)))(*[ctypes.addressof(c) for c in cells])
        gx, gy, gz = grid
        err = lib.derivc_emu_launch(argv, gx, gy, gz, threads, smem_bytes, SCHEDULES.index(schedule), seed & 0xFFFFFFFF)
        if err is not None:
            raise EmuError(err.decode(errors="replace"))


@lru_cache(maxsize=None)
def _load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.derivc_emu_launch.restype = ctypes.c_char_p
    lib.derivc_emu_launch.argtypes = [ctypes.POINTER(ctypes.c_void_p)] + [ctypes.c_int] * 6 + [ctypes.c_uint]
    lib.derivc_emu_signature.restype = ctypes.c_char_p
    return lib


def compile_emulated(source: str, entry: str, include_dirs: tuple[str, ...] = ()) -> EmuModule:
    """Compile (or fetch from the cache) `source` for the CPU; include_dirs come after the package's."""
    return EmuModule(compile_shared(source, entry, tuple(include_dirs)), entry)
