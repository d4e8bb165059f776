"""The mapping registry's records: a printed kernel, its variants, and a mapping entry."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..kir.ir import Kernel
from ..source import KernelSource, Launch


@dataclass(frozen=True)
class Variant:
    """One compiled kernel of a mapping; stem names its files (kernel.cu, kernel_tma.cu)."""

    stem: str
    source: KernelSource
    launch: Launch


@dataclass(frozen=True)
class Printed:
    mapping: str
    kernel: Kernel
    plan: Any  # the mapping's instruction choices (a plan), or None
    variants: tuple[Variant, ...]
    promises: dict[str, Any] = field(default_factory=dict)  # what the SASS must show


@dataclass(frozen=True)
class Mapping:
    name: str
    family: str
    instr: str | None
    render: Callable[[Kernel, tuple[str, ...]], Printed]
    # host side at a call: (printed, sizes, pointers[, tensor-map encoder]) -> (variant index, extra
    # argument bytes or None); the encoder defaults to the driver's (codegen.cuda.tma.encode_driver)
    host: Callable[..., tuple[int, bytes | None]] | None = None
    # whether the printer writes a kernel IR's further outputs (`Kernel.also`); the others refuse
    # such a kernel by name before printing
    prints_also: bool = False
    # whether the printer prints a lane of dynamic extent (`LaneDim.extent` None); the others
    # refuse such a kernel by name before printing
    dynamic_lanes: bool = False


REGISTRY: dict[tuple[str, str | None], Mapping] = {}


def register(m: Mapping) -> Mapping:
    REGISTRY[(m.family, m.instr)] = m
    return m
