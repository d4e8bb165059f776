"""Hardware mappings, found through a registry keyed by (kernel family, instruction).

A mapping prints a kernel IR for one kind of hardware unit: `simt` prints any kernel IR;
the tensor-core mappings (mma.sync, wgmma) accept a kernel IR only when its meaning is the one
their templates implement, and refuse by name otherwise.  The instruction comes from the kernel
IR (MAP-MMA's facts on its tile sums), never from a guess: a kernel IR with tensor-core facts is
printed by a tensor-core mapping or the build stops.  A new family or GPU generation is one
module that calls `register`, plus its templates.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from compiler.ir import Reduce

from ..kir import Kernel, sub_expressions
from ..lower import UnsupportedMapping
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
    # host side at a call: (printed, sizes, pointers) -> (variant index, extra argument bytes or None)
    host: Callable[[Printed, dict[str, int], tuple[int, ...]], tuple[int, bytes | None]] | None = None


REGISTRY: dict[tuple[str, str | None], Mapping] = {}


def register(m: Mapping) -> Mapping:
    REGISTRY[(m.family, m.instr)] = m
    return m


def instruction(k: Kernel) -> str | None:
    """The tensor-core instruction the schedule mapped the kernel's tile sums to (MAP-MMA)."""
    instrs = {x.mma.instr for x in sub_expressions(k) if isinstance(x, Reduce) and x.mma is not None}
    if len(instrs) > 1:
        raise UnsupportedMapping(f"the kernel mixes tensor-core instructions {sorted(instrs)}")
    return instrs.pop() if instrs else None


def print_kernel(k: Kernel, options: tuple[str, ...]) -> Printed:
    """Print k with the mapping its facts ask for; UnsupportedMapping with every refusal."""
    _load()
    instr = instruction(k)
    reasons = []
    for m in REGISTRY.values():
        if m.instr != instr:
            continue
        try:
            return m.render(k, options)
        except UnsupportedMapping as exc:
            reasons.append(str(exc))
    if not reasons:
        raise UnsupportedMapping(f"no mapping prints instruction {instr!r}")
    # a mapping whose kernel shape does not fit at all says least: its reason goes last
    reasons.sort(key=lambda r: "the kernel is not" in r)
    raise UnsupportedMapping(" | ".join(reasons))


def mapping_named(name: str) -> Mapping:
    _load()
    for m in REGISTRY.values():
        if m.name == name:
            return m
    raise KeyError(name)


def _load() -> None:
    from . import contraction, online_fold, simt  # noqa: F401  (each registers its mappings)
