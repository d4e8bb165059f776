"""Numeric checks with teeth (issue 15): rule mutations that one plain draw per step let through
now fail the build at their own step with exit 3.

Each test monkeypatches a registered rule's rewrite (or check) so that it produces a subtly
wrong program, builds through the CLI (`derivc build --no-codegen --no-proofs --seed 7`) and
asserts exit 3 with the error naming the mutated step.  The draws (compiler/draws.py): plain,
large (inputs × σ·(1 + 3t), the spec's largest softmax score past twice the float64 overflow
of exp) and masked (a size that only masks set so that rows have no live key).

- ONLINE-AGG (a) l not rescaled: the running sum's update drops the exp(m_old − m_new) factor;
  (b) the running max set to 0: exact in the reals, exp(s − 0) overflows float64 for s > 709.78.
  For every example that applies online_agg and a sample of generated attention specs
  (tests/specgen.py).  (a) is an equivalent mutant where every row has at most one live key
  (the mask i == j): the running max never changes once it is finite, so those specs are left out.
- SPLIT-SOFTMAX with M := 0 (exp(s) / Σ exp(s): exact in the reals): only the large draw fails it.
- TILE without the guard of the partial last tile, on each tiled axis of FlashAttention
  (non-causal: with j <= i < N the mask implies a key tile's guard, an equivalent mutant): the
  check sizes keep a partial tile on every tiled axis.
- ONLINE-AGG without the guard of P_t: NaN exactly in rows that have no live key yet
  (exp(−inf − (−inf))); with a window W that never cuts at the check sizes, only the masked
  draw (W = 0) has such rows.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from derivc_testing import NO_KERNEL, ROOT, run_cli

from compiler.ir import Bin, Const, Read, Select
from compiler.rules import RULES

sys.path.insert(0, str(ROOT / "tests"))
import specgen  # noqa: E402

EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if "online_agg" in p.read_text())
GENERATED = [c for c in specgen.cases(24, seed=0) if c.name.startswith("a")][:8]


def _fold_def(prog, p):
    d = prog.def_named(p.def_)
    return d, d.body


def l_not_rescaled(prog, p, facts):
    """l := l + Σ P_t instead of l · exp(m − m_new) + Σ P_t."""
    d, fold = _fold_def(prog, p)
    upd = fold.update[1]
    assert upd.op == "+" and upd.a.op == "*" and upd.a.a == Read(fold.state[1], ())
    update = (fold.update[0], Bin("+", upd.a.a, upd.b)) + fold.update[2:]
    return prog.with_def(replace(d, body=replace(fold, update=update)))


def max_zero(prog, p, facts):
    """m_new := 0 instead of max(m, max over the tile of S_t)."""
    d, fold = _fold_def(prog, p)
    binds = tuple(replace(b, value=Const(0.0)) if b.name == facts["m_new"] else b for b in fold.binds)
    return prog.with_def(replace(d, body=replace(fold, binds=binds)))


def p_unguarded(prog, p, facts):
    """P_t = exp(S_t − m_new) everywhere, the mask's [g] ? … : 0 dropped."""
    d, fold = _fold_def(prog, p)
    binds = tuple(replace(b, value=b.value.then) if b.name == facts["P_t"] and isinstance(b.value, Select) else b
                  for b in fold.binds)
    assert binds != fold.binds
    return prog.with_def(replace(d, body=replace(fold, binds=binds)))


def max_def_zero(prog, p, facts):
    """SPLIT-SOFTMAX's M := 0 (the shift of exp dropped)."""
    m = prog.def_named(facts["max"])
    return prog.with_def(replace(m, body=Const(0.0)))


def mutate_rewrite(monkeypatch, rule: str, mutant) -> None:
    r = RULES[rule]
    orig = r.rewrite
    monkeypatch.setattr(r, "rewrite", lambda prog, p, facts: mutant(orig(prog, p, facts), p, facts))


def step_of(spec: dict, rule: str, **params) -> int:
    """The step number of the rule in the default variant's schedule (a `when:` step the default
    choice excludes is dropped before numbering, as the build numbers them)."""
    default = {k: v[0] for k, v in (spec.get("variants") or {}).items()}

    def applies(s: dict) -> bool:
        return all(default[k] in (v if isinstance(v, list) else [v]) for k, v in (s.get("when") or {}).items())

    steps = [s for s in spec["schedule"] if applies(s)]
    return next(k for k, s in enumerate(steps, 1)
                if s["rule"] == rule and all(s.get(n) == v for n, v in params.items()))


def build(tmp_path: Path, spec: dict) -> tuple[int, str]:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    rc, _, err = run_cli(["build", str(path), "-o", str(tmp_path / "out"), "--no-codegen", "--no-proofs",
                          "--seed", "7"])
    return rc, err


