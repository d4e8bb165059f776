"""What a new user writes schedules from: docs/rules.md (generated from the rules' parameter
models), `derivc explain --hint` (next legal steps) and docs/guide.md (its explain output and its
final schedules, re-run here), and the README's CLI synopsis and outputs table."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

if __name__ == "__main__":  # run as a script (rewrites the guide): the test helpers by path
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import conftest  # noqa: F401 - registers derivc_testing
from derivc_testing import ROOT, run_cli, sweep_sample

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


def _check_hints_at_every_prefix(path: Path) -> int:
    """Cut the example's schedule after every step, ask for hints, append each as printed (its
    YAML text): the derivation (the schedule's names, the rule's parameters and precondition)
    accepts it.  Returns the number of hints checked."""
    from compiler.schedule_variants import expand

    spec = expand(load_spec_file(path))[0].spec  # a schedule with variants: its default
    full = derive(spec, path.name, check=False)
    assert len(full.programs) == len(spec.schedule) + 1
    shown = 0
    for k, prog in enumerate(full.programs):
        for hint in hints.next_steps(prog):
            step = ScheduleStep(**yaml.safe_load(hint.yaml()))
            trial = spec.model_copy(update={"schedule": [*spec.schedule[:k], step]})
            d = derive(trial, path.name, check=False)
            assert len(d.steps) == k + 1, (k, hint.line())
            shown += 1
    return shown


@pytest.mark.parametrize("name", HINT_EXAMPLES)
def test_every_hint_is_accepted_at_every_prefix(name: str):
    spec = load_spec_file(ROOT / "examples" / name)
    assert _check_hints_at_every_prefix(ROOT / "examples" / name) >= len(spec.schedule)


OTHER_EXAMPLES = [p for p in sorted((ROOT / "examples").glob("*.yaml")) if p.name not in HINT_EXAMPLES]


@pytest.mark.slow
@pytest.mark.sweep
@pytest.mark.parametrize("path", sweep_sample(OTHER_EXAMPLES, 4, "hints"), ids=lambda p: p.stem)
def test_every_hint_is_accepted_on_every_example(path: Path):
    """The same on the other examples' (forward) schedules: a sweep, 4 examples drawn per run
    (DERIVC_SWEEP_FULL=1: every one, about 5,000 hints, two minutes of CPU)."""
    _check_hints_at_every_prefix(path)


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


# --------------------------------------------------------------------------- docs/guide.md
#
# The guide's fenced blocks are its test: ```yaml FILE``` blocks are appended, in order, to FILE
# (the file as the reader has it at that point); ```yaml FILE whole``` must equal FILE as built
# up so far; a ```console derivc``` block starts with `$ derivc ARGS` and shows what the CLI
# prints for ARGS, run in a directory holding the files as they stand there.  Numbers after
# "rel. error", "relative error" and in error columns may differ (float64 rounding of another
# machine); everything else must match.  `python tests/test_guide.py` rewrites the outputs.

GUIDE = DOCS / "guide.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)


def _normal(text: str) -> str:
    """Error magnitudes of the numeric checks masked (they depend on the machine's float64)."""
    out = []
    for line in text.splitlines():
        if "error" in line or re.match(r"^\d+\s+\w+\s+[A-Z-]+\s", line):
            line = re.sub(r"\d\.\d+e[-+]\d+|\b0\.0e\+00\b|(?<=rel\. error )\S+", "<err>", line)
        out.append(line.rstrip())
    return "\n".join(out).strip()


def render_guide(text: str, workdir: Path) -> tuple[str, dict[str, str], list[str]]:
    """The guide with every `console derivc` block's output re-run; (text, files, commands)."""
    import shlex

    files: dict[str, str] = {}
    commands: list[str] = []
    pieces, last = [], 0
    for m in FENCE.finditer(text):
        info, body = m.group(1).split(), m.group(2)
        if info[:1] == ["yaml"] and len(info) >= 2:
            if info[2:] == ["whole"]:
                assert body == files.get(info[1]), f"guide: the whole {info[1]} differs from its parts"
            else:
                files[info[1]] = files.get(info[1], "") + body
        if info == ["console", "derivc"]:
            command, _, _ = body.partition("\n")
            assert command.startswith("$ derivc "), command
            for name, content in files.items():
                (workdir / name).write_text(content)
            cwd = os.getcwd()
            os.chdir(workdir)
            try:
                rc, out, err = run_cli(shlex.split(command[len("$ derivc "):]))
            finally:
                os.chdir(cwd)
            commands.append(command)
            shown = out + err + ("" if rc == 0 else f"(exit {rc})\n")
            pieces.append(text[last:m.start(2)] + command + "\n" + shown)
            last = m.end(2)
    pieces.append(text[last:])
    return "".join(pieces), files, commands


GUIDE_RUN_GROUP = pytest.mark.xdist_group("guide-run")  # the tests of guide_run on one worker: it runs once


@pytest.fixture(scope="module")
def guide_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, dict[str, str], list[str], Path]:
    """The guide re-run once: (text, re-rendered text, files, commands, working directory)."""
    work = tmp_path_factory.mktemp("guide")
    text = GUIDE.read_text()
    fresh, files, commands = render_guide(text, work)
    return text, fresh, files, commands, work


