"""Property tests: random legal rule sequences on random small specs preserve meaning.

A spec is drawn from a few templates (matrix product with an optional batch dimension, a
row sum / row max (optionally masked), a masked softmax, attention with or without a causal
mask, an elementwise + reduction mix) with random fixed-or-dynamic sizes.  Rule applications
are drawn by listing candidates with random parameters (`rulekit.candidates`), shuffling them
and keeping the first whose `check` passes.  After every step the program must still print,
its digest must change, and the interpreter result must equal the spec's on fresh random
float64 inputs (relative error ≤ 1e-12) at random small sizes — including sizes that are not
multiples of the tiles used.
"""
from __future__ import annotations

import random
from collections import Counter

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rulekit import (  # noqa: E402
    RULES, TEMPLATES, TOLERANCE, DerivationError, apply, candidates, eval_sizes, make_spec,
    numeric_error, program_of, recipe,
)
from compiler.printer import show_program  # noqa: E402

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

MAX_TRIES = 40  # candidates tried per step before giving up on the step


def _tiles(steps: list[dict]) -> set[int]:
    return {s["size"] for s in steps if s["rule"] == "tile" and s["size"] > 1}


def _awkward(tiles: set[int], rnd: random.Random) -> int:
    """A small size that no tile divides (a partial last tile everywhere)."""
    n = max(tiles, default=1) + rnd.randint(1, 3)
    while any(n % t == 0 for t in tiles):
        n += 1
    return n


def _check_sizes(prog, steps, rnd: random.Random) -> list[dict[str, int]]:
    dyn = [n for n, v in prog.sizes if v is None]
    tiles = _tiles(steps)
    out = [eval_sizes(prog, {n: rnd.randint(1, 9) for n in dyn})]
    if dyn:
        out.append(eval_sizes(prog, {n: _awkward(tiles, rnd) for n in dyn}))
    return out


def _step(prog, rnd: random.Random, only: str | None = None):
    """One random legal rewrite of prog: (step, new program) or None."""
    cands = candidates(prog, rnd)
    if only is not None:
        cands = [c for c in cands if c["rule"] == only]
    rnd.shuffle(cands)
    for c in cands[:MAX_TRIES]:
        params = dict(c)
        rule = RULES[params.pop("rule")]
        p = rule.parse_params(params)
        try:
            facts = rule.check(prog, p)
        except DerivationError:
            continue
        return c, rule.rewrite(prog, p, facts)
    return None


def _assert_step_ok(ir0, before, after, step, steps, sizes_list, seed):
    text = show_program(after)  # printable
    assert isinstance(text, str) and text.strip()
    assert after != before, f"{step} left the program unchanged"
    assert after.digest() != before.digest(), f"{step} changed the program but not its digest"
    for k, sizes in enumerate(sizes_list):
        err = numeric_error(ir0, after, sizes, seed + k)
        assert err <= TOLERANCE, (
            f"step {len(steps)} {step}: relative error {err:.3g} at sizes {sizes}\n"
            f"steps: {steps}\nprogram:\n{text}"
        )


STATS: Counter = Counter()


def _run_sequence(template: str, rnd: random.Random, n_steps: int, use_recipe: bool, seed: int) -> list[dict]:
    ir0 = program_of(make_spec(template, rnd))
    note(show_program(ir0))
    prog, steps = ir0, []
    planned = recipe(template, ir0, rnd) if use_recipe else []
    for st_ in planned:
        params = dict(st_)
        new = apply(prog, params.pop("rule"), **params)
        steps.append(st_)
        _assert_step_ok(ir0, prog, new, st_, steps, _check_sizes(ir0, steps, rnd), seed)
        prog = new
    for _ in range(n_steps):
        got = _step(prog, rnd)
        if got is None:
            break
        step, new = got
        steps.append(step)
        note(f"step {len(steps)}: {step}")
        _assert_step_ok(ir0, prog, new, step, steps, _check_sizes(ir0, steps, rnd), seed)
        prog = new
    STATS.update(s["rule"] for s in steps)
    return steps


