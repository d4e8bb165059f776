"""The reference interpreter against numpy references (einsum, softmax)."""
from __future__ import annotations

import numpy as np
import pytest

from compiler.interp import InterpError, random_inputs, rel_error, run_def, run_program
from compiler.ir import (
    Aff,
    Bin,
    Binding,
    Cond,
    Const,
    Def,
    Ext,
    Fold,
    Let,
    Loop,
    Program,
    Read,
    Reduce,
    Select,
    TensorType,
    Un,
)
from compiler.lower_spec import lower_spec
from compiler.spec import parse_spec_text

RNG = np.random.default_rng(1234)


def program_of(text: str) -> Program:
    return lower_spec(parse_spec_text(text))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    w = np.exp(x - m)
    return w / w.sum(axis=axis, keepdims=True)


GEMM = """
name: gemm
sizes: {M: dynamic, N: dynamic, K: dynamic}
inputs: {A: {shape: [M, K], dtype: f16}, B: {shape: [K, N], dtype: f16}}
statements: ["C[i, j] = sum(k: A[i, k] * B[k, j])"]
output: {tensor: C}
"""

MASKED_SOFTMAX = """
name: causal_softmax
sizes: {N: dynamic}
inputs: {S: {shape: [N, N], dtype: f32}}
statements: ["P[i, j] = softmax(j | j <= i: S[i, j])"]
output: {tensor: P}
"""

ATTENTION = """
name: attention
sizes: {B: dynamic, N: dynamic, D: 8}
inputs:
  Q: {shape: [B, N, D], dtype: f16}
  K: {shape: [B, N, D], dtype: f16}
  V: {shape: [B, N, D], dtype: f16}
params: {scale: 1/sqrt(D)}
statements:
  - "S[b, i, j] = scale * sum(e: Q[b, i, e] * K[b, j, e])"
  - "P[b, i, j] = softmax(j | j <= i: S[b, i, j])"
  - "O[b, i, d] = sum(j: P[b, i, j] * V[b, j, d])"
output: {tensor: O}
"""


def test_gemm_matches_einsum():
    p = program_of(GEMM)
    sizes = {"M": 7, "N": 5, "K": 11}
    ins = random_inputs(p, sizes, RNG)
    out = run_program(p, sizes, ins)["C"]
    ref = np.einsum("ik,kj->ij", ins["A"], ins["B"])
    assert out.shape == (7, 5)
    assert rel_error(out, ref) < 1e-14


def test_masked_softmax_matches_numpy():
    p = program_of(MASKED_SOFTMAX)
    n = 6
    s = RNG.standard_normal((n, n))
    out = run_program(p, {"N": n}, {"S": s})["P"]
    masked = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    ref = softmax(masked)
    assert rel_error(out, ref) < 1e-14
    assert np.all(out[np.triu_indices(n, 1)] == 0.0)
    assert np.allclose(out.sum(axis=1), 1.0)


def test_causal_attention_matches_numpy():
    p = program_of(ATTENTION)
    sizes = {"B": 2, "N": 5, "D": 8}
    ins = random_inputs(p, sizes, RNG)
    out = run_program(p, sizes, ins)["O"]
    q, k, v = ins["Q"], ins["K"], ins["V"]
    s = np.einsum("bie,bje->bij", q, k) / np.sqrt(8)
    causal = np.tril(np.ones((5, 5), dtype=bool))
    ref = np.einsum("bij,bjd->bid", softmax(np.where(causal, s, -np.inf)), v)
    assert rel_error(out, ref) < 1e-13


def _vec_program(name: str, body, loops, store, out_dims, guard=()) -> Program:
    t = TensorType(out_dims, "f32")
    return Program(
        sizes=(("M", None), ("N", None)),
        inputs=(("A", TensorType((Aff.of("M"), Aff.of("N")), "f32")),),
        defs=(Def(name, t, loops, store, body, guard),),
        output=name,
    )


def test_fold_online_logsumexp():
    """out[i] = Σ_t exp(A[i, t]) computed by an online (max, scaled sum) fold."""
    i, t = Aff.of("i"), Aff.of("t")
    x = Read("x", ())
    m, l = Read("m", ()), Read("l", ())
    m_new = Bin("max", m, x)
    fold = Fold(
        var="t",
        ext=Ext.of("N"),
        state=("m", "l"),
        init=(Const(float("-inf")), Const(0.0)),
        binds=(Binding("x", (), Read("A", (i, t))),),
        update=(m_new, Bin("+", Bin("*", l, Un("exp", Bin("-", m, m_new))), Un("exp", Bin("-", x, m_new)))),
        result=Bin("*", l, Un("exp", m)),
    )
    p = _vec_program("out", fold, (Loop("i", Ext.of("M")),), (i,), (Aff.of("M"),))
    a = RNG.standard_normal((4, 9))
    out = run_program(p, {"M": 4, "N": 9}, {"A": a})["out"]
    assert rel_error(out, np.exp(a).sum(axis=1)) < 1e-14


