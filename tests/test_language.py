"""The spec language's comparisons, functions and index values, through every consumer: the
parser and IR₀, the reference interpreter, the kernel IR and its interpreter, the SIMT printer
(NVRTC) and the Coq export (coqc)."""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from derivc_testing import assert_fails, run_cli, spec_yaml
from hypothesis import given, settings, strategies as st

from compiler.interp import random_inputs, run_program
from compiler.ir import Cond, IndexValue, Select, Un, walk
from compiler.lower_spec import lower_spec
from compiler.spec import param_value, parse_spec_text

OPS = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal}
FUNCTIONS = {"exp": math.exp, "log": math.log, "sqrt": math.sqrt, "rsqrt": lambda x: 1 / math.sqrt(x), "tanh": math.tanh,
             "erf": math.erf}


def _spec(statement: str, sizes: dict, inputs: dict, schedule: list | None = None, **extra) -> dict:
    doc = {"name": "lang", "sizes": sizes, "inputs": inputs, "statements": [statement],
           "output": {"tensor": "Y", "dtype": "f32"}, "schedule": schedule or []}
    doc.update(extra)
    return doc


def _program(doc: dict):
    return lower_spec(parse_spec_text(yaml.safe_dump(doc, sort_keys=False)))


def _eval(doc: dict, sizes: dict, seed: int = 0) -> tuple[np.ndarray, dict]:
    prog = _program(doc)
    inputs = random_inputs(prog, sizes, np.random.default_rng(seed))
    return run_program(prog, sizes, inputs)["Y"], inputs


affine = st.tuples(st.integers(-2, 2), st.integers(-2, 2), st.integers(-3, 3))


def _aff_text(c: tuple[int, int, int]) -> str:
    a, b, k = c
    return f"{a}*i + {b}*j + {k}".replace("+ -", "- ").replace("-1*", "-").replace("1*", "") if (a, b) != (0, 0) \
        else f"{k}" if k >= 0 else f"0 - {-k}"


@settings(max_examples=60, deadline=None)
@given(lhs=affine, rhs=affine, op=st.sampled_from(sorted(OPS)))
def test_every_comparison_means_what_it_says(lhs, rhs, op):
    """A guard with any comparison selects exactly the points where it holds (numpy's own
    comparison on the index grid is the reference), and the IR keeps only < and <=."""
    text = f"Y[i, j] = where({_aff_text(lhs)} {op} {_aff_text(rhs)}, X[i, j], 0)"
    doc = _spec(text, {"N": 7, "M": 5}, {"X": {"shape": ["N", "M"], "dtype": "f32"}})
    got, inputs = _eval(doc, {"N": 7, "M": 5})
    i, j = np.meshgrid(np.arange(7), np.arange(5), indexing="ij")
    keep = OPS[op](lhs[0] * i + lhs[1] * j + lhs[2], rhs[0] * i + rhs[1] * j + rhs[2])
    np.testing.assert_array_equal(got, np.where(keep, inputs["X"], 0.0))
    conds = [c for x in walk(_program(doc).defs[0].body) if isinstance(x, Select) for c in x.conds]
    assert conds and all(isinstance(c, Cond) and c.op in ("<", "<=") for c in conds)
    assert len(conds) == (2 if op == "==" else 1)


def test_reduction_guards_take_every_comparison():
    doc = _spec("Y[i] = sum(k | k > i && k >= 1 && i == i: X[k]) + max(k | k < 3 && k <= i: X[k]) + 0 * X[i]",
                {"N": 9}, {"X": {"shape": ["N"], "dtype": "f32"}})
    got, inputs = _eval(doc, {"N": 9})
    x = inputs["X"]
    want = [sum(x[k] for k in range(9) if k > i and k >= 1) + max([x[k] for k in range(9) if k < 3 and k <= i])
            for i in range(9)]
    np.testing.assert_allclose(got, want, rtol=1e-13)


@pytest.mark.parametrize("fn", sorted(FUNCTIONS))
def test_functions_evaluate_as_math(fn):
    doc = _spec(f"Y[i] = {fn}(X[i] * X[i] + 0.25)", {"N": 13}, {"X": {"shape": ["N"], "dtype": "f32"}})
    got, inputs = _eval(doc, {"N": 13})
    want = [FUNCTIONS[fn](float(v) * float(v) + 0.25) for v in inputs["X"]]
    np.testing.assert_allclose(got, want, rtol=1e-13)
    assert any(isinstance(x, Un) and x.op == fn for x in walk(_program(doc).defs[0].body))


def test_sizes_and_indices_are_values():
    doc = _spec("Y[i, j] = sum(k: X[i, k]) / K + S[i] * (j - i) + N - 2 * j + 0 * X[i, j]",
                {"N": "dynamic", "K": 6}, {"X": {"shape": ["N", "K"], "dtype": "f32"}, "S": {"shape": ["N"], "dtype": "f32"}})
    body = _program(doc).defs[0].body
    values = {str(x.aff) for x in walk(body) if isinstance(x, IndexValue)}
    assert values == {"K", "-i + j", "N", "j"}, values  # j - i is one affine value, not two
    got, inputs = _eval(doc, {"N": 5, "K": 6})
    x, s = inputs["X"], inputs["S"]
    i, j = np.meshgrid(np.arange(5), np.arange(6), indexing="ij")
    np.testing.assert_allclose(got, x.sum(1)[:, None] / 6 + s[:, None] * (j - i) + 5 - 2 * j, rtol=1e-12, atol=1e-12)


