"""What a new user writes schedules from: docs/rules.md (generated from the rules' parameter
models), `derivc explain --hint` (next legal steps) and docs/guide.md (its explain output and its
final schedules, re-run here), and the README's CLI synopsis and outputs table."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from derivc_testing import ROOT, run_cli

from compiler import hints
from compiler.derive import derive
from compiler.rule_reference import rule_reference
from compiler.rules import RULES
from compiler.spec import ScheduleStep, load_spec_file

DOCS = ROOT / "docs"

# --------------------------------------------------------------------------- docs/rules.md


def test_rules_md_is_generated():
    assert (DOCS / "rules.md").read_text() == rule_reference(), \
        "docs/rules.md is stale: python -m compiler explain --rules > docs/rules.md"


def test_rule_reference_lists_every_parameter_with_its_meaning():
    text = rule_reference()
    for name, rule in RULES.items():
        section = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for field, info in rule.Params.model_fields.items():
            assert info.description, f"{name}.{info.alias or field} has no docstring"
            assert f"| `{info.alias or field}` |" in section, (name, field)
    cache = text.split("\n## cache\n", 1)[1].split("\n## ", 1)[0]
    assert "| `stages` | int | `1` | 1 … 4 |" in cache
    assert "| `level` | str | `shared` | `shared`, `register` |" in cache
    assert "| `to` | str | required | `grid.x`, `grid.y`, `grid.z`, `warp`, `thread` |" in text


def test_explain_rules_cli():
    rc, out, err = run_cli(["explain", "--rules"])
    assert rc == 0 and err == "" and out == rule_reference()
    rc, _, err = run_cli(["explain", "--rules", "examples/gemm.yaml"])
    assert rc == 2 and "--rules" in err
    rc, _, err = run_cli(["explain"])
    assert rc == 2 and "FILE" in err


# --------------------------------------------------------------------------- --hint

HINT_EXAMPLES = ["gemm.yaml", "gemm_wgmma.yaml", "gemm_bias_gelu.yaml", "flash_attention.yaml",
                 "flash_attention_wgmma.yaml", "attention_gqa.yaml", "softmax_online.yaml", "layernorm.yaml",
                 "decode_splitkv.yaml"]


@pytest.mark.parametrize("name", HINT_EXAMPLES)
def test_every_hint_is_accepted_at_every_prefix(name: str):
    """Cut the example's schedule after every step, ask for hints, append each as printed (its
    YAML text): the derivation (the rule's parameters and precondition) accepts it."""
    spec = load_spec_file(ROOT / "examples" / name)
    full = derive(spec, name, check=False)
    assert len(full.programs) == len(spec.schedule) + 1
    shown = 0
    for k, prog in enumerate(full.programs):
        for hint in hints.next_steps(prog):
            step = ScheduleStep(**yaml.safe_load(hint.yaml()))
            trial = spec.model_copy(update={"schedule": [*spec.schedule[:k], step]})
            d = derive(trial, name, check=False)
            assert len(d.steps) == k + 1, (k, hint.line())
            shown += 1
    assert shown >= len(spec.schedule)  # hints were given along the way


def test_hints_follow_the_program_state(tmp_path: Path):
    """After tiling and reordering GEMM the hint is the grid mapping the issue asked for; a
    finished schedule names its mapping."""
    spec = load_spec_file(ROOT / "examples" / "gemm.yaml")
    d = derive(spec, "gemm.yaml", check=False, upto=4)
    lines = [h.line() for h in hints.next_steps(d.final)]
    assert "loop io < ceil(M/128) of C is not mapped to the grid: add {rule: parallel, def: C, index: io, to: grid.y}" \
        in lines
    assert any("stage its tile" in x and "tensor: A, at: ko, over: [ii, ki]" in x for x in lines)
    assert not any("rule: map_mma" in x for x in lines)  # no tile product yet: nothing staged
    rc, out, err = run_cli(["--plain", "explain", "examples/gemm.yaml", "--hint", "--seed", "0"])
    assert rc == 0, err
    assert "kernel: mapping contraction_mma_sync, tensor cores (mma_sync)\nhints: none" in out
    rc, out, err = run_cli(["--plain", "explain", "examples/gemm.yaml", "--hint", "--upto", "0", "--seed", "0"])
    assert rc == 0 and "no kernel yet: lowering: loop i < M is not mapped to the grid" in out
    assert "hint: loop i < M of C is not tiled" in out


def test_explain_step_shows_one_step():
    rc, out, err = run_cli(["--plain", "explain", "examples/gemm.yaml", "--step", "3", "--seed", "0"])
    assert rc == 0, err
    assert out.startswith("== step 3: reorder (REORDER) ==") and "step 2" not in out and "IR0" not in out
    for bad in (["--step", "0"], ["--step", "99"], ["--step", "2", "--upto", "2"]):
        rc, _, err = run_cli(["explain", "examples/gemm.yaml", *bad])
        assert rc == 2 and "--step" in err, bad
