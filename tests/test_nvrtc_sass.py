"""NVRTC -> cubin -> SASS checks (no GPU needed; skipped when NVRTC is absent).

Kernels are tiny but exercise the instructions derivc's MAP rules promise:
HMMA (mma.sync), LDGSTS (cp.async), LDSM (ldmatrix), HGMMA (wgmma on sm_90a),
and LDL/STL for a runtime-indexed local array.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a bare checkout

from codegen.cuda import cache, nvrtc, sass

needs_nvrtc = pytest.mark.skipif(
    not nvrtc.nvrtc_available(),
    reason="NVRTC not installed (.ci/install_cuda_tools.sh)",
)

SM90A = ("--gpu-architecture=sm_90a", "-std=c++17")

SIMT_SRC = r"""
extern "C" __global__ void saxpy(int n, float a, const float* __restrict__ x, float* __restrict__ y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

# One warp computes C[16x8] = A[16x16] (row-major) * B[16x8] (stored column-major:
# sB[n][k]) with cp.async global->shared copies, ldmatrix fragments and one mma.sync.
MMA_SRC = r"""
#include <cuda_fp16.h>

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

extern "C" __global__ void mma_tile(const half* __restrict__ A, const half* __restrict__ B,
                                    float* __restrict__ C) {
    __shared__ __align__(128) half sA[16 * 16];
    __shared__ __align__(128) half sB[8 * 16];
    const int lane = threadIdx.x;  // launched with 32 threads

    // 16-byte async copies: A is 32 chunks (one per lane), B is 16 chunks.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                 :: "r"(smem_addr(sA + lane * 8)), "l"(A + lane * 8));
    if (lane < 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                     :: "r"(smem_addr(sB + lane * 8)), "l"(B + lane * 8));
    }
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();

    unsigned a[4], b[2];
    // A fragment: lanes 0-15 address rows 0-15 at k=0, lanes 16-31 the same rows at k=8.
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(smem_addr(sA + (lane % 16) * 16 + (lane / 16) * 8)));
    // B fragment: lanes 0-7 address columns n=0-7 at k=0, lanes 8-15 at k=8.
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(b[0]), "=r"(b[1])
                 : "r"(smem_addr(sB + (lane % 8) * 16 + ((lane / 8) % 2) * 8)));

    float d[4] = {0.f, 0.f, 0.f, 0.f};
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));

    const int row = lane / 4, col = (lane % 4) * 2;
    C[row * 8 + col] = d[0];
    C[row * 8 + col + 1] = d[1];
    C[(row + 8) * 8 + col] = d[2];
    C[(row + 8) * 8 + col + 1] = d[3];
}
"""

# One warpgroup (128 threads) issues fence / mma_async / commit / wait on shared-memory
# descriptors (no swizzle).  Only the SASS is checked: the staging copy does not lay the
# tiles out in the core-matrix order the descriptors describe, so don't reuse it for numerics.
WGMMA_SRC = r"""
#include <cuda_fp16.h>

__device__ __forceinline__ unsigned long long desc(const void* p, unsigned lbo, unsigned sbo) {
    unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
    return (unsigned long long)((addr & 0x3FFFF) >> 4)
         | ((unsigned long long)(lbo >> 4) << 16)
         | ((unsigned long long)(sbo >> 4) << 32);  // layout type 0: no swizzle
}

extern "C" __global__ void wgmma_tile(const half* __restrict__ A, const half* __restrict__ B,
                                      float* __restrict__ D) {
    __shared__ __align__(128) half sA[64 * 16];
    __shared__ __align__(128) half sB[8 * 16];
    for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) sA[i] = A[i];
    for (int i = threadIdx.x; i < 8 * 16; i += blockDim.x) sB[i] = B[i];
    __syncthreads();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");

    float d[4] = {0.f, 0.f, 0.f, 0.f};
    const unsigned long long da = desc(sA, 128, 256), db = desc(sB, 128, 256);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
                 "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(da), "l"(db), "r"(0));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    for (int j = 0; j < 4; ++j) D[threadIdx.x * 4 + j] = d[j];
}
"""

# A 1 KiB per-thread array indexed at run time cannot live in registers.
LOCAL_SRC = r"""
extern "C" __global__ void local_array(float* x, int n) {
    float a[256];
    for (int i = 0; i < 256; ++i) a[i] = x[i * n];
    x[threadIdx.x] = a[(n + threadIdx.x) & 255];
}
"""

needs_sass = pytest.mark.skipif(
    not (nvrtc.nvrtc_available() and sass.sass_available()),
    reason="NVRTC or cuobjdump/nvdisasm not installed",
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DERIVC_CACHE_DIR", str(tmp_path / "cache"))


@needs_nvrtc
def test_nvrtc_supports_sm90a():
    assert nvrtc.nvrtc_version() >= (12, 0)


@needs_nvrtc
def test_simt_kernel_compiles():
    result = nvrtc.compile_cubin(SIMT_SRC, "saxpy.cu", SM90A)
    assert result.cubin.startswith(b"\x7fELF")
    assert not result.cache_hit
    assert result.options[0] == "--gpu-architecture=sm_90a"
    assert result.nvrtc_version == nvrtc.nvrtc_version()


@needs_nvrtc
def test_default_arch_and_ptx_target_rejected():
    assert (
        nvrtc.compile_cubin(SIMT_SRC, "saxpy.cu").options[0]
        == f"--gpu-architecture={nvrtc.DEFAULT_ARCH}"
    )
    with pytest.raises(ValueError, match="real architecture"):
        nvrtc.compile_cubin(SIMT_SRC, "saxpy.cu", ("--gpu-architecture=compute_90",))


@needs_sass
def test_simt_sass_has_no_tensor_core_ops():
    report = sass.disassemble(nvrtc.compile_cubin(SIMT_SRC, "saxpy.cu", SM90A).cubin)
    assert "saxpy" in report.kernels
    assert report.count("FFMA") >= 1
    assert not (
        report.has_hmma or report.has_hgmma or report.has_ldgsts or report.has_ldsm
    )
    assert report.local_memory_ops == 0
    assert report.registers is not None and report.registers > 0
    violations = sass.check_promises(
        report, expect_mma="mma_sync", expect_async_copy=True
    )
    assert violations == [
        "MAP-MMA requested mma_sync but no HMMA instruction in SASS of kernel saxpy",
        "async copy requested (cp.async) but no LDGSTS/UTMALDG/UBLKCP instruction in SASS of kernel saxpy",
    ]


@needs_sass
@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_mma_cp_async_ldmatrix_in_sass(arch):
    result = nvrtc.compile_cubin(
        MMA_SRC, "mma.cu", (f"--gpu-architecture={arch}", "-std=c++17")
    )
    report = sass.disassemble(result.cubin)
    assert report.has_hmma and report.has_ldgsts and report.has_ldsm
    assert not report.has_hgmma
    assert report.local_memory_ops == 0
    assert (
        sass.check_promises(
            report, expect_mma="mma_sync", expect_async_copy=True, forbid_spills=True
        )
        == []
    )
    assert sass.check_promises(report, expect_mma="wgmma") == [
        "MAP-MMA requested wgmma but no HGMMA instruction in SASS of kernel mma_tile"
    ]


@needs_sass
def test_wgmma_in_sass_for_sm90a():
    report = sass.disassemble(nvrtc.compile_cubin(WGMMA_SRC, "wgmma.cu", SM90A).cubin)
    assert report.has_hgmma
    assert (
        report.count("WARPGROUP") >= 1
    )  # WARPGROUP.ARRIVE / .DEPBAR from fence / wait
    assert sass.check_promises(report, expect_mma="wgmma", kernel="wgmma_tile") == []


@needs_nvrtc
def test_wgmma_needs_arch_specific_target():
    with pytest.raises(nvrtc.CompileError) as info:
        nvrtc.compile_cubin(WGMMA_SRC, "wgmma.cu", ("--gpu-architecture=sm_90",))
    assert "wgmma" in info.value.log


@needs_sass
def test_local_array_reported_as_spill():
    result = nvrtc.compile_cubin(LOCAL_SRC, "local.cu", (*SM90A, "-Xptxas=-v"))
    report = sass.disassemble(result.cubin, ptxas_log=result.log)
    assert report.local_memory_ops > 0
    assert report.count("STL") > 0 and report.count("LDL") > 0
    res = report.resources["local_array"]
    assert res.stack_bytes >= 1024 and res.spill_store_bytes == 0
    violations = sass.check_promises(report, forbid_spills=True)
    assert len(violations) == 1
    assert "kernel local_array uses local memory" in violations[0]
    assert "LDL/STL" in violations[0] and "1024 bytes stack frame" in violations[0]


@needs_nvrtc
def test_cache_hit_on_second_compile():
    first = nvrtc.compile_cubin(SIMT_SRC, "saxpy.cu", SM90A)
    second = nvrtc.compile_cubin(SIMT_SRC, "saxpy.cu", SM90A)
    assert not first.cache_hit and second.cache_hit
    assert second.cubin == first.cubin and second.log == first.log
    assert not nvrtc.compile_cubin(
        SIMT_SRC, "saxpy.cu", SM90A, use_cache=False
    ).cache_hit
    # A different option is a different key.
    assert not nvrtc.compile_cubin(
        SIMT_SRC, "saxpy.cu", (*SM90A, "-lineinfo")
    ).cache_hit


def _only_entry() -> Path:
    (entry,) = cache.cache_dir().glob("*.cubin.entry")
    return entry


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # truncated write
        lambda data: data[:-1] + bytes([data[-1] ^ 0xFF]),  # flipped byte
        lambda data: b"",  # empty file
        lambda data: b"garbage" + data,  # wrong magic
    ],
    ids=["truncated", "bitflip", "empty", "magic"],
)
@needs_nvrtc
def test_corrupt_cache_entry_is_recompiled(damage):
    first = nvrtc.compile_cubin(SIMT_SRC, "saxpy.cu", SM90A)
    entry = _only_entry()
    entry.write_bytes(damage(entry.read_bytes()))
    again = nvrtc.compile_cubin(SIMT_SRC, "saxpy.cu", SM90A)
    assert not again.cache_hit and again.cubin == first.cubin
    assert nvrtc.compile_cubin(
        SIMT_SRC, "saxpy.cu", SM90A
    ).cache_hit  # rewritten entry is good


