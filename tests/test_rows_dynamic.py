"""Rows of any width on the rowwise mapping, run through the CPU emulation (codegen/emu).

- softmax, LayerNorm and RMSNorm with `C: dynamic`: one kernel for every width, the threads
  striding over the row with a guarded last sweep, 16-byte accesses where the row length and the
  bases allow (else one element per access); the kernel text runs against the program at widths
  1, 7, 255, 256, 1000, 4097, 9000, 16393 (and the build's wide draw at the width rounded up to
  8: the vector path); a row read by several sweeps is kept in registers for its first 8192
  columns (codegen/mappings/rowwise_dynamic.py), the rest read again;
- a fixed width the threads do not divide (C = 1000) keeps the fixed-width form with a tail
  guard; a width they divide keeps the unguarded fast path;
- a kernel IR with a dynamic lane is refused by name by the mappings that do not print one;
- mutations: the tail guard dropped, the vector path taken at any width, the sweep past the
  register prefix starting one vector late, are caught.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from codegen.emu import EmuError
from codegen.kernel_check import KernelCheckError, check_kernel_text
from codegen.kir.interp import validate
from codegen.kir.lower import lower
from codegen.mappings import print_kernel, rowwise
from compiler.derive import derive
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
DYNAMIC = ["softmax_dynamic", "layernorm_dynamic", "rmsnorm_dynamic"]
WIDTHS = [1, 7, 255, 256, 1000, 4097, 9000, 16393]  # past 8192: beyond the register prefix

pytestmark = pytest.mark.xdist_group("rows_dynamic")


def _derived(name: str):
    path = ROOT / "examples" / f"{name}.yaml"
    d = derive(load_spec_file(path), str(path), seed=7)
    return d, lower(d.programs[-1], name)


@pytest.fixture(scope="module", params=DYNAMIC)
def dynamic_example(request):
    d, kernel = _derived(request.param)
    return d, kernel, print_kernel(kernel, ())


def test_dynamic_row_is_one_rowwise_kernel_with_a_strided_lane(dynamic_example):
    _, kernel, printed = dynamic_example
    assert printed.mapping == "rowwise"
    (lane,) = kernel.lanes
    assert lane.extent is None and str(lane.ext) == "C"
    plan = printed.plan
    assert plan.row is None and plan.sweeps is None and plan.tail and plan.vec == 8
    src = printed.variants[0].source.source
    prefix = 8192 // (plan.threads * 8)  # the register prefix: 8192 columns
    assert "(long long)(sz_C) % 8 == 0" in src and f"for (int k = 0; k < {prefix}; ++k)" in src
    assert f"for (int k = {prefix}; (long long)k * {plan.threads * 8} < (long long)(sz_C); ++k)" in src


@pytest.mark.parametrize("width", WIDTHS)
def test_dynamic_row_kernel_text_at_every_width(dynamic_example, width):
    d, kernel, printed = dynamic_example
    sizes = {"R": 3, "C": width}
    assert validate(kernel, d.programs[-1], sizes, seed=width)["rel_error"] <= 1e-12
    record = check_kernel_text(printed, d.programs[-1], sizes, seed=width)
    assert record["passed"]
    assert {r["sizes"]["C"] for r in record["draws"]} == {width, -(-width // 8) * 8}


def _with_text(printed, old: str, new: str):
    """printed with its kernel text mutated (every occurrence of old)."""
    from dataclasses import replace

    src = printed.variants[0].source
    assert old in src.source
    variant = replace(printed.variants[0], source=replace(src, source=src.source.replace(old, new)))
    return replace(printed, variants=(variant,) + printed.variants[1:])


@pytest.mark.parametrize("width", [7, 1000, 9000])
def test_dropping_the_tail_guard_is_caught(width):
    d, kernel = _derived("rmsnorm_dynamic")
    printed = _with_text(print_kernel(kernel, ()), "if (col0 < (long long)(sz_C)) {", "if (true) {")
    with pytest.raises(KernelCheckError):
        check_kernel_text(printed, d.programs[-1], {"R": 3, "C": width}, seed=1)


def test_vector_path_at_an_unaligned_width_is_caught(monkeypatch):
    d, kernel = _derived("softmax_dynamic")
    monkeypatch.setattr(rowwise, "_aligned", lambda k, p: "true")
    printed = print_kernel(kernel, ())
    with pytest.raises(KernelCheckError):
        check_kernel_text(printed, d.programs[-1], {"R": 3, "C": 1001}, seed=1)


def test_fixed_width_not_divided_keeps_the_fixed_form_with_a_tail():
    _, kernel = _derived("softmax_c1000")
    plan = print_kernel(kernel, ()).plan
    assert (plan.row, plan.threads, plan.vec, plan.sweeps, plan.tail) == (1000, 128, 8, 1, True)
    _, kernel = _derived("softmax_two_pass")
    plan = print_kernel(kernel, ()).plan
    assert (plan.row, plan.sweeps, plan.tail) == (8192, 8, False)  # the fast path: no guard


def test_other_mappings_refuse_a_dynamic_lane_by_name(monkeypatch):
    from codegen.kir.lower import UnsupportedMapping

    _, kernel = _derived("softmax_dynamic")
    def refused(k, vec=None):
        raise UnsupportedMapping("rowwise mapping: switched off by the test")

    monkeypatch.setattr(rowwise, "_body", refused)
    with pytest.raises(UnsupportedMapping, match="simt: does not print a lane of dynamic extent"):
        print_kernel(kernel, ())


def test_register_prefix_then_memory_and_a_late_remainder_is_caught():
    d, kernel = _derived("layernorm_dynamic")
    printed = print_kernel(kernel, ())
    src = printed.variants[0].source.source
    assert "float xr_" in src and "W" not in "".join(x for x in src.splitlines() if "float xr_" in x)
    prefix = 8192 // (printed.plan.threads * 8)  # 256 threads x 8 halves: 4 sweeps cover 8192 columns
    assert f"for (int k = {prefix}; (long long)k * 2048 < (long long)(sz_C); ++k)" in src
    check_kernel_text(printed, d.programs[-1], {"R": 2, "C": 9000}, seed=3)
    late = _with_text(printed, f"for (int k = {prefix}; (long long)k * 2048", f"for (int k = {prefix + 1}; (long long)k * 2048")
    with pytest.raises(KernelCheckError):
        check_kernel_text(late, d.programs[-1], {"R": 2, "C": 9000}, seed=3)


def test_a_covered_prefix_has_no_row_end_guard(dynamic_example):
    """Where the row covers the register prefix, the prefix sweeps have no per-vector guard (their
    loads are independent: all in flight at once, as in the fixed-width kernel)."""
    _, _, printed = dynamic_example
    plan = printed.plan
    src = printed.variants[0].source.source
    cols = 8192
    assert src.count(f"if ((long long)(sz_C) >= {cols}LL) {{") >= 2  # each sweep, both vector widths
    covered = src.split(f"if ((long long)(sz_C) >= {cols}LL) {{", 1)[1].split("} else {", 1)[0]
    assert "col0 < (long long)(sz_C)" not in covered and f"for (int k = 0; k < {cols // (plan.threads * 8)}; ++k)" in covered


@pytest.mark.parametrize("width", [1000, 4097])
def test_a_prefix_taken_as_covered_too_early_is_caught(width):
    d, kernel = _derived("layernorm_dynamic")
    printed = _with_text(print_kernel(kernel, ()), "if ((long long)(sz_C) >= 8192LL) {", "if ((long long)(sz_C) >= 512LL) {")
    with pytest.raises((KernelCheckError, EmuError)):
        check_kernel_text(printed, d.programs[-1], {"R": 3, "C": width}, seed=1)