def assert_fails_at(tmp_path: Path, spec: dict, step: int, rule: str) -> str:
    rc, err = build(tmp_path, spec)
    assert rc == 3, f"{spec['name']}: the mutant built (exit {rc}) {err}"
    assert f"step {step} ({rule}): numeric check failed" in err, err
    assert not (tmp_path / "out").exists()
    return err


def failing_draw(err: str) -> str:
    return re.search(r"\((plain|large|masked)\b[^)]*\)?,? ?(draw)?", err).group(1)


# --------------------------------------------------------------------------- ONLINE-AGG


ONLINE = {"l_not_rescaled": l_not_rescaled, "max_zero": max_zero}


@pytest.mark.parametrize("mutation", sorted(ONLINE))
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_online_agg_mutants_fail_every_example(tmp_path, monkeypatch, path, mutation):
    if mutation == "max_zero" and path.stem == "attention_softcap":
        pytest.skip("an equivalent mutant: soft-capped scores lie in [-30, 30], so exp(s - 0) never overflows "
                    "and the running max is a shift that cancels exactly")
    spec = yaml.safe_load(path.read_text())
    mutate_rewrite(monkeypatch, "online_agg", ONLINE[mutation])
    err = assert_fails_at(tmp_path, spec, step_of(spec, "online_agg"), "online_agg")
    if mutation == "max_zero":  # exact in the reals: only an overflow shows it
        assert failing_draw(err) == "large" and "NaN / inf" in err


@pytest.mark.parametrize("mutation", sorted(ONLINE))
@pytest.mark.parametrize("case", GENERATED, ids=[c.name for c in GENERATED])
def test_online_agg_mutants_fail_generated_specs(tmp_path, monkeypatch, case, mutation):
    if mutation == "l_not_rescaled" and "ieqj" in case.name:
        pytest.skip("an equivalent mutant: one live key per row, the running max never changes once finite")
    mutate_rewrite(monkeypatch, "online_agg", ONLINE[mutation])
    assert_fails_at(tmp_path, case.spec, step_of(case.spec, "online_agg"), "online_agg")


def test_the_generated_sample_covers_masks_and_mappings():
    names = " ".join(c.name for c in GENERATED)
    assert len(GENERATED) == 8 and "simt" in names and "mma_sync" in names
    assert any(tag in names for tag in ("jlei", "jlti", "igtj")) and sum("ieqj" not in c.name for c in GENERATED) >= 6


def test_the_plain_draw_alone_misses_max_zero(monkeypatch):
    """Control: (b) is invisible to the plain draw (exact in the reals, no overflow at scores
    of a few units); the large draw is what kills it."""
    from compiler import derive as derive_mod
    from compiler.draws import DrawPlan
    from compiler.spec import load_spec_file

    path = ROOT / "examples" / "flash_attention.yaml"
    mutate_rewrite(monkeypatch, "online_agg", max_zero)
    only_plain = DrawPlan.draws
    monkeypatch.setattr(DrawPlan, "draws", lambda self, seed: only_plain(self, seed)[:1])
    d = derive_mod.derive(load_spec_file(path), str(path), seed=7)
    assert all([x["kind"] for x in s.numeric["draws"]] == ["plain"] for s in d.steps)


# --------------------------------------------------------------------------- other rules


def test_split_softmax_without_the_shift_fails_on_the_large_draw(tmp_path, monkeypatch):
    for name in ("flash_attention", "softmax_online"):
        spec = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
        with monkeypatch.context() as m:
            mutate_rewrite(m, "split_softmax", max_def_zero)
            err = assert_fails_at(tmp_path, spec, step_of(spec, "split_softmax"), "split_softmax")
        assert failing_draw(err) == "large"


@pytest.mark.parametrize("index", ["j", "j_", "i"])
def test_tile_without_its_guard_fails_on_every_tiled_axis(tmp_path, monkeypatch, index):
    """The guard of the partial last tile dropped on one tile step of FlashAttention (key tiles
    of O and L, the query tile of the fused fold): the check sizes leave a partial tile there.
    Non-causal: under j <= i < N a key tile's guard is implied by the mask (an equivalent mutant)."""
    spec = yaml.safe_load((ROOT / "examples" / "flash_attention_noncausal.yaml").read_text())
    r = RULES["tile"]
    orig = r.check
    monkeypatch.setattr(r, "check", lambda prog, p: {**orig(prog, p), "guarded": False} if p.index == index
                        else orig(prog, p))
    assert_fails_at(tmp_path, spec, step_of(spec, "tile", index=index), "tile")


