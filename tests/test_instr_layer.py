"""The instruction-wrapper layer (codegen/mappings/templates/constructs/instr.cu.j2), CPU only.

Every mapping's kernel (the examples, generated specs of tests/specgen.py, and the hand-built
wgmma plans of tests/plankit.py, each with its TMA variant) keeps its inline PTX in one wrapper
section: no `asm` and no DERIVC_EMU test outside it; inside it, every wrapper is printed twice,
the PTX under `#ifndef DERIVC_EMU`, its emulation under `#else`, blocks balanced and not nested.
The emulation branch parses with g++ against a stub of the derivc_emu contract (EMU_API.md):
the contract's declarations, no bodies, so a wrapper calling the emulation with another name or
signature than the contract's fails to compile here, before the emulation exists.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from codegen.build import kernel_name  # noqa: E402
from codegen.kir.lower import lower  # noqa: E402
from codegen.mappings.ctx_common import DEFAULT_OPTIONS  # noqa: E402
from codegen.mappings import REGISTRY, print_kernel  # noqa: E402
from codegen.mappings.render_attn_wgmma import render_attn_wgmma  # noqa: E402
from codegen.mappings.render_wgmma import render_wgmma  # noqa: E402
from compiler.derive import derive  # noqa: E402
from compiler.spec import load_spec_file  # noqa: E402
from derivc_testing import NO_KERNEL  # noqa: E402
from plankit import attention, gemm, mask  # noqa: E402
from specgen import cases  # noqa: E402

BEGIN = "/* ---- instruction wrappers (constructs/instr.cu.j2)"
END = "/* ---- end of instruction wrappers ---- */"
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if p.stem not in NO_KERNEL)
GENERATED = [c for c in cases(12, seed=11) if c.mapping != "refuse"]

# The derivc_emu API of EMU_API.md, declared as the contract states it, and the CUDA language
# surface derivc_emu.h defines for the host (only what the kernels use).
STUB = r"""
#include <cmath>
#include <algorithm>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__ __restrict
#define __shared__ static
struct derivc_dim3 { unsigned x, y, z; };
extern derivc_dim3 threadIdx, blockIdx, blockDim, gridDim;
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w);
float2 make_float2(float x, float y);
void __syncthreads();
float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width = 32);
float __shfl_sync(unsigned mask, float v, int src_lane, int width = 32);
float __shfl_down_sync(unsigned mask, float v, unsigned delta, int width = 32);
float __int_as_float(int);
float __uint_as_float(unsigned);
unsigned __float_as_uint(float);
int __float_as_int(float);
double __longlong_as_double(long long);
double rsqrt(double);
float __expf(float);
float __fdividef(float, float);
float rsqrtf(float);
template <class T> T __ldg(const T* p);
using std::min;
using std::max;
namespace derivc_emu {
enum class Dtype { F16, BF16 };
unsigned char* dynamic_smem();
unsigned smem_addr(const void* p);
float cvt_f32_f16(unsigned short h);
unsigned short cvt_rn_f16_f32(float x);
unsigned short cvt_rn_bf16_f32(float x);
unsigned cvt_rn_f16x2_f32(float hi, float lo);
unsigned cvt_rn_bf16x2_f32(float hi, float lo);
float ex2_approx_ftz(float x);
float tanh_approx(float x);
void cp_async_cg16(unsigned dst, const void* src, int src_bytes);
void cp_async_commit_group();
void cp_async_wait_group(int n);
void st_shared(unsigned addr, const void* bytes, int nbytes);
void ld_shared(unsigned addr, void* bytes, int nbytes);
uint4 ld_global_cs_v4(const void* p);
void st_global_cs_v4(void* p, uint4 v);
void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned addr, bool trans);
void mma_m16n8k16(Dtype dtype, float* d, const unsigned* a, unsigned b0, unsigned b1);
void wgmma_fence();
void wgmma_commit_group();
void wgmma_wait_group(int n);
void wgmma_ss(Dtype dtype, int n, float* d, unsigned long long desc_a, unsigned long long desc_b,
              int scale_d, int tnsp_a, int tnsp_b);
