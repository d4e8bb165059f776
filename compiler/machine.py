"""The one table of machine facts: element types, tensor-core instructions, device limits.

Rules (MAP-MMA's legality) and codegen (printers, launch, runtime, SASS checks) read these rows;
no other module spells a dtype width, an instruction shape or a device limit.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # the spec's name
    bytes: int
    ctype: str  # storage type in generated CUDA (16-bit types are raw bits)
    torch: str  # torch dtype attribute
    numpy: str | None  # numpy / CuPy dtype name (None: CuPy has no such dtype)
    mma_operand: bool  # may feed tensor cores


DTYPES: dict[str, DType] = {
    "f16": DType("f16", 2, "f16_t", "float16", "float16", True),
    "bf16": DType("bf16", 2, "bf16_t", "bfloat16", None, True),
    "f32": DType("f32", 4, "f32_t", "float32", "float32", False),
    # computed in double by the SIMT mapping only (float64 gradcheck on small builds); every other
    # mapping refuses a kernel with an f64 tensor by name
    "f64": DType("f64", 8, "f64_t", "float64", "float64", False),
    # integer inputs: read only as data of conditions (a gathered index, a document id)
    "i32": DType("i32", 4, "i32_t", "int32", "int32", False),
}


@dataclass(frozen=True)
class MmaInstr:
    """A tensor-core instruction: fragment shape m x n x k (n_max: largest n, step n), operand
    types, accumulator type and the SASS opcode that proves it was emitted."""

    name: str
    m: int
    n: int
    k: int
    n_max: int
    operands: tuple[str, ...]
    accumulator: str
    sass: str


MMA: dict[str, MmaInstr] = {
    "mma_sync": MmaInstr("mma_sync", 16, 8, 16, 8, ("f16", "bf16"), "f32", "HMMA"),
    "wgmma": MmaInstr("wgmma", 64, 8, 16, 256, ("f16", "bf16"), "f32", "HGMMA"),
}


@dataclass(frozen=True)
class Device:
    arch: str
    smem_per_block: int  # bytes of dynamic shared memory one block may use
    regs_per_sm: int
    max_threads_per_block: int
    grid_limits: tuple[int, int, int]


DEVICE = Device(arch="sm_90a", smem_per_block=227 * 1024, regs_per_sm=65536, max_threads_per_block=1024,
                grid_limits=(2**31 - 1, 65535, 65535))
