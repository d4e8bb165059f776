"""A final program of several definitions as several kernels, one per definition, in order.

SPLIT-KV leaves two definitions: the partial folds (`O_part`, writing `O_part_m`, `O_part_l`
beside it) and the combine (`O`).  Kernel k is the program cut at definition k: the definitions
before it are marked written by their kernel (compiler.kernel_view: the kernel receives them,
further outputs included, as arguments; every check still computes them), the ones after it
are dropped.  Each kernel is lowered and validated against its cut (kernel-IR interpreter),
printed by the mapping its facts ask for, and its text run on the CPU through the emulation
(codegen.kernel_check) like a build's kernel step.  No atomics: the kernels run one after the
other, the combine reads each split's slot.

`derivc build` writes such a program (when its `kernels` fact says it is a chain) as one build
directory per kernel (compiler/kernel_chain.py); `derivc.load` runs them (codegen/chain.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compiler.ir import Program
from compiler.kernel_chain import chain_cuts

from .build import CodegenError, lower_checked, print_checked
from .kir.ir import Kernel
from .mappings import Printed


@dataclass(frozen=True)
class Stage:
    """One kernel of the program: its cut, kernel IR, printed text and lowering record."""
    program: Program
    kernel: Kernel
    printed: Printed
    lowering: dict[str, Any]

    @property
    def name(self) -> str:
        return self.program.output


def kernel_programs(prog: Program) -> list[Program]:
    """The program cut at each definition, in order (compiler.kernel_chain.chain_cuts)."""
    try:
        return chain_cuts(prog)
    except ValueError as exc:
        raise CodegenError(str(exc)) from None


def stages(prog: Program, name: str, sizes: dict[str, int], seed: int) -> list[Stage]:
    """Every kernel lowered, validated at `sizes` and printed; CodegenError naming the kernel."""
    out = []
    for cut in kernel_programs(prog):
        try:
            kernel, record = lower_checked(cut, f"{name}_{cut.output}", sizes, seed)
            printed = print_checked(kernel)
        except CodegenError as exc:
            raise CodegenError(f"kernel {cut.output}: {exc}") from None
        out.append(Stage(cut, kernel, printed, record))
    return out


def check_stages(found: list[Stage], sizes: dict[str, int], seed: int, tiles: dict[str, int]) -> list[dict[str, Any]]:
    """Each kernel's text on the CPU (emulation) against its cut in float64, at `sizes` and the
    kernel check's own draws; CodegenError naming the kernel on a mismatch."""
    from .kernel_check import KernelCheckError, check_kernel_text

    records = []
    for st in found:
        try:
            records.append(check_kernel_text(st.printed, st.program, sizes, seed, tiles, None))
        except KernelCheckError as exc:
            raise CodegenError(f"kernel {st.name}: {exc}") from None
    return records
