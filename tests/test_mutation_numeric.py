"""Mutation tests: the per-step numeric check catches a wrong rewrite.

Each test wraps a rule's `check` or `rewrite` (monkeypatched on the registered rule object)
so that it produces a subtly corrupted program, applies the step, and asserts that the
interpreter-based check (`rulekit.numeric_error`: relative error > 1e-12, or NaN / an
ill-formed program) flags it — and, as a control, that the unmutated rule passes the same
check on the same inputs.  The last test goes through `compiler.derive.derive`.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from rulekit import (
    RULES, TOLERANCE, Aff, Bin, Const, DerivationError, Let, Read, apply, apply_steps, attention,
    caught, fa_steps, gemm, numeric_error, program_of, spec_text, swap_vars, transform,
)
from compiler.ir import Reduce

SEEDS = (0, 1, 2)


def D(name):
    return {"def": name}


def assert_control_and_mutant(monkeypatch, ir0, before, rule, params, sizes, *, wrap_rewrite=None, wrap_check=None):
    """The honest rule passes the check; the mutated one is caught, on every seed."""
    good = apply(before, rule, **params)
    for seed in SEEDS:
        err = numeric_error(ir0, good, sizes, seed)
        assert err <= TOLERANCE, f"control: honest {rule} fails the check ({err:.3g})"
    r = RULES[rule]
    if wrap_rewrite is not None:
        orig = r.rewrite
        monkeypatch.setattr(r, "rewrite", lambda prog, p, facts: wrap_rewrite(orig(prog, p, facts), p, facts))
    if wrap_check is not None:
        orig_check = r.check
        monkeypatch.setattr(r, "check", lambda prog, p: wrap_check(orig_check(prog, p), p))
    bad = apply(before, rule, **params)
    assert bad != good, "the mutation did not change the rewrite"
    errs = [numeric_error(ir0, bad, sizes, seed) for seed in SEEDS]
    assert all(caught(e) for e in errs), f"mutant of {rule} not caught: errors {errs}"
    return errs


def map_def(prog, name, f):
    d = prog.def_named(name)
    return prog.with_def(f(d))


def map_body(prog, name, f):
    return map_def(prog, name, lambda d: replace(d, body=transform(d.body, f)))


# --------------------------------------------------------------------------- (a) ONLINE-AGG


@pytest.mark.parametrize("causal", [True, False])
def test_online_agg_without_rescale(monkeypatch, causal):
    """acc and l are not rescaled when the running max grows: exp(m - m_new) replaced by 1."""
    ir0 = attention(causal=causal)
    before = apply_steps(ir0, fa_steps(4)[:-1])

    def drop_rescale(prog, p, facts):
        return map_body(prog, "O", lambda e: Const(1.0) if isinstance(e, Bin) and e.op == "rescale" else e)

    assert_control_and_mutant(monkeypatch, ir0, before, "online_agg", {**D("O"), "index": "jo"}, {"N": 11},
                              wrap_rewrite=drop_rescale)


def test_online_agg_with_stale_max(monkeypatch):
    """P_t computed with the old running max m instead of m_new (a classic FA2 slip)."""
    ir0 = attention(causal=True)
    before = apply_steps(ir0, fa_steps(4)[:-1])

    def stale(prog, p, facts):
        m, m_new, p_t = facts["m"], facts["m_new"], facts["P_t"]

        d = prog.def_named("O")
        fold = d.body
        binds = tuple(
            replace(b, value=transform(b.value, lambda e: Read(m, ()) if e == Read(m_new, ()) else e))
            if b.name == p_t else b
            for b in fold.binds
        )
        return prog.with_def(replace(d, body=replace(fold, binds=binds)))

    assert_control_and_mutant(monkeypatch, ir0, before, "online_agg", {**D("O"), "index": "jo"}, {"N": 11},
                              wrap_rewrite=stale)


# --------------------------------------------------------------------------- (b) TILE


def test_tile_reduction_with_swapped_indices(monkeypatch):
    """sum over T*ki + ko instead of T*ko + ki (K = 10, T = 3: some k twice, none missing)."""
    ir0 = gemm()

    def swapped(prog, p, facts):
        outer, inner = facts["outer"], facts["inner"]

        def f(e):
            if isinstance(e, Reduce) and e.var == outer and isinstance(e.body, Reduce):
                return replace(e, body=replace(e.body, body=swap_vars(e.body.body, outer, inner)))
            return e

        return map_body(prog, "C", f)

    assert_control_and_mutant(monkeypatch, ir0, ir0, "tile", {**D("C"), "index": "k", "size": 3},
                              {"M": 4, "N": 5, "K": 10}, wrap_rewrite=swapped)


def test_tile_loop_with_swapped_indices(monkeypatch):
    """C[T*ii + io] instead of C[T*io + ii]: elements written twice / never (an ill-formed def)."""
    ir0 = gemm()

    def swapped(prog, p, facts):
        outer, inner = facts["outer"], facts["inner"]

        def f(d):
            return replace(
                d,
                store=tuple(a.subst(outer, Aff.of("__t")).subst(inner, Aff.of(outer)).subst("__t", Aff.of(inner))
                            for a in d.store),
                guard=tuple(c.subst(outer, Aff.of("__t")).subst(inner, Aff.of(outer)).subst("__t", Aff.of(inner))
                            for c in d.guard),
                body=swap_vars(d.body, outer, inner),
            )

        return map_def(prog, "C", f)

    errs = assert_control_and_mutant(monkeypatch, ir0, ir0, "tile", {**D("C"), "index": "i", "size": 3},
                                     {"M": 10, "N": 4, "K": 5}, wrap_rewrite=swapped)
    assert all(e == float("inf") for e in errs)


@pytest.mark.parametrize("index", ["i", "k"])
def test_tile_without_guard_on_partial_tile(monkeypatch, index):
    """The guard of the last, partial tile is left out: out-of-range reads (NaN) or stores."""
    ir0 = gemm()

    def unguarded(facts, p):
        return {**facts, "guarded": False}

    errs = assert_control_and_mutant(monkeypatch, ir0, ir0, "tile", {**D("C"), "index": index, "size": 4},
                                     {"M": 7, "N": 3, "K": 7}, wrap_check=unguarded)
    assert all(e == float("inf") for e in errs)


# --------------------------------------------------------------------------- (c) REORDER / SPLIT


def test_split_drops_last_iteration(monkeypatch):
    ir0 = gemm({"M": 4, "N": 3, "K": 8})

    def short(facts, p):
        return {**facts, "second_extent": facts["second_extent"] - 1}

    assert_control_and_mutant(monkeypatch, ir0, ir0, "split", {**D("C"), "index": "k", "at": 3},
                              {}, wrap_check=short)


def test_split_second_half_off_by_one(monkeypatch):
    """The second half starts at at + 1 (one element skipped, one read past the end)."""
    ir0 = gemm({"M": 4, "N": 3, "K": 8})

    def shifted(prog, p, facts):
        k2 = facts["second"]

        def f(e):
            if isinstance(e, Reduce) and e.var == k2:
                return replace(e, body=_shift(e.body, k2, 1))
            return e

        return map_body(prog, "C", f)

    assert_control_and_mutant(monkeypatch, ir0, ir0, "split", {**D("C"), "index": "k", "at": 3},
                              {}, wrap_rewrite=shifted)


def _shift(e, var, by):
    from compiler.ir import subst_index

    return subst_index(e, var, Aff.build({var: 1}, by))


def test_reorder_reductions_drops_one_iteration(monkeypatch):
    ir0 = program_of(spec_text(["Y[i] = sum(j: X[i, j])"], {"X": (["M", "N"], "f32")},
                               {"M": "dynamic", "N": "dynamic"}, "Y"))
    before = apply(ir0, "tile", **D("Y"), index="j", size=3)

    def drop(prog, p, facts):
        def f(e):
            if isinstance(e, Reduce) and e.var == p.inner and isinstance(e.body, Reduce):
                num, div = e.ext.single()
                return replace(e, ext=type(e.ext)(((num - 1, div),)))
            return e

        return map_body(prog, "Y", f)

    assert_control_and_mutant(monkeypatch, ir0, before, "reorder", {**D("Y"), "outer": "jo", "inner": "ji"},
                              {"M": 3, "N": 8}, wrap_rewrite=drop)


def test_reorder_loops_drops_one_iteration(monkeypatch):
    ir0 = gemm()

    def drop(prog, p, facts):
        d = prog.def_named("C")
        loops = list(d.loops)
        num, div = loops[0].ext.single()
        loops[0] = replace(loops[0], ext=type(loops[0].ext)(((num - 1, div),)))
        return prog.with_def(replace(d, loops=tuple(loops)))

    errs = assert_control_and_mutant(monkeypatch, ir0, ir0, "reorder", {**D("C"), "outer": "i", "inner": "j"},
                                     {"M": 4, "N": 5, "K": 3}, wrap_rewrite=drop)
    assert all(e == float("inf") for e in errs)  # an element never written: ill-formed


# --------------------------------------------------------------------------- (d) CACHE


@pytest.mark.parametrize("position", [0, 1])
def test_cache_reads_tile_at_wrong_offset(monkeypatch, position):
    """The staged tile is loaded one element off (base + r + 1) in one position."""
    ir0 = gemm({"M": 6, "N": "dynamic", "K": "dynamic"})
    before = apply(ir0, "tile", **D("C"), index="k", size=4)

    def off(prog, p, facts):
        def f(e):
            if isinstance(e, Let) and e.bind.source == "A":
                def g(x):
                    if isinstance(x, Read) and x.tensor == "A":
                        idx = list(x.idx)
                        idx[position] = idx[position] + 1
                        return Read("A", tuple(idx))
                    return x

                return Let(replace(e.bind, value=transform(e.bind.value, g)), e.body)
            return e

        return map_body(prog, "C", f)

    assert_control_and_mutant(
        monkeypatch, ir0, before, "cache",
        {**D("C"), "tensor": "A", "at": "ko", "over": ["i", "ki"], "level": "shared"},
        {"N": 3, "K": 10}, wrap_rewrite=off)


# --------------------------------------------------------------------------- (e) SPLIT-SOFTMAX


@pytest.mark.parametrize("spec", ["masked_softmax", "attention"])
def test_split_softmax_without_max_in_L(monkeypatch, spec):
    """L = Σ exp(s) instead of Σ exp(s - M): off by a factor exp(M) per row."""
    if spec == "masked_softmax":
        ir0 = program_of(spec_text(["P[i, j] = softmax(j | j <= i: X[i, j])"], {"X": (["N", "N"], "f32")},
                                   {"N": "dynamic"}, "P"))
        before, sizes = ir0, {"N": 6}
    else:
        ir0 = attention(causal=True)
        before, sizes = ir0, {"N": 6}

    def no_max(prog, p, facts):
        m, l = facts["max"], facts["sum"]

        def f(e):
            if isinstance(e, Bin) and e.op == "-" and isinstance(e.b, Read) and e.b.tensor == m:
                return e.a
            return e

        return map_body(prog, l, f)

    assert_control_and_mutant(monkeypatch, ir0, before, "split_softmax", D("P"), sizes, wrap_rewrite=no_max)


# --------------------------------------------------------------------------- the check itself


def test_numeric_error_is_zero_for_the_spec_itself():
    ir0 = attention()
    assert numeric_error(ir0, ir0, {"N": 5}, 3) == 0.0


def test_numeric_error_flags_nan_and_bad_programs():
    ir0 = gemm()
    c = ir0.def_named("C")
    nan = ir0.with_def(replace(c, body=Bin("*", c.body, Const(float("nan")))))
    assert numeric_error(ir0, nan, {"M": 3, "N": 3, "K": 3}) == float("inf")
    half = ir0.with_def(replace(c, loops=(replace(c.loops[0], ext=type(c.loops[0].ext).of(1)),) + c.loops[1:]))
    assert numeric_error(ir0, half, {"M": 3, "N": 3, "K": 3}) == float("inf")
    tiny = ir0.with_def(replace(c, body=Bin("*", c.body, Const(1 + 1e-9))))
    assert caught(numeric_error(ir0, tiny, {"M": 3, "N": 3, "K": 3}))


# --------------------------------------------------------------------------- through derive()


FA_YAML = spec_text(
    [
        "S[i, j] = scale * sum(e: Q[i, e] * K[j, e])",
        "P[i, j] = softmax(j | j <= i: S[i, j])",
        "O[i, d] = sum(j: P[i, j] * V[j, d])",
    ],
    {x: (["N", "D"], "f16") for x in ("Q", "K", "V")},
    {"N": "dynamic", "D": 4}, "O", params={"scale": 0.5}, name="fa_small",
    schedule=fa_steps(4),
)


def test_derive_catches_online_agg_without_rescale(monkeypatch):
    derive_mod = pytest.importorskip("compiler.derive")
    if not hasattr(derive_mod, "derive"):
        pytest.skip("compiler.derive.derive not written yet")
    from compiler.spec import parse_spec_text

    spec = parse_spec_text(FA_YAML)
    ok = derive_mod.derive(spec, "fa_small.yaml", seed=5)  # control: the honest schedule passes
    assert len(ok.steps) == len(spec.schedule)

    r = RULES["online_agg"]
    orig = r.rewrite

    def drop_rescale(prog, p, facts):
        return map_body(orig(prog, p, facts), "O",
                        lambda e: Const(1.0) if isinstance(e, Bin) and e.op == "rescale" else e)

    monkeypatch.setattr(r, "rewrite", drop_rescale)
    with pytest.raises(DerivationError) as exc:
        derive_mod.derive(spec, "fa_small.yaml", seed=5)
    assert "numeric check" in str(exc.value)
    assert exc.value.step == len(spec.schedule)  # online_agg is the last step
    assert exc.value.rule == "online_agg"