void wgmma_rs(Dtype dtype, int n, float* d, const unsigned* a4, unsigned long long desc_b, int scale_d, int tnsp_b);
void fence_proxy_async();
void fence_mbarrier_init();
void mbar_init(unsigned bar, unsigned count);
void mbar_arrive_expect_tx(unsigned bar, unsigned bytes);
void mbar_arrive(unsigned bar);
void mbar_wait_parity(unsigned bar, unsigned parity);
void tma_load(unsigned dst, const void* tensor_map, unsigned bar, int rank, const int* coords);
void setmaxnreg(int n, bool inc);
void bar_sync(int id, int count);
}  // namespace derivc_emu
"""


# ----------------------------------------------------------------------------- the kernels


@lru_cache(maxsize=None)
def _derived_sources(path: str) -> tuple[tuple[str, str, str], ...]:
    """(mapping, stem, CUDA text) of every variant of the spec's kernel and of its backward kernels.
    Derived and lowered without the numeric checks: the builds of the same specs check those
    (test_cli / test_codegen_examples for the examples, test_differential for the generated ones)."""
    from compiler.derive_grad import derive_gradient
    from compiler.kernel_chain import chain_of, kernel_derivations

    from compiler.schedule_variants import resolve

    spec = load_spec_file(Path(path))
    specs = [spec]
    if spec.variants:  # and the variant of every parameter's last choice (a tuned GEMM's split chain)
        specs.append(resolve(spec, {name: values[-1] for name, values in spec.variants.items()}))
    derivations = []
    for s in specs:
        d = derive(s, path, seed=5, check=False)
        derivations += kernel_derivations(d) if chain_of(d) else [d]  # a chain: each kernel's text
    if spec.grad is not None:
        derivations += derive_gradient(spec, path, seed=5, check=False).kernels
    out = []
    for d in derivations:
        printed = print_kernel(lower(d.final, kernel_name(d)), DEFAULT_OPTIONS)
        out += [(printed.mapping, v.stem, v.source.source) for v in printed.variants]
    return tuple(out)


def _wgmma_plans() -> list[tuple[str, str, str]]:
    out = []
    for plan in (gemm("wg_f16_kn", "f16", mma="wgmma", block=(128, 256, 64), warps=(8, 1), stages=4,
                      guards=(True, True, True)),
                 gemm("wg_bf16_nk", "bf16", mma="wgmma", block=(64, 128, 128), warps=(4, 2), stages=2,
                      guards=(True, True, True), b_transposed=True, batch=True)):
        for tma in (False, True):
            out.append(("contraction_wgmma", f"{plan.kernel_name}_tma{int(tma)}",
                        render_wgmma(plan, tma=tma).source))
    for dtype, d, causal, overlap in (("f16", 128, True, True), ("bf16", 64, False, False)):
        plan = attention(f"aw_{dtype}_d{d}", dtype, d=d, mma="wgmma", block=(128, 128), warps=8, stages=2,
                         guards=(True, True), q_level="shared")
        out.append(("online_fold_wgmma", plan.kernel_name,
                    render_attn_wgmma(plan, mask(plan, causal), overlap=overlap).source))
    return out


def _all_sources() -> list[tuple[str, str, str]]:
    out = []
    for p in EXAMPLES:
        out += [(m, f"{p.stem}/{stem}", text) for m, stem, text in _derived_sources(str(p))]
    return out


@pytest.fixture(scope="module")
def generated_sources(tmp_path_factory) -> list[tuple[str, str, str]]:
    folder = tmp_path_factory.mktemp("specs")
    out = []
    for case in GENERATED:
        out += [(m, f"{case.name}/{stem}", text) for m, stem, text in _derived_sources(str(case.write(folder)))]
    return out


# ----------------------------------------------------------------------------- the checks


def split_section(text: str) -> tuple[str, str]:
    """(the wrapper section, everything else); exactly one section."""
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "one wrapper section per kernel"
    a = text.index(BEGIN)
    b = text.index(END) + len(END)
    assert a < b
    return text[a:b], text[:a] + text[b:]


DEFINED = re.compile(r"^(?:template <[^>]*> )?__device__ __forceinline__ [\w\s\*&]*?\b(\w+)\(", re.M)
MACRO = re.compile(r"^#define (\w+)", re.M)


def wrapper_blocks(section: str) -> list[tuple[str, str]]:
    """The (PTX, emulation) branch pairs of the section; asserts the directives' shape."""
    blocks, state, gpu, emu = [], "out", [], []
    for line in section.splitlines():
        directive = line.strip()
        if directive.startswith("#") and not directive.startswith("#define") and directive != "#pragma unroll":
            expected = {"out": "#ifndef DERIVC_EMU", "gpu": "#else", "emu": "#endif"}[state]
            assert directive == expected, f"{directive!r} where {expected!r} belongs (blocks balanced, not nested)"
            if state == "emu":
                blocks.append(("\n".join(gpu), "\n".join(emu)))
                gpu, emu = [], []
            state = {"out": "gpu", "gpu": "emu", "emu": "out"}[state]
            continue
        if state == "gpu":
            gpu.append(line)
        elif state == "emu":
            emu.append(line)
        else:
            assert not line.strip() or line.lstrip().startswith(("/*", "//")), \
                f"wrapper section text outside a PTX / emulation pair: {line!r}"
    assert state == "out", "an #ifndef DERIVC_EMU block is not closed"
    return blocks


def names(branch: str) -> list[str]:
    return sorted(DEFINED.findall(branch) + MACRO.findall(branch))


