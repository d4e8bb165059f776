"""What a printer hands to the compiler and the runtime: the source and its launch.

`KernelSource` is the CUDA text with its entry point and compile options; `Launch` is how to
call it: argument order, grid extents per axis as kernel-IR extents (evaluated once per shape),
block size, dynamic shared memory, and the host-side extras a mapping needs (TMA tensor maps).
Plain data, no imports from the rest of codegen, so every module may use it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from compiler.ir import Ext


@dataclass(frozen=True)
class KernelSource:
    source: str
    entry: str
    arg_names: tuple[str, ...]
    threads: int
    smem_bytes: int
    options: tuple[str, ...]


@dataclass(frozen=True)
class Launch:
    """grid[axis] = ext evaluated at the call's sizes (1 where no extent is given)."""

    grid: tuple[tuple[str, Ext], ...]  # (axis, extent)
    threads: int
    smem_bytes: int
    tensor_args: tuple[str, ...]  # tensor names in argument order (inputs, then the output)
    size_args: tuple[str, ...]  # dynamic sizes passed as int arguments, after the tensors
    extras: tuple[str, ...] = field(default=())  # host-made arguments after the sizes ('tma_maps')
    reverse_axis: str = ""  # an axis whose blocks run heaviest-first (documented, no meaning)
