"""The runtime's per-shape geometry, without a GPU: sizes read off shapes, grid from the kernel
IR's extents and checked against the device limits, 32-bit tensor-core kernels refused past
2^31 elements (the SIMT mapping indexes with 64-bit offsets), sizes no shape determines passed
by name."""
from __future__ import annotations

from pathlib import Path

import pytest

from codegen.mappings.ctx_common import DEFAULT_OPTIONS
from codegen.kir.lower import lower
from codegen.mappings import print_kernel
from codegen.cuda.runtime import CompiledKernel
from compiler.derive import derive
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
_CACHE: dict[str, CompiledKernel] = {}


def geometry_only(example: str, path: Path | None = None) -> CompiledKernel:
    """A CompiledKernel with everything but the loaded modules (no device needed)."""
    if example not in _CACHE:
        path = path or ROOT / "examples" / f"{example}.yaml"
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


def test_a_size_no_shape_determines_is_passed_by_name(tmp_path):
    """The sliding window with W dynamic: W is a kernel argument that no input's shape gives."""
    text = (ROOT / "examples" / "attention_sliding_window.yaml").read_text()
    assert "W: 1024}" in text
    path = tmp_path / "window_dynamic.yaml"
    path.write_text(text.replace("W: 1024}", "W: dynamic}").replace("check_sizes: {B: 1, H: 2, N: 200}",
                                                                    "check_sizes: {B: 1, H: 2, N: 200, W: 37}"))
    ck = geometry_only("window_dynamic", path)
    assert "W" in ck.kernel.dynamic()
    shape = (2, 3, 1000, 128)
    with pytest.raises(ValueError, match=r"size W is not the extent of any input dimension: pass it by name"):
        ck._shape((shape,) * 3)
    at = {n: i for i, n in enumerate(ck.kernel.dynamic())}
    g512, g64 = ck._shape((shape,) * 3, (("W", 512),)), ck._shape((shape,) * 3, (("W", 64),))
    assert g512.sizes["W"] == 512 and g512.size_args[at["W"]] == 512 and g64.size_args[at["W"]] == 64
    assert g512.size_args[at["N"]] == 1000 and g512.grids == g64.grids
    for given, reason in ((("X", 3),), "not a size of the kernel"), ((("D", 128),), "a fixed size"), \
                         ((("N", 999),), "dim N = 1000 but the call passes N = 999"), \
                         ((("W", 2.5),), "an int is needed"):
        with pytest.raises(ValueError, match=reason):
            ck._shape((shape,) * 3, given)
