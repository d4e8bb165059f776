"""Negative tests: every rule precondition refuses what it must, with a reason.

Each test builds a small program, asks `rule.check` (through `rulekit.check_fails`) and asserts a
`DerivationError` whose message contains a fragment naming the failed precondition.  Tests
marked xfail(strict=True) document bugs in the rules (see each reason); they fail until the
rule is fixed, then the mark must be removed.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from rulekit import (
    Aff, DerivationError, RULES, apply, apply_steps, attention, check_fails, fa_steps, gemm,
    numeric_error, program_of, spec_text,
)


def refused(prog, rule, *fragments, **params):
    exc = check_fails(prog, rule, **params)
    assert isinstance(exc, DerivationError)
    assert exc.rule == rule
    msg = str(exc)
    for frag in fragments:
        assert frag.lower() in msg.lower(), f"{frag!r} not in {msg!r}"
    return msg


def D(name):  # the `def` parameter is a Python keyword
    return {"def": name}


@pytest.fixture(scope="module")
def fa():
    """FlashAttention after ONLINE-AGG (the fold over jo carries (m, l, acc))."""
    return apply_steps(attention(causal=True), fa_steps(4))


# --------------------------------------------------------------------------- TILE


def test_tile_guard_false_on_dynamic_extent():
    refused(gemm(), "tile", "needs a guard", "dynamic", "guard: false", **D("C"), index="i", size=4, guard=False)


def test_tile_guard_false_on_fixed_extent_not_divided():
    p = gemm({"M": 10, "N": 8, "K": 8})
    refused(p, "tile", "does not divide", "10", **D("C"), index="i", size=4, guard=False)


def test_tile_guard_false_on_divided_fixed_extent_is_fine():
    p = gemm({"M": 12, "N": 8, "K": 8})
    new = apply(p, "tile", **D("C"), index="i", size=4, guard=False)
    assert not new.def_named("C").guard


def test_tile_size_larger_than_fixed_extent():
    refused(gemm({"M": 4, "N": 8, "K": 8}), "tile", "exceeds", **D("C"), index="i", size=5)


def test_tile_of_fold_index(fa):
    refused(fa, "tile", "a fold", **D("O"), index="jo", size=2)


def test_tile_of_unbound_index():
    refused(gemm(), "tile", "not bound", **D("C"), index="zz", size=2)


def test_tile_of_mapped_loop():
    p = apply(gemm(), "parallel", **D("C"), index="i", to="grid.x")
    refused(p, "tile", "already mapped", **D("C"), index="i", size=2)


def test_tile_name_clash():
    refused(gemm(), "tile", "already used", **D("C"), index="i", size=2, outer="j")


# --------------------------------------------------------------------------- REORDER


def test_reorder_non_adjacent_loops():
    p = program_of(spec_text(["C[b, i, j] = sum(k: A[b, i, k] * B[b, k, j])"],
                             {"A": (["Bt", "M", "K"], "f32"), "B": (["Bt", "K", "N"], "f32")},
                             {"Bt": 2, "M": "dynamic", "N": "dynamic", "K": "dynamic"}, "C"))
    refused(p, "reorder", "not adjacent", **D("C"), outer="b", inner="j")


def test_reorder_loop_with_reduction():
    refused(gemm(), "reorder", "cannot be exchanged with a reduction", **D("C"), outer="j", inner="k")


@pytest.mark.parametrize("inner", ["ji", "c", "d"])
def test_reorder_across_fold(fa, inner):
    """After ONLINE-AGG the key tiles are a fold: nothing may move across it."""
    if inner == "d":  # d is a loop: a loop and a fold index
        refused(fa, "reorder", "cannot be exchanged", **D("O"), outer="d", inner="jo")
    else:
        # (the message says "a fold carrying state (m, l, acc) in order")
        refused(fa, "reorder", "carrying state", "in order", **D("O"), outer="jo", inner=inner)


def test_reorder_sum_with_max():
    p = program_of(spec_text(["Y[i] = sum(j: max(k: X[i, j, k]))"], {"X": (["M", "N", "K"], "f32")},
                             {"M": 3, "N": 4, "K": 5}, "Y"))
    refused(p, "reorder", "cannot exchange a sum", "max", **D("Y"), outer="j", inner="k")


def test_reorder_triangular_reductions():
    p = program_of(spec_text(["Y[i] = sum(j: X[i, j])"], {"X": (["M", "N"], "f32")},
                             {"M": "dynamic", "N": "dynamic"}, "Y"))
    p = apply(p, "tile", **D("Y"), index="j", size=4)
    p = apply(p, "skip_masked", **D("Y"), index="ji")  # ji < min(4, N - 4*jo)
    refused(p, "reorder", "depends on jo", **D("Y"), outer="jo", inner="ji")


def test_reorder_moves_mapped_loop_inside_unmapped():
    p = apply(gemm(), "parallel", **D("C"), index="i", to="grid.x")
    refused(p, "reorder", "cannot move inside", **D("C"), outer="i", inner="j")


def test_reorder_keeps_grid_loops_outside_warp_loops():
    p = apply(gemm(), "parallel", **D("C"), index="i", to="grid.x")
    p = apply(p, "parallel", **D("C"), index="j", to="warp")
    refused(p, "reorder", "grid", **D("C"), outer="i", inner="j")


# --------------------------------------------------------------------------- SPLIT


def test_split_of_dynamic_extent():
    refused(gemm(), "split", "dynamic", **D("C"), index="k", at=2)


def test_split_point_outside_extent():
    refused(gemm({"M": 4, "N": 4, "K": 6}), "split", "strictly inside", **D("C"), index="k", at=6)


def test_split_of_loop_index():
    refused(gemm({"M": 4, "N": 4, "K": 6}), "split", "not a sum/max reduction", **D("C"), index="i", at=2)


def test_split_keeps_binder_names_unique():
    from compiler.rules.base import binder_names

    p = gemm({"M": 4, "N": 4, "K": 8})
    p = apply(p, "tile", **D("C"), index="k", size=2)
    p = apply(p, "split", **D("C"), index="ko", at=1)
    names = binder_names(p.def_named("C"))
    assert len(names) == len(set(names)), names


# --------------------------------------------------------------------------- FUSE / UNFUSE


def test_fuse_keeps_binder_names_unique():
    from compiler.rules.base import binder_names

    p0 = program_of(spec_text(
        ["S[i, j] = scale * sum(e: Q[i, e] * K[j, e])", "P[i, j] = softmax(j | j <= i: S[i, j])",
         "O[i, d] = sum(j: P[i, j] * V[j, d])", "R[i, d] = O[i, d] * O[i, 0]"],
        {x: (["N", "D"], "f16") for x in "QKV"}, {"N": "dynamic", "D": 4}, "R", params={"scale": 0.5}))
    p = apply(apply_steps(p0, fa_steps(3)), "fuse", producer="O")
    names = binder_names(p.def_named("R"))
    assert len(names) == len(set(names)), names


def test_fuse_of_output():
    refused(attention(), "fuse", "output", producer="O")


def test_fuse_of_tiled_producer_into_untiled_consumer():
    p = apply(attention(), "tile", **D("S"), index="i", size=4)
    refused(p, "fuse", "mismatched tilings", producer="S")


def test_fuse_into_non_reader():
    refused(attention(), "fuse", "does not read", producer="S", **D("O"))


def test_unfuse_inside_a_softmax():
    p = program_of(spec_text(["Y[i, j] = softmax(j: sum(k: X[i, j, k]))"], {"X": (["M", "N", "K"], "f32")},
                             {"M": 3, "N": 4, "K": 5}, "Y"))
    refused(p, "unfuse", "inside a softmax", **D("Y"), index="k", name="U")


def test_unfuse_inside_a_reduction_of_a_tiled_extent():
    p = apply(program_of(spec_text(["Y[i] = sum(j: max(k: X[i, j, k]))"], {"X": (["M", "N", "K"], "f32")},
                                   {"M": 3, "N": "dynamic", "K": 5}, "Y")), "tile", **D("Y"), index="j", size=2)
    refused(p, "unfuse", "not a plain size expression", **D("Y"), index="k", name="U")


def test_unfuse_inside_reductions_is_a_partial_per_enclosing_index():
    """The strided partial column sums of the norm backwards: tile, reorder, unfuse."""
    spec = program_of(spec_text(["Y[c] = sum(r: X[r, c] * X[r, c])"], {"X": (["R", "C"], "f32")},
                                {"R": "dynamic", "C": 6}, "Y"))
    p = apply_steps(spec, [{"rule": "tile", "def": "Y", "index": "r", "size": 4, "outer": "ro", "inner": "ri"},
                           {"rule": "reorder", "def": "Y", "outer": "ro", "inner": "ri"},
                           {"rule": "unfuse", "def": "Y", "index": "ro", "name": "P"}])
    part = p.def_named("P")
    assert [lp.var for lp in part.loops] == ["ri", "c"] and [str(d) for d in part.type.dims] == ["4", "C"]
    for r in (1, 4, 9):  # a partial tile, a whole one, partials of unequal length
        assert numeric_error(spec, p, {"R": r}) < 1e-12


def test_unfuse_using_tiled_loop():
    p = apply(program_of(spec_text(["Y[i] = sum(j: X[i, j])"], {"X": (["M", "N"], "f32")},
                                   {"M": "dynamic", "N": "dynamic"}, "Y")), "tile", **D("Y"), index="i", size=2)
    refused(p, "unfuse", "tiled or mapped", **D("Y"), index="j", name="U")


# --------------------------------------------------------------------------- ONLINE-AGG


def test_online_agg_on_plain_sum():
    p = apply(gemm(), "tile", **D("C"), index="k", size=4)
    refused(p, "online_agg", "not softmax-shaped", **D("C"), index="ko")


def test_online_agg_with_differently_tiled_denominator():
    steps = fa_steps(4)
    steps[4] = dict(steps[4], size=2)  # L tiled by 2, O by 4
    p = apply_steps(attention(), steps[:5])
    refused(p, "online_agg", "mismatched tilings", **D("O"), index="jo")


def test_online_agg_with_untiled_denominator():
    p = apply_steps(attention(), fa_steps(4)[:4])
    refused(p, "online_agg", "mismatched tilings", **D("O"), index="jo")


def test_online_agg_refuses_shift_depending_on_summed_index():
    p0 = program_of(spec_text(
        ["L[i] = sum(j: exp(S[i, j] - W[j]))", "O[i, d] = sum(j: exp(S[i, j] - W[j]) * V[j, d]) / L[i]"],
        {"S": (["N", "N"], "f32"), "W": (["N"], "f32"), "V": (["N", "D"], "f32")},
        {"N": "dynamic", "D": 3}, "O"))
    p = apply_steps(p0, [
        {"rule": "tile", "def": "O", "index": "j", "size": 2},
        {"rule": "tile", "def": "L", "index": "j", "size": 2, "outer": "jo_l", "inner": "ji_l"},
    ])
    try:
        new = apply(p, "online_agg", **D("O"), index="jo")
    except DerivationError:
        return
    err = numeric_error(p0, new, {"N": 5}, 0)
    pytest.fail(f"online_agg accepted an index-dependent shift; relative error {err:.3g}")


# --------------------------------------------------------------------------- SPLIT-SOFTMAX


def test_split_softmax_without_softmax():
    refused(gemm(), "split_softmax", "0 softmax", **D("C"))


def test_split_softmax_with_tiled_row_loop():
    p = apply(attention(), "tile", **D("P"), index="i", size=2)
    refused(p, "split_softmax", "tiled or mapped", **D("P"))


def test_split_softmax_name_clash():
    refused(attention(), "split_softmax", "already a tensor", **D("P"), max_name="S")


# --------------------------------------------------------------------------- CACHE


def _rowsum(n="dynamic"):
    return program_of(spec_text(["Y[i] = sum(j: X[i, j])"], {"X": (["M", "N"], "f32")},
                                {"M": "dynamic", "N": n}, "Y"))


def test_cache_with_reuse_one():
    refused(_rowsum(6), "cache", "reuse 1", **D("Y"), tensor="X", over=["j"])


def test_cache_with_unbound_index():
    p = apply(gemm(), "tile", **D("C"), index="k", size=4)
    refused(p, "cache", "not bound", **D("C"), tensor="A", at="ko", over=["zz", "ki"])


def test_cache_over_dynamic_extent():
    refused(gemm(), "cache", "dynamic extent", **D("C"), tensor="A", over=["k"])


def test_cache_of_tensor_also_read_outside_scope():
    p = program_of(spec_text(["Y[i] = sum(j: X[i, j]) * X[i, 0]"], {"X": (["M", "N"], "f32")},
                             {"M": "dynamic", "N": 6}, "Y"))
    refused(p, "cache", "also read outside the scope", **D("Y"), tensor="X", at="j", over=["j"])


def test_cache_unknown_tensor():
    refused(gemm(), "cache", "unknown tensor", **D("C"), tensor="Z", over=["k"])


def test_cache_accumulator_of_non_sum():
    p = program_of(spec_text(["Y[i] = max(j: X[i, j])"], {"X": (["M", "N"], "f32")},
                             {"M": "dynamic", "N": "dynamic"}, "Y"))
    refused(p, "cache", "not a sum", **D("Y"), accumulator="j", level="register")


def test_cache_accumulator_in_shared_memory():
    refused(gemm(), "cache", "registers", **D("C"), accumulator="k", level="shared")


def test_cache_params_need_one_kind():
    with pytest.raises(DerivationError, match="either tensor"):
        RULES["cache"].parse_params({"def": "C"})


def test_cache_read_inside_softmax_is_refused_cleanly():
    p = program_of(spec_text(
        ["S[i, j] = scale * sum(e: Q[i, e] * K[j, e])", "P[i, j] = softmax(j | j <= i: S[i, j])"],
        {x: (["N", "D"], "f16") for x in "QK"}, {"N": "dynamic", "D": 4}, "P", params={"scale": 0.5}))
    p = apply(p, "fuse", producer="S")
    try:
        apply(p, "cache", **D("P"), tensor="Q", at="e", over=["e"])
    except DerivationError:
        pass


def test_cache_accumulator_twice_is_refused():
    p = apply(gemm({"M": 16, "N": 8, "K": 32}), "map_mma", **D("C"), index="k")
    refused(p, "cache", "accumulator", **D("C"), accumulator="k", level="register", dtype="f16")


# --------------------------------------------------------------------------- PARALLEL


def test_parallel_of_reduction_index():
    refused(gemm(), "parallel", "carries a dependence", **D("C"), index="k", to="thread")


def test_parallel_of_fold_index(fa):
    refused(fa, "parallel", "carries a dependence", **D("O"), index="jo", to="grid.x")


def test_parallel_of_non_injective_store():
    p = gemm()
    c = p.def_named("C")
    # C[i + j, 0]-style store: i and j land in the same position with overlapping strides
    bad = replace(c, store=(Aff.build({"i": 1, "j": 1}), Aff.lit(0)))
    p = p.with_def(bad)
    refused(p, "parallel", "not provably disjoint", **D("C"), index="i", to="grid.x")


def test_parallel_of_loop_missing_from_store():
    p = gemm()
    c = p.def_named("C")
    p = p.with_def(replace(c, store=(Aff.of("i"), Aff.lit(0))))
    refused(p, "parallel", "overwrite each other", **D("C"), index="i", to="grid.x")


def test_parallel_second_loop_on_a_grid_axis_keeps_the_other_checks():
    # a grid axis may carry several loops (row-major); the mapping itself is still checked
    p = apply(gemm(), "parallel", **D("C"), index="i", to="grid.x")
    refused(p, "parallel", "already mapped", **D("C"), index="i", to="grid.x")
    refused(p, "parallel", "count applies", **D("C"), index="j", to="grid.x", count=2)


def test_parallel_grid_inside_warp():
    p = apply(gemm(), "parallel", **D("C"), index="i", to="warp")
    refused(p, "parallel", "reorder first", **D("C"), index="j", to="grid.x")


def test_parallel_count_not_dividing():
    p = gemm({"M": 6, "N": 4, "K": 4})
    refused(p, "parallel", "evenly", **D("C"), index="i", to="warp", count=4)


# --------------------------------------------------------------------------- MAP-MMA


def test_map_mma_on_f32_operands():
    p = gemm({"M": 16, "N": 8, "K": 16}, dtype="f32")
    refused(p, "map_mma", "f16 or bf16", **D("C"), index="k")


def test_map_mma_k_not_multiple_of_16():
    refused(gemm({"M": 16, "N": 8, "K": 24}), "map_mma", "multiple of 16", **D("C"), index="k")


def test_map_mma_dynamic_k():
    refused(gemm(), "map_mma", "multiple of 16", **D("C"), index="k")


def test_map_mma_m_not_multiple():
    refused(gemm({"M": 12, "N": 8, "K": 16}), "map_mma", "not a multiple of 16", **D("C"), index="k")


def test_map_mma_twice():
    p = apply(gemm({"M": 16, "N": 8, "K": 16}), "map_mma", **D("C"), index="k")
    refused(p, "map_mma", "already mapped", **D("C"), index="k")


def test_reorder_and_split_refuse_mma_reduction():
    from compiler.ir import MmaFact

    p = apply(gemm({"M": 16, "N": 8, "K": 32}), "tile", **D("C"), index="k", size=16)
    # put the MmaFact on ki directly (MAP-MMA itself wants staged tiles, which would put a Let
    # between ko and ki and make the reorder fail for another reason)
    c = p.def_named("C")
    p = p.with_def(replace(c, body=replace(c.body, body=replace(c.body.body, mma=MmaFact("mma_sync", 16, 8, 16)))))
    refused(p, "reorder", "tensor cores", **D("C"), outer="ko", inner="ki")
    refused(p, "split", "tensor cores", **D("C"), index="ki", at=8)


def test_tile_refuses_mma_reduction():
    p = apply(gemm({"M": 16, "N": 8, "K": 32}), "map_mma", **D("C"), index="k")
    refused(p, "tile", "tensor cores", **D("C"), index="k", size=16)


# --------------------------------------------------------------------------- ASSOC


def test_assoc_with_nothing_to_factor():
    refused(gemm(), "assoc", "nothing to factor", **D("C"), index="k")


def test_assoc_of_max():
    p = program_of(spec_text(["Y[i] = max(j: X[i, j] * W[i])"], {"X": (["M", "N"], "f32"), "W": (["M"], "f32")},
                             {"M": "dynamic", "N": "dynamic"}, "Y"))
    refused(p, "assoc", "not a sum", **D("Y"), index="j")


# --------------------------------------------------------------------------- SKIP-MASKED


def test_skip_masked_without_mask():
    refused(gemm(), "skip_masked", "not guarded", **D("C"), index="k")


def test_skip_masked_with_divisible_tile_has_nothing_to_skip():
    p = apply(gemm({"M": 4, "N": 4, "K": 8}), "tile", **D("C"), index="k", size=4)
    refused(p, "skip_masked", "not guarded", **D("C"), index="ki")


def test_skip_masked_on_loop_index():
    refused(gemm(), "skip_masked", "not a reduction or fold", **D("C"), index="i")


@pytest.mark.parametrize("op,other", [("sum", "1"), ("max", "0")])
def test_skip_masked_needs_neutral_masked_branch(op, other):
    p0 = program_of(spec_text([f"Y[i] = {op}(j: where(j <= i, X[i, j], {other}))"], {"X": (["N", "N"], "f32")},
                              {"N": "dynamic"}, "Y"))
    try:
        new = apply(p0, "skip_masked", **D("Y"), index="j")
    except DerivationError:
        return
    err = numeric_error(p0, new, {"N": 6}, 0)
    pytest.fail(f"skip_masked accepted a non-neutral masked branch; relative error {err:.3g}")


# --------------------------------------------------------------------------- common


@pytest.mark.parametrize("rule,params", [
    ("tile", {"index": "i", "size": 2}),
    ("reorder", {"outer": "i", "inner": "j"}),
    ("split", {"index": "k", "at": 1}),
    ("unfuse", {"index": "k", "name": "U"}),
    ("assoc", {"index": "k"}),
    ("cache", {"tensor": "A", "over": ["k"]}),
    ("parallel", {"index": "i", "to": "grid.x"}),
    ("split_softmax", {}),
    ("online_agg", {"index": "k"}),
    ("skip_masked", {"index": "k"}),
    ("map_mma", {"index": "k"}),
])
def test_unknown_def_name(rule, params):
    refused(gemm(), rule, "no definition named 'Nope'", **D("Nope"), **params)


def test_fuse_unknown_producer():
    refused(gemm(), "fuse", "no definition named", producer="Nope")


VALID_PARAMS = {
    "tile": {"def": "C", "index": "i", "size": 2},
    "reorder": {"def": "C", "outer": "i", "inner": "j"},
    "split": {"def": "C", "index": "k", "at": 1},
    "fuse": {"producer": "S"},
    "unfuse": {"def": "C", "index": "k", "name": "U"},
    "cache": {"def": "C", "tensor": "A", "over": ["k"]},
    "parallel": {"def": "C", "index": "i", "to": "grid.x"},
    "assoc": {"def": "C", "index": "k"},
    "split_softmax": {"def": "P"},
    "online_agg": {"def": "O", "index": "jo"},
    "skip_masked": {"def": "O", "index": "jo"},
    "skip_data_span": {"def": "O", "index": "jo"},
    "map_mma": {"def": "C", "index": "k"},
    "fuse_let": {"producer": "S", "def": "Y"},
    "cache_row": {"def": "Y", "tensor": "X"},
    "recompute": {"def": "P"},
    "softmax_rowterm": {"def": "dS", "probs": "P", "output": "O"},
    "fold_stat": {"def": "O", "stat": "LSE"},
    "split_kv": {"def": "O", "index": "jo", "splits": 4},
    "split_k": {"def": "C", "index": "k", "splits": 4},
    "fuse_sums": {"def": "dV", "with": "dK"},
}


@pytest.mark.parametrize("rule", sorted(VALID_PARAMS))
def test_unknown_parameter(rule):
    RULES[rule].parse_params(VALID_PARAMS[rule])  # valid as given
    with pytest.raises(DerivationError, match="unknown parameter") as exc:
        RULES[rule].parse_params({**VALID_PARAMS[rule], "bogus_param": 1})
    assert "bogus_param" in str(exc.value)


def test_every_rule_has_parameter_examples():
    assert set(RULES) <= set(VALID_PARAMS), sorted(set(RULES) - set(VALID_PARAMS))


def test_bad_parameter_value():
    with pytest.raises(DerivationError, match="size"):
        RULES["tile"].parse_params({"def": "C", "index": "i", "size": 0})
