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


# --------------------------------------------------------------------------- fast paths
#
# Sums of products are contracted by matrix products, reads are strided views padded with NaN,
# softmax is computed once per score row.  Each is compared with the plain definition on
# generated programs and inputs, including NaN, ±inf and zeros (whose IEEE classes the
# contraction must reproduce: NaN·0, inf·0, inf + -inf).

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import compiler.interp_matmul as interp_matmul  # noqa: E402

SPECIAL = [0.0, -0.0, 1.0, -2.5, np.nan, np.inf, -np.inf]
i_, j_, k_ = Aff.of("i"), Aff.of("j"), Aff.of("k")
# guards over (i, k) (A's axes), (k, j) (B's), (i, j) (neither operand's) and k alone
GUARDS = [
    Cond(k_, "<=", i_), Cond(k_ + 1, "<", j_), Cond(i_, "<", j_ + 2), Cond(k_, "<", Aff.lit(3)),
    Cond(i_ + k_, "<", Aff.of("K")),
]


def _contraction(guards, third: bool, ragged: bool) -> Program:
    body = Bin("*", Read("A", (i_, k_)), Read("B", (k_, j_)))
    if third:  # a factor over (i, j) too: three operands to group
        body = Bin("*", body, Read("A", (i_, j_ - j_ + Aff.lit(0))))
    if guards:
        body = Select(tuple(guards), body, Const(0.0))
    ext = Ext(((Aff.of("K"), 1), (i_ + 2, 1))) if ragged else Ext.of("K")  # k < min(K, i + 2)
    t = TensorType((Aff.of("M"), Aff.of("N")), "f32")
    return Program(
        sizes=(("M", None), ("N", None), ("K", None)),
        inputs=(("A", TensorType((Aff.of("M"), Aff.of("K")), "f32")),
                ("B", TensorType((Aff.of("K"), Aff.of("N")), "f32"))),
        defs=(Def("C", t, (Loop("i", Ext.of("M")), Loop("j", Ext.of("N"))), (i_, j_),
                  Reduce("sum", "k", ext, body)),),
        output="C",
    )


def _same_values(fast: np.ndarray, plain: np.ndarray) -> None:
    assert np.array_equal(np.isnan(fast), np.isnan(plain))
    assert np.array_equal(np.isposinf(fast), np.isposinf(plain))
    assert np.array_equal(np.isneginf(fast), np.isneginf(plain))
    fin = np.isfinite(plain)
    np.testing.assert_allclose(fast[fin], plain[fin], rtol=1e-12, atol=1e-12)


@st.composite
def _operand(draw, shape):
    values = draw(st.lists(st.one_of(st.sampled_from(SPECIAL), st.floats(-3, 3)),
                           min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    return np.array(values, dtype=np.float64).reshape(shape)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_contraction_matches_the_elementwise_sum(data):
    m, n, k = (data.draw(st.integers(1, 5)) for _ in range(3))
    guards = data.draw(st.lists(st.sampled_from(GUARDS), max_size=3, unique=True))
    p = _contraction(guards, data.draw(st.booleans()), data.draw(st.booleans()))
    special = data.draw(st.booleans())
    if special:
        a, b = data.draw(_operand((m, k))), data.draw(_operand((k, n)))
    else:
        a, b = RNG.standard_normal((m, k)), RNG.standard_normal((k, n))
    sizes = {"M": m, "N": n, "K": k}
    fast = run_program(p, sizes, {"A": a, "B": b})["C"]
    plain = run_program(p, sizes, {"A": a, "B": b}, contract=False)["C"]
    _same_values(fast, plain)


def test_contraction_nan_and_inf_classes():
    """One case per IEEE rule: NaN·x, inf·0 → NaN; inf·x → ±inf; inf + -inf → NaN; guarded → 0."""
    p = _contraction([Cond(k_, "<=", i_)], third=False, ragged=False)
    a = np.array([[np.inf, 1.0], [np.inf, -np.inf], [np.nan, 5.0], [1.0, np.inf]])
    b = np.array([[2.0, 0.0, -1.0], [1.0, 1.0, 1.0]])
    out = run_program(p, {"M": 4, "N": 3, "K": 2}, {"A": a, "B": b})["C"]
    # row 0: k <= 0 only: inf·2 = inf, inf·0 = NaN, inf·-1 = -inf (A[0, 1] = 1 is guarded off)
    assert out[0, 0] == np.inf and np.isnan(out[0, 1]) and out[0, 2] == -np.inf
    # row 1: inf·2 + -inf·1 = NaN; inf·0 = NaN; inf·-1 + -inf·1 = -inf
    assert np.isnan(out[1, 0]) and np.isnan(out[1, 1]) and out[1, 2] == -np.inf
    assert np.all(np.isnan(out[2]))
    # row 3: the guard keeps k = 1: 1·2 + inf·1 = inf …; column 1: 1·0 + inf·1 = inf
    assert out[3, 0] == np.inf and out[3, 1] == np.inf and out[3, 2] == np.inf
    _same_values(out, run_program(p, {"M": 4, "N": 3, "K": 2}, {"A": a, "B": b}, contract=False)["C"])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 40), st.integers(1, 40), st.integers(1, 40), st.integers(2, 300))
