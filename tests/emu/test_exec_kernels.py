"""The examples' emitted kernels as printed (no NVRTC), run on the CPU (codegen.emu.run_printed)
in every scheduling order and compared with the float64 interpreter at the derivation's check
sizes; then mutations of their text (a wait too shallow, a barrier or fence dropped, an mbarrier
wait skipped, operand registers written under an instruction in flight) must show."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from codegen.emu import EmuError

ORDERS = ("forward", "reverse", "random")
REPO = Path(__file__).resolve().parents[2]
TOL = {"f32": 1e-5, "f16": 3e-3, "bf16": 2e-2}


def printed_example(name: str):
    from codegen.build import prepare
    from codegen.ctx_common import DEFAULT_OPTIONS
    from codegen.mappings import print_kernel
    from compiler.derive import derive
    from compiler.spec import load_spec_file

    d = derive(load_spec_file(REPO / "examples" / f"{name}.yaml"), seed=3)
    kernel, _ = prepare(d)
    return d, print_kernel(kernel, DEFAULT_OPTIONS)


_EXAMPLES: dict = {}


def example(name: str):
    if name not in _EXAMPLES:
        _EXAMPLES[name] = printed_example(name)
    return _EXAMPLES[name]


def emulate(name: str, variant: int = 0, sizes: dict | None = None, orders=ORDERS, mutate=None):
    """(relative error vs the interpreter or the EmuError text) per order."""
    from dataclasses import replace

    from codegen.emu import from_storage, run_printed, to_storage
    from compiler.interp import rel_error, run_program

    d, printed = example(name)
    if mutate is not None:
        v = printed.variants[variant]
        text = mutate(v.source.source)
        assert text != v.source.source, "the mutation no longer applies to the emitted text"
        variants = list(printed.variants)
        variants[variant] = replace(v, source=replace(v.source, source=text))
        printed = replace(printed, variants=tuple(variants))
    sizes = dict(sizes or d.check_sizes)
    rng = np.random.default_rng(1)
    inputs = {}
    for t in printed.kernel.inputs:
        x = rng.standard_normal(tuple(a.evaluate(sizes) for a in t.dims))
        inputs[t.name] = from_storage(to_storage(x, t.dtype), t.dtype).astype(np.float64)
    ref = run_program(d.final, sizes, inputs)[printed.kernel.output.name]
    shaped = {n for t in printed.kernel.inputs for a in t.dims for n in a.names()}
    given = {n: sizes[n] for n in printed.kernel.dynamic() if n not in shaped}
    out = {}
    for order in orders:
        try:
            got = run_printed(printed, variant, [inputs[t.name] for t in printed.kernel.inputs], given, order, seed=4)
            out[order] = rel_error(got.astype(np.float64), ref)
        except EmuError as e:
            out[order] = str(e)
    return out, TOL[printed.kernel.output.dtype]


@pytest.mark.parametrize("name,variant,sizes", [
    ("gemm_f32_simt", 0, None), ("softmax_online", 0, None), ("layernorm", 0, None),
    ("gemm", 0, None), ("flash_attention", 0, None),
    ("gemm_wgmma", 0, None), ("gemm_wgmma", 1, {"M": 150, "K": 72, "N": 272}),
    ("flash_attention_wgmma", 0, None),
])
def test_emitted_kernel_matches_the_interpreter(name, variant, sizes):
    errs, tol = emulate(name, variant, sizes)
    assert all(isinstance(e, float) and e < tol for e in errs.values()), errs


def _nth(text: str, old: str, new: str, n: int = 0) -> str:
    at = -1
    for _ in range(n + 1):
        at = text.index(old, at + 1)
    return text[:at] + new + text[at + len(old):]


# sizes: the check sizes of gemm (K = 80: two k-tiles) never run its steady-state loop, nor do
# flash_attention_wgmma's (N = 200: two key tiles) wrap its 3-slot ring; these mutations need more
GEMM_K = {"M": 150, "N": 304, "K": 328}  # K, N % 8 == 0: block (0, 0) is interior
FA_LONG = {"B": 1, "H": 1, "N": 520, "D": 128}
WAIT_SYNC = "cp_async_wait<1>();\n                __syncthreads();"


def test_a_variant_the_host_would_not_pick_is_refused_by_name():
    from codegen.emu import VariantUnavailable, run_printed

    _, printed = example("gemm_wgmma")
    a, b = np.zeros((150, 72)), np.zeros((72, 270))  # N = 270: rows of B are not 16-byte multiples
    with pytest.raises(VariantUnavailable, match=r"kernel_tma cannot run at sizes .* picks variant 0"):
        run_printed(printed, 1, [a, b])


@pytest.mark.parametrize("name,sizes,mutation", [
    ("gemm", None, lambda s: _nth(s, WAIT_SYNC, WAIT_SYNC.replace("<1>", "<2>"), 1)),
    ("gemm", GEMM_K, lambda s: _nth(s, WAIT_SYNC, WAIT_SYNC.replace("<1>", "<2>"))),
    ("gemm", GEMM_K, lambda s: _nth(s, WAIT_SYNC, "cp_async_wait<1>();")),
    ("gemm_wgmma", None, lambda s: _nth(s, "fence_proxy_async();\n        __syncthreads();", "__syncthreads();")),
    ("flash_attention_wgmma", None, lambda s: _nth(s, "wg_wait<1>();", "wg_wait<2>();")),
    ("flash_attention_wgmma", None, lambda s: _nth(s, "mbar_wait(bar_v + 8 * slot, ph);", "")),
    ("flash_attention_wgmma", FA_LONG, lambda s: _nth(s, "if (j >= 3) mbar_wait(bar_e", "if (j >= 99) mbar_wait(bar_e")),
    ("flash_attention_wgmma", None, lambda s: s.replace("pn[jj >> 1][2 * (jj & 1) + h] = pack",
                                                        "pa[jj >> 1][2 * (jj & 1) + h] = pack")),
    ("flash_attention_wgmma", None, lambda s: _nth(s, "wg_wait<0>();", "o[5] = 0.0f; wg_wait<0>();", 1)),
], ids=["gemm-tail-cp.async-wait-too-shallow", "gemm-main-cp.async-wait-too-shallow", "gemm-main-no-barrier",
        "gemm-wgmma-no-proxy-fence", "fa-wgmma-wait-too-shallow", "fa-wgmma-no-V-wait", "fa-wgmma-producer-skips-empty-wait",
        "fa-wgmma-P-written-under-the-PV-in-flight", "fa-wgmma-O-written-under-the-PV-in-flight"])
def test_kernel_mutations_show(name, sizes, mutation):
    assert all(isinstance(e, float) for e in emulate(name, sizes=sizes, orders=("forward",))[0].values())
    errs, tol = emulate(name, sizes=sizes, mutate=mutation)
    assert any(not isinstance(e, float) or not e < tol for e in errs.values()), errs