@SETTINGS
@given(
    template=st.sampled_from(TEMPLATES),
    rnd=st.randoms(use_true_random=False),
    n_steps=st.integers(1, 8),
    use_recipe=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_legal_sequences_preserve_meaning(template, rnd, n_steps, use_recipe, seed):
    _run_sequence(template, rnd, n_steps, use_recipe, seed)


@pytest.mark.parametrize("template", TEMPLATES)
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rnd=st.randoms(use_true_random=False), seed=st.integers(0, 2**31 - 1))
def test_each_template_deep_sequences(template, rnd, seed):
    """Every template, longer sequences (recipe first where there is one)."""
    _run_sequence(template, rnd, 8, True, seed)


@pytest.mark.parametrize(
    "template,rule",
    [
        ("matmul", "tile"), ("matmul", "reorder"), ("matmul", "cache"), ("matmul", "parallel"),
        ("rowreduce", "split"), ("rowreduce", "unfuse"), ("expsum", "assoc"), ("expsum", "fuse"),
        ("masked_softmax", "split_softmax"), ("attention", "fuse"), ("attention", "skip_masked"),
    ],
)
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rnd=st.randoms(use_true_random=False), seed=st.integers(0, 2**31 - 1))
def test_targeted_rule(template, rule, rnd, seed):
    """A random prefix, then the named rule wherever it applies (skipped if nowhere)."""
    ir0 = program_of(make_spec(template, rnd))
    prog, steps = ir0, []
    for st_ in recipe(template, ir0, rnd):
        params = dict(st_)
        prog = apply(prog, params.pop("rule"), **params)
        steps.append(st_)
    for _ in range(rnd.randint(0, 3)):
        got = _step(prog, rnd)
        if got is None:
            break
        steps.append(got[0])
        prog = got[1]
    for _ in range(2):
        got = _step(prog, rnd, only=rule)
        if got is None:
            break
        step, new = got
        steps.append(step)
        _assert_step_ok(ir0, prog, new, step, steps, _check_sizes(ir0, steps, rnd), seed)
        prog = new


def test_map_mma_property():
    """MAP-MMA on tensor-core shaped products (fixed 16 x 8 x 16, f16), after random legal steps."""
    import numpy as np

    from rulekit import spec_text

    ir0 = program_of(spec_text(
        ["C[i, j] = sum(k: A[i, k] * B[k, j])"], {"A": (["M", "K"], "f16"), "B": (["K", "N"], "f16")},
        {"M": 16, "N": 8, "K": 32}, "C"))
    rng = np.random.default_rng(7)
    done = 0
    for trial in range(6):
        rnd = random.Random(trial)
        prog, steps = ir0, []
        # odd trials: tile k by 16 and stage both operands (what MAP-MMA wants after tiling)
        if trial % 2:
            prog = apply(prog, "tile", **{"def": "C", "index": "k", "size": 16})
            prog = apply(prog, "cache", **{"def": "C", "tensor": "A", "at": "ko", "over": ["i", "ki"]})
            prog = apply(prog, "cache", **{"def": "C", "tensor": "B", "at": "ko", "over": ["ki", "j"]})
            steps += ["tile k 16", "cache A", "cache B"]
        for _ in range(trial % 3):  # a few random legal steps that may or may not block MAP-MMA
            got = _step(prog, rnd)
            if got is None or got[0]["rule"] in ("tile", "split", "map_mma"):
                break
            steps.append(got[0])
            prog = got[1]
        got = _step(prog, rnd, only="map_mma")
        if got is None and len(steps) > 3 * (trial % 2):
            continue  # a random step (a reorder of loops, say) may legitimately block it
        assert got is not None, f"map_mma found no legal site after {steps}"
        step, new = got
        _assert_step_ok(ir0, prog, new, step, steps + [step], [eval_sizes(ir0)], int(rng.integers(1 << 30)))
        assert new.def_named("C") != prog.def_named("C")
        done += 1
    assert done >= 3, f"MAP-MMA applied in only {done} of 6 trials"


def test_rule_coverage():
    """The random sequences above reached most rules (guards against a generator gone stale)."""
    if not STATS:
        pytest.skip("run with the property tests")
    reached = {r for r in STATS}
    want = {"tile", "reorder", "split", "fuse", "unfuse", "assoc", "cache", "parallel",
            "split_softmax", "online_agg"}
    missing = want - reached
    assert not missing, f"never applied: {sorted(missing)} (applied: {dict(STATS)})"
