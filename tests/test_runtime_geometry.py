"""The runtime's per-shape geometry, without a GPU: sizes read off shapes, grid from the kernel
IR's extents and checked against the device limits, 32-bit tensor-core kernels refused past
2^31 elements (the SIMT mapping indexes with 64-bit offsets)."""
from __future__ import annotations

from pathlib import Path

import pytest

from codegen.ctx_common import DEFAULT_OPTIONS
from codegen.lower import lower
from codegen.mappings import print_kernel
from codegen.runtime import CompiledKernel
from compiler.derive import derive
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
_CACHE: dict[str, CompiledKernel] = {}


def geometry_only(example: str) -> CompiledKernel:
    """A CompiledKernel with everything but the loaded modules (no device needed)."""
    if example not in _CACHE:
        path = ROOT / "examples" / f"{example}.yaml"
        spec = load_spec_file(path)
        printed = print_kernel(lower(derive(spec, str(path), seed=1).final, spec.name), DEFAULT_OPTIONS)
        ck = object.__new__(CompiledKernel)
        ck.printed, ck.kernel = printed, printed.kernel
        ck._ins, ck._out, ck._shapes = printed.kernel.inputs, printed.kernel.output, {}
        _CACHE[example] = ck
    return _CACHE[example]


def test_sizes_and_grid_come_from_the_shapes():
    ck = geometry_only("gemm_wgmma")
    geo = ck._shape(((300, 136), (136, 520)))
    assert geo.sizes == {"M": 300, "K": 136, "N": 520} and geo.out_shape == (300, 520)
    assert geo.grids[0] == (-(-520 // 256), -(-300 // 128), 1)
    with pytest.raises(ValueError, match="dim K"):
        ck._shape(((300, 136), (135, 520)))


def test_tensor_core_kernel_refuses_32_bit_overflow_at_the_boundary():
    ck = geometry_only("gemm_wgmma")
    ck._shape(((65536, 32767), (32767, 64)))  # 2^31 - 65536 elements in A: fine
    with pytest.raises(ValueError, match="2\\^31"):
        ck._shape(((65536, 32768), (32768, 64)))  # exactly 2^31 elements


def test_grid_limit_is_checked_before_launch():
    ck = geometry_only("gemm_f32_simt")  # grid.y enumerates M / 64 tiles: at most 65535
    ck._shape(((64 * 65535, 16), (16, 64)))
    with pytest.raises(ValueError, match="device limit 65535"):
        ck._shape(((64 * 65535 + 1, 16), (16, 64)))