@GUIDE_RUN_GROUP
def test_guide_output_is_what_the_cli_prints(guide_run):
    text, fresh, files, commands, _ = guide_run
    assert {"gemm.yaml", "attention.yaml"} <= set(files)
    for old, new in zip(FENCE.findall(text), FENCE.findall(fresh)):
        assert _normal(old[1]) == _normal(new[1]), f"docs/guide.md is stale (python tests/test_guide.py):\n{new[1]}"


@GUIDE_RUN_GROUP
def test_guide_final_schedules_build_tensor_core_kernels(guide_run):
    """The guide's whole GEMM and attention files are built by its own `derivc build` commands
    (--no-proofs: NVRTC, SASS checks where the CUDA tools are, the kernel text run on the CPU)."""
    _, _, files, commands, work = guide_run
    for name, mapping in (("gemm.yaml", "contraction_wgmma"), ("attention.yaml", "online_fold_wgmma")):
        command = next(c for c in commands if f" build {name} " in c)
        out = work / command.split(" -o ", 1)[1].split()[0]
        assert (out / "kernel.cu").is_file(), command
        assert json.loads((out / "plan.json").read_text())["mapping"] == mapping
        assert json.loads((out / "derivation.json").read_text())["spec_text"] == files[name]
        if (out / "sass.json").exists():
            assert json.loads((out / "sass.json").read_text())["violations"] == []


# --------------------------------------------------------------------------- README

README = ROOT / "README.md"


def test_readme_cli_synopsis_is_the_parser():
    from compiler.cli_synopsis import readme_block

    assert readme_block() in README.read_text(), \
        "README's CLI synopsis is stale: python -m compiler.cli_synopsis, paste it between the markers"


def test_readme_rule_table_lists_every_rule_and_its_parameters():
    from compiler.rule_reference import brief_parameters

    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| \[`(\w+)`\]\(docs/rules\.md#\1\) \|.*$", README.read_text(), re.M)}
    assert set(rows) == set(RULES)
    for name, rule in RULES.items():
        assert rows[name].split(" | ")[1] == brief_parameters(rule), name


def _output_patterns() -> list[re.Pattern[str]]:
    """The README's outputs table, each backticked name as a pattern over a build's paths."""
    text = README.read_text().split("## Outputs of a build", 1)[1].split("\n\n", 2)[2]
    table = text.split("\n\n", 1)[0]
    out = []
    for row in table.splitlines()[2:]:
        for name in re.findall(r"`([^`]+)`", row.split(" | ")[0]):
            rx = re.escape(name).replace("NN", r"\d+")
            rx = re.sub(r"<[^>]+>", "[^/]+", rx.replace("\\<", "<").replace("\\>", ">"))
            out.append(re.compile(rx + (".*" if name.endswith("/") else "") + "$"))
    return out


@GUIDE_RUN_GROUP
def test_readme_outputs_table_lists_every_file_a_build_writes(guide_run):
    _, _, _, commands, work = guide_run
    patterns = _output_patterns()
    assert len(patterns) > 10
    for command in commands:
        if " build " in command:
            out = work / command.split(" -o ", 1)[1].split()[0]
            for f in out.rglob("*"):
                rel = f.relative_to(out).as_posix()
                if f.is_file():
                    assert any(p.match(rel) for p in patterns), f"README's outputs table misses {rel}"


if __name__ == "__main__":  # rewrite the guide's outputs after a deliberate change of the CLI
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        GUIDE.write_text(render_guide(GUIDE.read_text(), Path(tmp))[0])