@needs_nvrtc
def test_cache_writes_leave_no_temp_files():
    nvrtc.compile_cubin(SIMT_SRC, "saxpy.cu", SM90A)
    assert [p.name for p in cache.cache_dir().iterdir()] == [_only_entry().name]


def test_cache_key_covers_inputs():
    base = {"source": "s", "name": "n", "options": ("-a",), "nvrtc_version": (12, 9)}
    key = cache.cache_key(**base)
    assert key == cache.cache_key(**base)
    for change in [{"source": "t"}, {"options": ("-b",)}, {"nvrtc_version": (12, 8)}]:
        assert cache.cache_key(**{**base, **change}) != key


@needs_nvrtc
def test_compile_error_carries_log():
    bad = 'extern "C" __global__ void broken(float* x) { x[0] = undefined_symbol; }'
    with pytest.raises(nvrtc.CompileError) as info:
        nvrtc.compile_cubin(bad, "broken.cu", SM90A)
    assert "undefined_symbol" in info.value.log
    assert "broken.cu" in str(info.value)
    assert not cache.cache_dir().exists() or not any(cache.cache_dir().iterdir())


@needs_sass
def test_nvdisasm_fallback_when_cuobjdump_missing(monkeypatch):
    from codegen.cuda import toolchain

    if toolchain.find_tool("nvdisasm") is None:
        pytest.skip("nvdisasm not installed")
    cubin = nvrtc.compile_cubin(MMA_SRC, "mma.cu", SM90A).cubin
    real = toolchain.find_tool
    monkeypatch.setattr(
        toolchain, "find_tool", lambda n: None if n == "cuobjdump" else real(n)
    )
    report = sass.disassemble(cubin)
    assert report.tool == "nvdisasm"
    assert report.has_hmma and report.has_ldgsts and report.has_ldsm


