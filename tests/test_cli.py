"""`derivc build` / `explain` and the reserved subcommands, through compiler.cli.main."""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from derivc_testing import ROOT, gemm_yaml, run_cli

from compiler.rules import RULES

TILED = [
    {"rule": "tile", "def": "C", "index": "i", "size": 4},
    {"rule": "tile", "def": "C", "index": "k", "size": 4},
    {"rule": "reorder", "def": "C", "outer": "ii", "inner": "j"},
]


def existing(schedule):
    """The steps of `schedule` whose rules exist by now (the rule modules land over time)."""
    out = []
    for step in schedule:
        if step["rule"] not in RULES:
            break
        out.append(step)
    return out


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    f = tmp_path / "gemm.yaml"
    f.write_text(gemm_yaml([]))
    return f


def build(spec: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(["build", str(spec), "-o", str(out), "--no-codegen", *extra])


def test_build_empty_schedule(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    rc, stdout, stderr = build(spec, out, "--seed", "3")
    assert rc == 0, stderr
    assert stderr == ""
    assert sorted(p.name for p in out.iterdir()) == ["derivation.json", "program.txt", "report.md", "steps"]
    assert [p.name for p in (out / "steps").iterdir()] == ["00_spec.txt"]
    trace = json.loads((out / "derivation.json").read_text())
    assert trace["steps"] == [] and trace["spec"]["name"] == "gemm"
    assert trace["final_digest"] == trace["spec_digest"]
    assert (out / "program.txt").read_text() == (out / "steps" / "00_spec.txt").read_text()
    assert "# derivc: gemm" in (out / "report.md").read_text()
    assert "wrote" in stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemm.yaml", "out"]


def test_build_with_rules(tmp_path: Path):
    steps = existing(TILED)
    if not steps:
        pytest.skip("tile rule not written yet")
    f = tmp_path / "gemm.yaml"
    f.write_text(gemm_yaml(steps))
    out = tmp_path / "out"
    rc, _, stderr = build(f, out)
    assert rc == 0, stderr
    names = sorted(p.name for p in (out / "steps").iterdir())
    assert names == ["00_spec.txt"] + [f"{k:02d}_{s['rule']}.txt" for k, s in enumerate(steps, 1)]
    trace = json.loads((out / "derivation.json").read_text())
    assert [s["rule"] for s in trace["steps"]] == [s["rule"] for s in steps]
    for s in trace["steps"]:
        assert s["numeric"]["passed"] and s["numeric"]["rel_error"] <= 1e-12
        assert s["theorem"] and s["before_hash"] != s["after_hash"]
    sizes = trace["check_sizes"]
    assert sizes["M"] % 4 and sizes["K"] % 4, sizes  # partial last tiles are exercised
    report = (out / "report.md").read_text()
    assert "## Step 1: tile (TILE)" in report and "numeric check: passed" in report


def test_build_with_test_rules(spec: Path, tmp_path: Path, test_rules):
    spec.write_text(gemm_yaml([{"rule": "test_identity"}, {"rule": "test_identity"}]))
    out = tmp_path / "out"
    rc, _, stderr = build(spec, out, "--seed", "10")
    assert rc == 0, stderr
    trace = json.loads((out / "derivation.json").read_text())
    assert [s["numeric"]["seed"] for s in trace["steps"]] == [11, 12]
    assert trace["steps"][0]["facts"]["loops"] == ["i", "j"]  # tuples become lists
    assert isinstance(trace["steps"][0]["facts"]["body"], str)  # IR nodes are printed
    assert "site" not in trace["steps"][0]["facts"]  # internal facts stay out of the trace
    assert (out / "steps" / "02_test_identity.txt").exists()


def test_same_seed_same_trace(spec: Path, tmp_path: Path, test_rules):
    spec.write_text(gemm_yaml([{"rule": "test_identity"}]))
    a, b = tmp_path / "a", tmp_path / "b"
    assert build(spec, a, "--seed", "5")[0] == 0 and build(spec, b, "--seed", "5")[0] == 0
    assert (a / "derivation.json").read_text() == (b / "derivation.json").read_text()
    assert (a / "report.md").read_text() == (b / "report.md").read_text()


def test_failed_build_leaves_nothing(tmp_path: Path, test_rules):
    f = tmp_path / "bad.yaml"
    f.write_text(gemm_yaml([{"rule": "test_identity"}, {"rule": "test_corrupt"}]))
    out = tmp_path / "deep" / "er" / "out"
    rc, _, stderr = build(f, out)
    assert rc == 3
    assert stderr.count("\n") == 1 and "bad.yaml" in stderr and "step 2" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_failed_build_keeps_existing_dir(tmp_path: Path, test_rules):
    out = tmp_path / "out"
    out.mkdir()
    (out / "marker").write_text("old")
    f = tmp_path / "bad.yaml"
    f.write_text(gemm_yaml([{"rule": "test_refuse"}]))
    assert build(f, out)[0] == 3
    assert [p.name for p in out.iterdir()] == ["marker"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "out"]


def test_successful_build_replaces_existing_dir(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "marker").write_text("old")
    assert build(spec, out)[0] == 0
    assert not (out / "marker").exists() and (out / "derivation.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemm.yaml", "out"]


def test_output_is_a_file(spec: Path, tmp_path: Path):
    out = tmp_path / "file"
    out.write_text("x")
    rc, _, stderr = build(spec, out)
    assert rc == 2 and "not a directory" in stderr and out.read_text() == "x"


def test_missing_spec_file(tmp_path: Path):
    rc, _, stderr = build(tmp_path / "nope.yaml", tmp_path / "out")
    assert rc == 2 and "nope.yaml" in stderr and "cannot read" in stderr
    assert list(tmp_path.iterdir()) == []


def test_codegen_hook_failure_is_exit_3(spec: Path, tmp_path: Path, monkeypatch):
    def emit(derivation, outdir):
        (Path(outdir) / "kernel.cu").write_text("// partial")
        raise RuntimeError("nvrtc: error: expected a ';'")

    monkeypatch.setitem(sys.modules, "codegen.build", types.SimpleNamespace(emit=emit))
    out = tmp_path / "out"
    rc, _, stderr = run_cli(["build", str(spec), "-o", str(out)])
    assert rc == 3 and "codegen" in stderr and "expected a ';'" in stderr and "gemm.yaml" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemm.yaml"]


def test_codegen_and_obligation_hooks_write_into_build(spec: Path, tmp_path: Path, monkeypatch):
    seen = {}

    def emit(derivation, outdir):
        seen["codegen"] = derivation.final.digest()
        (Path(outdir) / "kernel.cu").write_text("// kernel")

    def write_obligations(derivation, proofs):
        proofs.mkdir()
        (proofs / "Step00.v").write_text("(* nothing *)")

    monkeypatch.setitem(sys.modules, "codegen.build", types.SimpleNamespace(emit=emit))
    monkeypatch.setitem(sys.modules, "compiler.obligations", types.SimpleNamespace(write_obligations=write_obligations))
    out = tmp_path / "out"
    assert run_cli(["build", str(spec), "-o", str(out)])[0] == 0
    assert (out / "kernel.cu").exists() and (out / "proofs" / "Step00.v").exists() and seen
    # --no-codegen skips the kernel, not the proofs
    out2 = tmp_path / "out2"
    assert build(spec, out2)[0] == 0
    assert not (out2 / "kernel.cu").exists() and (out2 / "proofs").is_dir()


def test_explain_prints_steps(spec: Path, test_rules):
    spec.write_text(gemm_yaml([{"rule": "test_identity"}] + existing(TILED)[:1]))
    rc, stdout, stderr = run_cli(["--plain", "explain", str(spec), "--seed", "1"])
    assert rc == 0, stderr
    assert "step 1: test_identity (TEST)" in stdout and "theorem:    test_refl" in stdout
    assert "rel. error" in stdout and "C[i, j] = sum(k < K: A[i, k] * B[k, j])" in stdout
    rc, stdout, _ = run_cli(["explain", str(spec)])  # rich (no terminal: plain characters)
    assert rc == 0 and "test_identity" in stdout


def test_explain_failure_is_one_line(spec: Path, test_rules):
    spec.write_text(gemm_yaml([{"rule": "test_corrupt"}]))
    rc, _, stderr = run_cli(["explain", str(spec)])
    assert rc == 3 and stderr.startswith("derivc: error: ") and stderr.count("\n") == 1


@pytest.mark.parametrize(
    "argv, module",
    [
        (["verify", "d"], "compiler.verify"),
        (["replay", "d", "--step", "2"], "compiler.replay_cmd"),
    ],
)
def test_reserved_subcommands_dispatch(argv, module, monkeypatch):
    got = {}

    def main(args):
        got["args"] = args
        return 0

    monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(main=main))
    rc, _, _ = run_cli(argv + ["--extra-flag"])
    assert rc == 0 and got["args"].command == argv[0] and got["args"].extra == ["--extra-flag"]


@pytest.mark.parametrize(
    "argv, module",
    [(["run", "f.yaml", "--check", "--sizes", "M=5"], "codegen.run_cmd"), (["bench", "--quick"], "codegen.bench")],
)
def test_gpu_subcommands_dispatch(argv, module, monkeypatch):
    got = {}
    monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(main=lambda args: got.setdefault("args", args) and 0))
    rc, _, _ = run_cli(argv)
    assert rc == 0 and got["args"].command == argv[0]
    rc, _, stderr = run_cli(argv + ["--extra-flag"])
    assert rc == 2 and "unrecognized" in stderr


def test_reserved_subcommand_not_available(monkeypatch):
    monkeypatch.setitem(sys.modules, "codegen.bench", None)  # import fails like a missing module
    rc, _, stderr = run_cli(["bench"])
    assert rc == 1 and "not available yet" in stderr


def test_usage_errors_are_one_line():
    rc, _, stderr = run_cli(["frobnicate"])
    assert rc == 2 and stderr.count("\n") == 1 and stderr.startswith("derivc: error: ")
    rc, _, stderr = run_cli(["build", "x.yaml"])  # -o missing
    assert rc == 2 and stderr.count("\n") == 1


def test_console_entry_point_runs():
    r = subprocess.run(
        [sys.executable, "-m", "compiler.cli", "--version"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "derivc 0.1.0" in r.stdout


EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.mark.skipif(not EXAMPLES, reason="no examples yet")
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_examples_build(example: Path, tmp_path: Path):
    out = tmp_path / "out"
    rc, _, stderr = build(example, out, "--seed", "0")
    assert rc == 0, stderr
    trace = json.loads((out / "derivation.json").read_text())
    assert all(s["numeric"]["passed"] for s in trace["steps"])
    assert len(list((out / "steps").iterdir())) == len(trace["steps"]) + 1