def test_let_bound_tile_with_partial_last_tile():
    """Row sums over a tiled loop io < ceil(M/4), ii < 4 with a guard and a Let row buffer."""
    row = Aff.build({"io": 4, "ii": 1})
    body = Let(
        Binding("T", (("kk", Ext.of("N")),), Read("A", (row, Aff.of("kk"))), level="shared", source="A"),
        Reduce("sum", "k", Ext.of("N"), Read("T", (Aff.of("k"),))),
    )
    loops = (Loop("io", Ext.of("M", 4)), Loop("ii", Ext.of(4)))
    p = _vec_program("out", body, loops, (row,), (Aff.of("M"),), guard=(Cond(row, "<", Aff.of("M")),))
    a = RNG.standard_normal((7, 5))  # M = 7: the second tile is partial
    out = run_program(p, {"M": 7, "N": 5}, {"A": a})["out"]
    assert rel_error(out, a.sum(axis=1)) < 1e-14


def test_guarded_reduction_tile():
    """sum over ko < ceil(N/4), ki < 4 with [4ko + ki < N] ? A : 0 equals the plain sum."""
    k = Aff.build({"ko": 4, "ki": 1})
    body = Reduce(
        "sum", "ko", Ext.of("N", 4),
        Reduce("sum", "ki", Ext.of(4), Select((Cond(k, "<", Aff.of("N")),), Read("A", (Aff.of("i"), k)), Const(0.0))),
    )
    p = _vec_program("out", body, (Loop("i", Ext.of("M")),), (Aff.of("i"),), (Aff.of("M"),))
    a = RNG.standard_normal((3, 10))
    out = run_program(p, {"M": 3, "N": 10}, {"A": a})["out"]
    assert rel_error(out, a.sum(axis=1)) < 1e-14


def test_out_of_bounds_read_gives_nan():
    body = Read("A", (Aff.of("i"), Aff.of("j") + 1))
    loops = (Loop("i", Ext.of("M")), Loop("j", Ext.of("N")))
    p = _vec_program("out", body, loops, (Aff.of("i"), Aff.of("j")), (Aff.of("M"), Aff.of("N")))
    a = RNG.standard_normal((3, 4))
    out = run_program(p, {"M": 3, "N": 4}, {"A": a})["out"]
    assert np.all(np.isnan(out[:, -1]))
    assert np.array_equal(out[:, :-1], a[:, 1:])
    assert rel_error(out, a) == float("inf")


def test_out_of_bounds_read_discarded_by_guard():
    j1 = Aff.of("j") + 1
    body = Select((Cond(j1, "<", Aff.of("N")),), Read("A", (Aff.of("i"), j1)), Const(0.0))
    loops = (Loop("i", Ext.of("M")), Loop("j", Ext.of("N")))
    p = _vec_program("out", body, loops, (Aff.of("i"), Aff.of("j")), (Aff.of("M"), Aff.of("N")))
    a = RNG.standard_normal((3, 4))
    out = run_program(p, {"M": 3, "N": 4}, {"A": a})["out"]
    assert np.all(out[:, -1] == 0.0) and np.array_equal(out[:, :-1], a[:, 1:])


def test_def_writing_an_element_twice_raises():
    # every iteration stores to element 0
    d = Def(
        "out", TensorType((Aff.of("M"),), "f32"), (Loop("i", Ext.of("M")),), (Aff.lit(0),),
        Read("A", (Aff.of("i"), Aff.lit(0))),
    )
    with pytest.raises(InterpError, match="times"):
        run_def(d, {"M": 3, "N": 2}, {"A": RNG.standard_normal((3, 2))})


def test_def_missing_an_element_raises():
    d = Def(
        "out", TensorType((Aff.of("M"),), "f32"), (Loop("i", Ext.of("M")),), (Aff.of("i"),),
        Read("A", (Aff.of("i"), Aff.lit(0))), guard=(Cond(Aff.of("i"), "<", Aff.lit(2)),),
    )
    with pytest.raises(InterpError, match="0 times"):
        run_def(d, {"M": 3, "N": 2}, {"A": RNG.standard_normal((3, 2))})


def test_store_out_of_range_raises():
    d = Def(
        "out", TensorType((Aff.of("M"),), "f32"), (Loop("i", Ext.of("M")),), (Aff.of("i") + 1,),
        Read("A", (Aff.of("i"), Aff.lit(0))),
    )
    with pytest.raises(InterpError, match="outside"):
        run_def(d, {"M": 3, "N": 2}, {"A": RNG.standard_normal((3, 2))})


def test_rel_error():
    x = np.array([1.0, 2.0])
    assert rel_error(x, x) == 0.0
    assert rel_error(np.array([1.0, np.nan]), x) == float("inf")
    assert rel_error(np.ones(3), x) == float("inf")