def check_layer(text: str) -> None:
    section, body = split_section(text)
    assert not re.search(r"\basm\b", body), "inline PTX outside the wrapper section"
    assert "DERIVC_EMU" not in body and not re.search(r"^\s*#\s*if", body, re.M), \
        "a DERIVC_EMU branch outside the wrapper section"
    assert "extern __shared__" not in body, "the dynamic shared array is declared through DERIVC_DYNAMIC_SMEM"
    blocks = wrapper_blocks(section)
    assert blocks
    for gpu, emu in blocks:
        assert names(gpu) and names(gpu) == names(emu), f"wrappers {names(gpu)} vs emulation {names(emu)}"
        assert not re.search(r"\basm\b", emu), f"inline PTX in the emulation of {names(gpu)}"
        for fn in re.split(r"(?=^(?:template <[^>]*> )?__device__ )", gpu, flags=re.M):
            if DEFINED.match(fn):
                assert re.search(r"\basm\b", fn), f"a wrapper without an instruction: {DEFINED.match(fn).group(1)}"
    defined = [n for gpu, _ in blocks for n in set(names(gpu))]
    assert len(defined) == len(set(defined)), "a wrapper printed twice"


GXX = ("g++", "-std=c++17", "-Wno-unknown-pragmas", "-DDERIVC_EMU")


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> Path:
    """derivc_emu_stub.h beside its precompiled header (g++ reads the .gch in its place: the
    standard headers are parsed once per module, not once per kernel)."""
    if shutil.which("g++") is None:
        pytest.skip("no host C++ compiler")
    header = tmp_path_factory.mktemp("stub") / "derivc_emu_stub.h"
    header.write_text(STUB)
    r = subprocess.run([*GXX, "-x", "c++-header", str(header), "-o", f"{header}.gch"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return header


def check_emulation_parses(text: str, stub: Path, tmp_path: Path) -> None:
    kernel = tmp_path / "kernel.cu"
    kernel.write_text(text)
    r = subprocess.run([*GXX, "-fsyntax-only", "-include", str(stub), "-x", "c++", str(kernel)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_kernels_keep_instructions_in_the_layer(example: Path, stub, tmp_path):
    for _, stem, text in _derived_sources(str(example)):
        check_layer(text)
        check_emulation_parses(text, stub, tmp_path)


def test_generated_and_planned_kernels_keep_instructions_in_the_layer(generated_sources, stub, tmp_path):
    for mapping, stem, text in generated_sources + _wgmma_plans():
        check_layer(text)
        check_emulation_parses(text, stub, tmp_path)


def _layer_macros_rendered() -> str:
    """Every macro of the layer printed once (wgmma ones at one sample shape)."""
    import jinja2
    from codegen.mappings.templates_env import _env

    module = _env.get_template("constructs/instr.cu.j2").module
    sample = {"fname": "sample_wrapper", "n": 64, "dtype": "bf16", "trans_b": True, "trans_a": True}
    out = []
    for name in dir(module):
        macro = getattr(module, name)
        if isinstance(macro, jinja2.runtime.Macro) and not macro.caller:
            text = str(macro(*(sample[a] for a in macro.arguments)))
            out += [text] if "#ifndef DERIVC_EMU" in text else []  # (emu_dtype prints a name)
    return "\n".join(out)


def test_every_mapping_and_wrapper_is_covered(generated_sources):
    """The kernels above are printed by every registered mapping and hold every wrapper and every
    emulation call the layer can print (so each call was checked against the contract)."""
    sources = _all_sources() + generated_sources + _wgmma_plans()
    assert {m.name for m in REGISTRY.values()} <= {m for m, _, _ in sources}
    blocks = [blk for _, _, text in sources for blk in wrapper_blocks(split_section(text)[0])]
    layer = wrapper_blocks(_layer_macros_rendered())
    emu_calls = {c for _, emu in layer for c in re.findall(r"derivc_emu::(\w+)\(", emu)}
    assert len(emu_calls) > 30
    assert emu_calls <= {c for _, emu in blocks for c in re.findall(r"derivc_emu::(\w+)\(", emu)}
    wrappers = {n for gpu, _ in layer for n in names(gpu)} - {"sample_wrapper"}
    assert wrappers - {n for gpu, _ in blocks for n in names(gpu)} == set()


def test_the_checks_catch_a_misplaced_instruction():
    """The checks can fail: PTX in the body, a wrapper without its emulation, an unclosed block."""
    _, _, text = _derived_sources(str(ROOT / "examples/gemm.yaml"))[0]
    check_layer(text)
    body_asm = text.replace("cp_async_commit();", 'asm volatile("cp.async.commit_group;");', 1)
    assert body_asm != text
    with pytest.raises(AssertionError, match="outside the wrapper section"):
        check_layer(body_asm)
    no_emu = re.sub(r"#else\n__device__ __forceinline__ float fast_exp2[^\n]*\n", "#else\n", text)
    assert no_emu != text
    with pytest.raises(AssertionError, match="emulation"):
        check_layer(no_emu)
    unclosed = text.replace("#endif\n", "", 1)
    with pytest.raises(AssertionError, match="balanced"):
        check_layer(unclosed)


def test_the_stub_catches_a_call_off_the_contract(stub, tmp_path):
    _, _, text = _derived_sources(str(ROOT / "examples/gemm.yaml"))[0]
    off = text.replace("derivc_emu::ldmatrix_x4(r0, r1, r2, r3, addr, false)",
                       "derivc_emu::ldmatrix_x4(r0, r1, r2, r3, addr)", 1)
    assert off != text
    with pytest.raises(AssertionError, match="ldmatrix_x4"):
        check_emulation_parses(off, stub, tmp_path)