def test_an_index_used_only_as_a_value_has_no_extent():
    doc = _spec("Y[i, j] = X[i] * (j - i)", {"N": 4}, {"X": {"shape": ["N"], "dtype": "f32"}})
    assert_fails(yaml.safe_dump(doc, sort_keys=False), 2, "index j of Y is not used to index any tensor")


@pytest.mark.parametrize("value", ["1e-6", "1.5E-3", ".5", "-2.0", "+3", "7", "1e+2"])
def test_parameter_numbers_in_any_yaml_form(value):
    text = spec_yaml(_spec("Y[i] = X[i] * eps", {"N": 3}, {"X": {"shape": ["N"], "dtype": "f32"}})).replace(
        "schedule: []", f"params: {{eps: {value}}}\nschedule: []")
    spec = parse_spec_text(text)
    assert param_value(spec, "eps") == float(value)


def _build(doc: dict, tmp: Path, *extra: str) -> tuple[int, str, Path]:
    f = tmp / "s.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp / "out"
    rc, _, err = run_cli(["build", str(f), "-o", str(out), *extra])
    return rc, err, out


TILED = [{"rule": "tile", "def": "Y", "index": "i", "size": 16},
         {"rule": "tile", "def": "Y", "index": "k", "size": 8},
         {"rule": "parallel", "def": "Y", "index": "io", "to": "grid.x"}]


@pytest.mark.xdist_group("coqc")
def test_tiled_program_with_functions_and_index_values_builds_and_proves():
    """Tiling substitutes into index values and guards: the numeric checks, the kernel-IR
    validation, NVRTC and coqc all pass, and the kernel calls the CUDA functions."""
    doc = _spec("Y[i, j] = tanh(sum(k | k > j && i >= k - 3: X[k, j]) / M) + S[i] * (j - i) "
                "+ erf(sqrt(rsqrt(N + 1)))",
                {"N": "dynamic", "M": 40}, {"X": {"shape": ["N", "M"], "dtype": "f32"}, "S": {"shape": ["N"], "dtype": "f32"}},
                TILED, check_sizes={"N": 37})
    with tempfile.TemporaryDirectory() as tmp:
        rc, err, out = _build(doc, Path(tmp), "--verify")
        assert rc == 0, err
        cu = (out / "kernel.cu").read_text()
        for fn in ("tanhf(", "erff(", "sqrtf(", "rsqrtf("):
            assert fn in cu, fn
        kir = (out / "kir.txt").read_text()
        assert "idx(-ii - 16*io + j)" in kir
        coq = "\n".join(p.read_text() for p in sorted((out / "proofs").glob("*.v")))
        assert "(f_ofnat : nat -> R)" in coq and "(f_tanh : R -> R)" in coq
        assert "sub (f_ofnat i_j) (f_ofnat (i_ii + 16 * i_io))" in coq  # j - i without nat truncation
        lean = "\n".join(p.read_text() for p in sorted((out / "proofs").glob("*.lean")))
        assert "(f_tanh : R → R)" in lean


def test_kernel_ir_validation_catches_a_wrong_index_value(monkeypatch):
    """A lowering that loses the sign of an index value is caught by the kernel-IR check."""
    import codegen.kir.lower as lower_mod
    from compiler.ir import Aff

    real = lower_mod._Lowering.expr

    def flipped(self, e, inside_dims=False):
        if isinstance(e, IndexValue):
            return [], IndexValue(e.aff.scale(-1) + Aff.lit(0))
        return real(self, e, inside_dims)

    monkeypatch.setattr(lower_mod._Lowering, "expr", flipped)
    doc = _spec("Y[i, j] = X[i, j] * (j - i)", {"N": "dynamic", "M": 8}, {"X": {"shape": ["N", "M"], "dtype": "f32"}},
                [{"rule": "parallel", "def": "Y", "index": "i", "to": "grid.x"}], check_sizes={"N": 9})
    with tempfile.TemporaryDirectory() as tmp:
        rc, err, _ = _build(doc, Path(tmp), "--no-proofs")
    assert rc == 3 and "lowering" in err.lower(), err


@pytest.mark.parametrize("statement,fragments", [
    ("Y[i] = where(i != 2, X[i], 0)", ["statements[0]", "cannot parse"]),
    ("Y[i] = where(i =< 2, X[i], 0)", ["statements[0]", "cannot parse"]),
    ("Y[i] = sin(X[i])", ["unknown function 'sin'", "tanh(e)", "erf(e)", "log(e)", "gt(a, b)"]),
    ("Y[i] = X[i] * Nn", ["unknown name 'Nn'", "did you mean 'N'"]),
    ("Y[i] = X[i] * k", ["unknown name 'k'"]),
])
def test_bad_new_syntax_is_one_clear_error(statement, fragments):
    doc = _spec(statement, {"N": 4}, {"X": {"shape": ["N"], "dtype": "f32"}})
    assert_fails(yaml.safe_dump(doc, sort_keys=False), 2, *fragments)