def test_online_agg_unguarded_p_fails_only_on_the_masked_draw(tmp_path, monkeypatch):
    spec = yaml.safe_load((ROOT / "examples" / "attention_sliding_window.yaml").read_text())
    spec["sizes"]["W"] = "dynamic"
    spec["check_sizes"]["W"] = 1024  # never cuts at N = 200: no row without a live key
    rc, err = build(tmp_path, spec)
    assert rc == 0, err
    trace = yaml.safe_load((tmp_path / "out" / "derivation.json").read_text())
    assert trace["draws"]["masked_sizes"]["W"] == 0 and trace["draws"]["masked_rows_at_check_sizes"] == 0
    assert [x["kind"] for x in trace["steps"][0]["numeric"]["draws"]] == ["plain", "large", "masked"]
    import shutil

    shutil.rmtree(tmp_path / "out")
    mutate_rewrite(monkeypatch, "online_agg", p_unguarded)
    err = assert_fails_at(tmp_path, spec, step_of(spec, "online_agg"), "online_agg")
    assert failing_draw(err) == "masked" and "W=0" in err


# --------------------------------------------------------------------------- check sizes


NESTED = {
    "name": "nested_tiles", "sizes": {"M": "dynamic", "N": "dynamic", "K": "dynamic"},
    "inputs": {"A": {"shape": ["M", "K"], "dtype": "f32"}, "B": {"shape": ["K", "N"], "dtype": "f32"}},
    "statements": ["C[i, j] = sum(k: A[i, k] * B[k, j])"], "output": {"tensor": "C", "dtype": "f32"},
    "schedule": [{"rule": "tile", "def": "C", "index": "i", "size": 128},
                 {"rule": "tile", "def": "C", "index": "io", "size": 2},  # a tile of ceil(M / 128)
                 {"rule": "tile", "def": "C", "index": "ii", "size": 64},  # inside the guard 128·io + ii < M
                 {"rule": "tile", "def": "C", "index": "k", "size": 32},
                 {"rule": "tile", "def": "C", "index": "ki", "size": 24}],
}


def _tiled(spec_dict: dict | Path, check: bool = True):
    """(the derivation, [(step, tiled extent)]); without `check` only the programs (no check sizes)."""
    from compiler.checksizes import tiled_extents
    from compiler.derive import derive
    from compiler.spec import load_spec_file, parse_spec_text

    spec = (load_spec_file(spec_dict) if isinstance(spec_dict, Path)
            else parse_spec_text(yaml.safe_dump(spec_dict), "spec.yaml"))
    d = derive(spec, "spec.yaml", seed=1, check=check)
    return d, [(k, t) for k, (prog, step) in enumerate(zip(d.programs, spec.schedule), start=1)
               for t in tiled_extents(prog, step.params())]


def test_nested_tiles_keep_a_partial_last_tile():
    """Every tile on a dynamic size, nested ones included, has a partial last tile at the
    chosen sizes: ceil(M / 128) odd for the tile of 2 on io (M = 385 would give 4 full pairs),
    M - 128·io short of 64 at the last query tile, K - 32·ko not a multiple of 24."""
    d, tiled = _tiled(NESTED)
    assert [str(t) for _, t in tiled] == ["tile 128 on M", "tile 2 on ceil(M/128)", "tile 64 on M - 128*ioi - 256*ioo",
                                          "tile 32 on K", "tile 24 on K - 32*ko"]
    for k, t in tiled:
        assert t.partial(d.check_sizes), f"step {k}: {t} at {d.check_sizes}: last extent {t.last_extent(d.check_sizes)}"
    assert d.check_notes == ()


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_tile_has_a_partial_tile_or_says_why_not(example, example_build):
    """The check sizes and notes the example's build recorded (the run's shared build): the
    programs alone are derived here, without the numeric checks the build ran."""
    b = example_build(example, codegen=example.stem not in NO_KERNEL)
    assert b.rc == 0, b.stderr
    trace = json.loads((b.out / "derivation.json").read_text())
    sizes, notes = trace["check_sizes"], trace["check_notes"]
    _, tiled = _tiled(example, check=False)
    for k, t in tiled:
        if not t.partial(sizes):
            assert any(n.startswith(f"step {k}: {t} divides it") for n in notes), (k, str(t), notes)


def test_a_fixed_extent_a_tile_divides_is_reported(tmp_path):
    spec = yaml.safe_load((ROOT / "examples" / "softmax_online.yaml").read_text())
    rc, err = build(tmp_path, spec)
    assert rc == 0, err
    note = "step 2: tile 4096 on C divides it (C = 8192 is fixed): no partial last tile"
    trace = yaml.safe_load((tmp_path / "out" / "derivation.json").read_text())
    assert trace["check_notes"] == [note]
    assert f"- {note}" in (tmp_path / "out" / "report.md").read_text()