def test_blocked_matmul_matches_einsum(batch, m, k, n, limit):
    """Products split into blocks small enough for BLAS to run them on the calling thread."""
    a, b = RNG.standard_normal((batch, m, k)), RNG.standard_normal((batch, k, n))
    saved = interp_matmul._SERIAL_GEMM
    interp_matmul._SERIAL_GEMM = limit
    try:
        got = interp_matmul._batched_matmul(a, b)
    finally:
        interp_matmul._SERIAL_GEMM = saved
    np.testing.assert_allclose(got, np.einsum("bik,bkj->bij", a, b), rtol=1e-12, atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 4), st.integers(1, 5), st.integers(-3, 3), st.integers(-3, 3), st.integers(-6, 6),
    st.integers(-2, 2), st.integers(-3, 3), st.booleans(),
)
def test_strided_reads_match_elementwise_indexing(m, n, ci, cj, c0, bj, b0, local):
    """out[i, j] = A[ci·i + cj·j + c0, j] (NaN outside A), or the same through a Let row
    buffer T[kk] = A[ci·i + c0, kk] read at T[bj·j + b0]."""
    rows = 6
    a = RNG.standard_normal((rows, n))
    if local:
        row = Aff.build({"i": ci}, c0)
        body = Let(Binding("T", (("kk", Ext.of("N")),), Read("A", (row, Aff.of("kk")))),
                   Read("T", (Aff.build({"j": bj}, b0),)))
    else:
        body = Read("A", (Aff.build({"i": ci, "j": cj}, c0), j_))
    p = Program(
        sizes=(("M", None), ("N", None), ("R", None)),
        inputs=(("A", TensorType((Aff.of("R"), Aff.of("N")), "f32")),),
        defs=(Def("out", TensorType((Aff.of("M"), Aff.of("N")), "f32"),
                  (Loop("i", Ext.of("M")), Loop("j", Ext.of("N"))), (i_, j_), body),),
        output="out",
    )
    out = run_program(p, {"M": m, "N": n, "R": rows}, {"A": a})["out"]

    def at(r: int, c: int) -> float:
        return a[r, c] if 0 <= r < rows and 0 <= c < n else np.nan

    for i in range(m):
        for j in range(n):
            want = at(ci * i + c0, bj * j + b0) if local else at(ci * i + cj * j + c0, j)
            assert (np.isnan(want) and np.isnan(out[i, j])) or out[i, j] == want


def test_read_far_outside_falls_back_to_gathering():
    """An index whose range dwarfs the tensor is gathered, not padded; still NaN outside."""
    body = Read("A", (Aff.build({"i": 100000}), j_))
    loops = (Loop("i", Ext.of("M")), Loop("j", Ext.of("N")))
    p = _vec_program("out", body, loops, (i_, j_), (Aff.of("M"), Aff.of("N")))
    a = RNG.standard_normal((3, 4))
    out = run_program(p, {"M": 3, "N": 4}, {"A": a})["out"]
    assert np.array_equal(out[0], a[0]) and np.all(np.isnan(out[1:]))


def test_softmax_read_at_an_index_the_score_does_not_use():
    """P[i, j, c] = softmax(j_ | j_ <= i: S[i, j_])@[j + c − 1]: the distribution is per i,
    the read position varies over (j, c) and leaves the range (NaN)."""
    from compiler.ir import Softmax

    jj = Aff.of("jj")
    body = Softmax("jj", Ext.of("N"), Read("S", (i_, jj)), j_ + Aff.of("c") - 1, (Cond(jj, "<=", i_),))
    loops = (Loop("i", Ext.of("N")), Loop("j", Ext.of("N")), Loop("c", Ext.of(2)))
    p = Program(
        sizes=(("N", None),),
        inputs=(("S", TensorType((Aff.of("N"), Aff.of("N")), "f32")),),
        defs=(Def("P", TensorType((Aff.of("N"), Aff.of("N"), Aff.lit(2)), "f32"), loops,
                  (i_, j_, Aff.of("c")), body),),
        output="P",
    )
    n = 5
    s = RNG.standard_normal((n, n))
    out = run_program(p, {"N": n}, {"S": s})["P"]
    ref = softmax(np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf))
    for c in range(2):
        for j in range(n):
            pos = j + c - 1
            if 0 <= pos < n:
                np.testing.assert_allclose(out[:, j, c], ref[:, pos], rtol=1e-14, atol=0)
            else:
                assert np.all(np.isnan(out[:, j, c]))