def test_parse_sass_handles_predicates_and_modifiers():
    text = """
		Function : k
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0020*/               @P1 LDGSTS.E.BYPASS.128 [R2], desc[UR4][R6.64] ;
        /*0030*/                   STL [R1], R0 ;
		Function : j
        /*0000*/                   EXIT ;
"""
    kernels = sass.parse_sass(text)
    assert kernels["k"] == {"LDC": 1, "HMMA": 1, "LDGSTS": 1, "STL": 1}
    assert kernels["j"] == {"EXIT": 1}


@needs_sass
def test_the_listing_of_both_tools_matches_cuobjdump_sass(monkeypatch):
    """With both tools the instructions come from `nvdisasm -c -ndf` and the resources from
    `cuobjdump -res-usage`: the same opcode counts and registers as `cuobjdump -sass -res-usage`."""
    from codegen.cuda import toolchain

    if toolchain.find_tool("nvdisasm") is None or toolchain.find_tool("cuobjdump") is None:
        pytest.skip("needs both nvdisasm and cuobjdump")
    cubin = nvrtc.compile_cubin(MMA_SRC, "mma.cu", SM90A).cubin
    both = sass.disassemble(cubin)
    real = toolchain.find_tool
    monkeypatch.setattr(toolchain, "find_tool", lambda n: None if n == "nvdisasm" else real(n))
    alone = sass.disassemble(cubin)
    assert (both.tool, alone.tool) == ("nvdisasm", "cuobjdump")
    assert both.kernels == alone.kernels and both.counts == alone.counts and both.has_hmma
    assert both.resources == alone.resources and both.registers is not None and both.registers > 0
