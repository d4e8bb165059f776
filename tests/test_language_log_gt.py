"""The language's `log(e)` and step `gt(a, b)` through every consumer: the parser and the printer,
the reference and kernel-IR interpreters (log 0 = -inf, log of a negative = NaN, gt of a NaN or a
tie = 0), the Coq / Lean export (the algebra's fields `log` and `gt`; gt of a value that may be
-inf is refused by name), and builds on the row-wise, SIMT and GEMM-epilogue (wgmma, mma.sync)
printers, each checked on the CPU by the kernel step.  The specs compare values that tie in every
draw (`gt(X[r, c], X[r, 0])` at c = 0, `gt(M[r], X[r, k])` at the row's maximum), so a printer
that writes `>=` for gt fails its kernel step; so does one that prints log as log2."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from derivc_testing import build_spec

from codegen.kir.interp import run_kernel
from codegen.kir.lower import lower
from codegen.mappings import cexpr, epilogue, rowwise, simt
from compiler.derive import derive
from compiler.interp import run_program
from compiler.ir import Bin, Read, Un, walk
from compiler.lower_spec import lower_spec
from compiler.obligations import write_obligations
from compiler.obligations_terms import ExportError, Exporter
from compiler.printer import show_expr
from compiler.spec import load_spec_file, parse_spec_text


def _doc(name: str, statements: list[str], inputs: dict, sizes: dict, out: str = "Y", dtype: str = "f32",
         schedule: list | None = None, **extra) -> dict:
    doc = {"name": name, "sizes": sizes, "inputs": {n: {"shape": s, "dtype": t} for n, (s, t) in inputs.items()},
           "statements": statements, "output": {"tensor": out, "dtype": dtype}, "schedule": schedule or []}
    doc.update(extra)
    return doc


def _program(doc: dict):
    return lower_spec(parse_spec_text(yaml.safe_dump(doc, sort_keys=False)))


ELEMENTWISE = _doc("lg", ["Y[i] = log(X[i]) + 10 * gt(X[i], Z[i]) - gt(Z[i], 0.5 * X[i] + 1)"],
                   {"X": (["N"], "f32"), "Z": (["N"], "f32")}, {"N": 8})
X_VALUES = np.array([0.0, -1.0, 1.0, np.nan, 2.0, 3.0, np.inf, 1.0])
Z_VALUES = np.array([0.0, -2.0, 1.0, 0.0, np.nan, 2.0, 1.0, 4.0])
# log x + 10 [x > z] - [z > x / 2 + 1]: ties at 0 and 2, NaN operands at 3 and 4
WANT = np.array([-np.inf, np.nan, 0.0, np.nan, math.log(2.0), math.log(3.0) + 10.0, np.inf, -1.0])


# ---------------------------------------------------------------- parser, printer, interpreters


def test_parse_print_round_trip():
    """log and gt parse to Un("log") / Bin("gt"), print as calls, and the printed text parses back
    to the same expression."""
    body = _program(ELEMENTWISE).defs[0].body
    ops = {(type(x).__name__, x.op) for x in walk(body) if isinstance(x, (Bin, Un))}
    assert {("Un", "log"), ("Bin", "gt")} <= ops
    text = show_expr(body)
    assert "log(X[i])" in text and "gt(X[i], Z[i])" in text and "gt(Z[i], 0.5 * X[i] + 1)" in text
    again = _program({**ELEMENTWISE, "statements": [f"Y[i] = {text}"]}).defs[0].body
    assert again == body


@pytest.mark.parametrize("statement,fragment", [
    ("Y[i] = gt(X[i])", "expected ','"),
    ("Y[i] = log(X[i], X[i])", "expected ')'"),
    ("Y[i] = lg(X[i])", "gt(a, b)"),
])
def test_bad_calls_are_one_clear_error(statement, fragment):
    from derivc_testing import assert_fails

    assert_fails(yaml.safe_dump({**ELEMENTWISE, "statements": [statement]}, sort_keys=False), 2, fragment)


def test_reference_interpreter_values():
    """log 0 = -inf, log(-1) = NaN, log inf = inf; gt(NaN, .) = gt(., NaN) = 0, and a tie is 0."""
    got = run_program(_program(ELEMENTWISE), {"N": 8}, {"X": X_VALUES, "Z": Z_VALUES})["Y"]
    np.testing.assert_array_equal(got, WANT)


def test_kernel_ir_interpreter_values():
    doc = {**ELEMENTWISE, "schedule": [{"rule": "parallel", "def": "Y", "index": "i", "to": "grid.x"}]}
    d = derive(parse_spec_text(yaml.safe_dump(doc, sort_keys=False)), "lg.yaml", check=False)
    k = lower(d.final, d.spec.name)
    got = run_kernel(k, {"N": 8}, {"X": X_VALUES, "Z": Z_VALUES})
    np.testing.assert_array_equal(got, WANT)


def test_c_printers_use_logf_and_a_strict_comparison():
    assert cexpr.unary_c("log", "x") == "logf(x)"
    assert cexpr.gt_c("a", "b") == "((a) > (b) ? 1.0f : 0.0f)"
    text = cexpr.value_c(_program(ELEMENTWISE).defs[0].body, lambda r: f"{r.tensor}_", lambda a: "0")
    assert "logf(X_)" in text and "((X_) > (Z_) ? 1.0f : 0.0f)" in text


# ---------------------------------------------------------------- proof export


def test_export_uses_the_algebra_fields(tmp_path):
    doc = {**ELEMENTWISE, "schedule": [{"rule": "tile", "def": "Y", "index": "i", "size": 4}]}
    path = tmp_path / "lg.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    d = derive(load_spec_file(path), str(path), check=False)
    write_obligations(d, tmp_path / "proofs")
    coq = (tmp_path / "proofs" / "Step01_TILE.v").read_text()
    lean = (tmp_path / "proofs" / "Step01_TILE.lean").read_text()
    assert "(log (t_X (i_ii + 4 * i_io)))" in coq
    assert "(gt (t_X (i_ii + 4 * i_io)) (t_Z (i_ii + 4 * i_io)))" in coq
    assert "f_log" not in coq and "f_gt" not in coq  # fields of the algebra, not quantified functions
    assert "(KAlg.log (t_X" in lean and "(KAlg.gt (t_X" in lean


def test_export_refuses_gt_of_an_extended_value():
    """max(a, b) may be -inf in the proof semantics: gt of it has no term (refused by name)."""
    doc = _doc("lg", ["M[r] = max(k: X[r, k])", "Y[r, k] = gt(X[r, k], M[r])"], {"X": (["R", "C"], "f32")},
               {"R": 3, "C": 5})
    prog = _program(doc)
    y = prog.defs[1]
    with pytest.raises(ExportError, match="gt of a value that may be -inf"):
        Exporter(prog).expr(y.body, {})
    fin = Exporter(prog).expr(Bin("gt", Read("X", y.store), Un("log", Read("X", y.store))), {})
    assert fin[0] == "app" and fin[1] == "gt"


# ---------------------------------------------------------------- builds, checked on the CPU

# row log-softmax: Y = X - M - log Σ exp(X - M), the row log-sum-exp bound once per row (row-wise)
LOG_SOFTMAX = _doc(
    "log_softmax", ["M[r] = max(k: X[r, k])", "L[r] = log(sum(k: exp(X[r, k] - M[r])))", "Y[r, c] = X[r, c] - M[r] - L[r]"],
    {"X": (["R", "C"], "f16")}, {"R": "dynamic", "C": 2048}, check_sizes={"R": 3},
    schedule=[{"rule": "fuse_let", "producer": "L", "def": "Y"}, {"rule": "fuse_let", "producer": "M", "def": "Y"},
              {"rule": "cache_row", "def": "Y", "tensor": "X"},
              {"rule": "parallel", "def": "Y", "index": "r", "to": "grid.x"},
              {"rule": "parallel", "def": "Y", "index": "c", "to": "thread", "count": 256}])
# a row's log-sum-exp and the count of its elements strictly below the row max (which ties with
# one element of every row), one row per thread (SIMT)
ROW_LSE = _doc(
    "row_lse", ["M[r] = max(k: X[r, k])", "LSE[r] = M[r] + log(sum(k: exp(X[r, k] - M[r]))) + sum(k: gt(M[r], X[r, k]))"],
    {"X": (["R", "C"], "f32")}, {"R": "dynamic", "C": 96}, out="LSE", check_sizes={"R": 37},
    schedule=[{"rule": "fuse_let", "producer": "M", "def": "LSE"},
              {"rule": "parallel", "def": "LSE", "index": "r", "to": "grid.x"}])
# element-wise SIMT: column 0 ties with itself in every row
SIMT = _doc(
    "simt_log_gt", ["Y[r, c] = log(X[r, c] * X[r, c] + 1) * gt(Z[r, c], X[r, 0]) + gt(X[r, c], X[r, 0])"],
    {"X": (["R", "C"], "f32"), "Z": (["R", "C"], "f32")}, {"R": "dynamic", "C": 96}, check_sizes={"R": 37},
    schedule=[{"rule": "tile", "def": "Y", "index": "r", "size": 16},
              {"rule": "parallel", "def": "Y", "index": "ro", "to": "grid.x"}])
_WGMMA = [{"rule": "tile", "def": "C", "index": "i", "size": 128}, {"rule": "tile", "def": "C", "index": "j", "size": 256},
          {"rule": "reorder", "def": "C", "outer": "ii", "inner": "jo"},
          {"rule": "tile", "def": "C", "index": "k", "size": 64},
          {"rule": "cache", "def": "C", "tensor": "A", "at": "ko", "over": ["ii", "ki"], "level": "shared", "stages": 4},
          {"rule": "cache", "def": "C", "tensor": "B", "at": "ko", "over": ["ki", "ji"], "level": "shared", "stages": 4},
          {"rule": "parallel", "def": "C", "index": "io", "to": "grid.y"},
          {"rule": "parallel", "def": "C", "index": "jo", "to": "grid.x"},
          {"rule": "parallel", "def": "C", "index": "ii", "to": "warp", "count": 8},
          {"rule": "cache", "def": "C", "accumulator": "ko", "level": "register", "dtype": "f32"},
          {"rule": "map_mma", "def": "C", "index": "ki", "instr": "wgmma"}]
# the ReLU backward dZ = (dY · W) * [Z > 0] as a wgmma GEMM epilogue, and a variant whose step
# compares with column 0 of Z (a tie in every row); the ReLU backward on mma.sync too (the same
# epilogue printer)
RELU_BWD = _doc(
    "gemm_relu_bwd", ["C[i, j] = sum(k: A[i, k] * B[k, j]) * gt(Z[i, j], 0)"],
    {"A": (["M", "K"], "f16"), "B": (["K", "N"], "f16"), "Z": (["M", "N"], "f16")},
    {"M": "dynamic", "N": "dynamic", "K": "dynamic"}, out="C", dtype="f16",
    check_sizes={"M": 150, "N": 270, "K": 72}, schedule=_WGMMA)
RELU_BWD_TIES = {**RELU_BWD, "name": "gemm_gt_ties",
                 "statements": ["C[i, j] = sum(k: A[i, k] * B[k, j]) * (gt(Z[i, j], Z[i, 0]) + log(Z[i, j] * Z[i, j] + 2))"]}

_MMA_SYNC = [*_WGMMA[:4],
             {"rule": "cache", "def": "C", "tensor": "A", "at": "ko", "over": ["ii", "ki"], "level": "shared", "stages": 3},
             {"rule": "cache", "def": "C", "tensor": "B", "at": "ko", "over": ["ki", "ji"], "level": "shared", "stages": 3},
             *_WGMMA[6:8],
             {"rule": "parallel", "def": "C", "index": "ii", "to": "warp", "count": 2},
             {"rule": "parallel", "def": "C", "index": "ji", "to": "warp", "count": 4},
             _WGMMA[9], {**_WGMMA[10], "instr": "mma_sync"}]
RELU_BWD_MMA = {**RELU_BWD, "name": "gemm_relu_bwd_mma", "schedule": _MMA_SYNC}

BUILDS = {  # spec -> (printer named in the kernel's first line, text the kernel must contain)
    "log_softmax": (LOG_SOFTMAX, "(rowwise:", "logf("),
    "row_lse": (ROW_LSE, "(rowwise", "> ("),  # a value per row: one block per row
    "simt_log_gt": (SIMT, "(SIMT", "logf("),
    "gemm_relu_bwd": (RELU_BWD, "wgmma", "> (0.0f) ? 1.0f : 0.0f"),
    "gemm_gt_ties": (RELU_BWD_TIES, "wgmma", "logf("),
    "gemm_relu_bwd_mma": (RELU_BWD_MMA, "mma", "> (0.0f) ? 1.0f : 0.0f"),
}


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_builds_pass_the_kernel_step(tmp_path, name):
    doc, printer, text = BUILDS[name]
    rc, err, out = build_spec(tmp_path, doc)
    assert rc == 0, err
    cu = (out / "kernel.cu").read_text()
    assert printer in cu.splitlines()[0], cu.splitlines()[0]
    assert text in cu
    assert "__logf" not in cu and "log2f" not in cu
    report = (out / "report.md").read_text()
    assert "## Step" in report and "(the kernel text on the CPU)" in report and "— passed" in report


def _mutate_gt(monkeypatch, op: str) -> None:
    def wrong(a: str, b: str, real: str = "float") -> str:
        return f"(({a}) {op} ({b}) ? {cexpr.float_const_c(1.0, real)} : {cexpr.float_const_c(0.0, real)})"

    for mod in (cexpr, simt, rowwise, epilogue):
        monkeypatch.setattr(mod, "gt_c", wrong)


@pytest.mark.parametrize("name", ["row_lse", "simt_log_gt", "gemm_gt_ties"])
def test_gt_printed_as_ge_fails_the_kernel_step(tmp_path, monkeypatch, name):
    _mutate_gt(monkeypatch, ">=")
    rc, err, _ = build_spec(tmp_path, BUILDS[name][0])
    assert rc == 3 and "kernel" in err, err


@pytest.mark.parametrize("name", ["log_softmax", "simt_log_gt"])
def test_log_printed_as_log2_fails_the_kernel_step(tmp_path, monkeypatch, name):
    monkeypatch.setitem(cexpr.UNARY_C, "log", "log2f")
    rc, err, _ = build_spec(tmp_path, BUILDS[name][0])
    assert rc == 3 and "kernel" in err, err
