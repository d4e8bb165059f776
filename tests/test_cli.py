"""`derivc build` / `explain` and the reserved subcommands, through compiler.cli.main."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from derivc_testing import NO_KERNEL, ROOT, gemm_yaml, run_cli

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
    assert sorted(p.name for p in out.iterdir()) == [".derivc-build", "derivation.json", "program.txt", "report.md", "steps"]
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


def test_failed_build_keeps_existing_dir(spec: Path, tmp_path: Path, test_rules):
    out = tmp_path / "out"
    assert build(spec, out)[0] == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    f = tmp_path / "bad.yaml"
    f.write_text(gemm_yaml([{"rule": "test_refuse"}]))
    assert build(f, out)[0] == 3
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "gemm.yaml", "out"]


def test_successful_build_replaces_previous_build(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    assert build(spec, out, "--seed", "1")[0] == 0
    assert build(spec, out, "--seed", "2")[0] == 0
    assert '"seed": 2' in (out / "derivation.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemm.yaml", "out"]


def test_build_refuses_a_directory_it_did_not_write(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "marker").write_text("old")
    rc, _, stderr = build(spec, out)
    assert rc == 2 and str(out) in stderr and "not a derivc build" in stderr
    assert [p.name for p in out.iterdir()] == ["marker"] and (out / "marker").read_text() == "old"


def test_output_is_a_file(spec: Path, tmp_path: Path):
    out = tmp_path / "file"
    out.write_text("x")
    rc, _, stderr = build(spec, out)
    assert rc == 2 and "not a directory" in stderr and out.read_text() == "x"


def test_missing_spec_file(tmp_path: Path):
    rc, _, stderr = build(tmp_path / "nope.yaml", tmp_path / "out")
    assert rc == 2 and "nope.yaml" in stderr and "cannot read" in stderr
    assert list(tmp_path.iterdir()) == []


def _no_lowering(derivation):
    return None, {}


def _fake_codegen(emit) -> types.SimpleNamespace:
    """codegen.build with every stage before emit a no-op."""
    return types.SimpleNamespace(prepare=_no_lowering, print_checked=lambda kernel: None,
                                 check_text=lambda derivation, printed: None, emit=emit)


def test_codegen_hook_failure_is_exit_3(spec: Path, tmp_path: Path, monkeypatch):
    def emit(derivation, outdir, kernel=None, printed=None):
        (Path(outdir) / "kernel.cu").write_text("// partial")
        raise RuntimeError("nvrtc: error: expected a ';'")

    monkeypatch.setitem(sys.modules, "codegen.build", _fake_codegen(emit))
    out = tmp_path / "out"
    rc, _, stderr = run_cli(["build", str(spec), "-o", str(out)])
    assert rc == 3 and "codegen" in stderr and "expected a ';'" in stderr and "gemm.yaml" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemm.yaml", "out.failed"]
    assert (tmp_path / "out.failed" / "kernel.cu").read_text() == "// partial"


def test_codegen_and_obligation_hooks_write_into_build(spec: Path, tmp_path: Path, monkeypatch):
    seen = {}

    def emit(derivation, outdir, kernel=None, printed=None):
        seen["codegen"] = derivation.final.digest()
        (Path(outdir) / "kernel.cu").write_text("// kernel")

    def write_obligations(derivation, proofs):
        proofs.mkdir()
        (proofs / "Step00_NONE.v").write_text("(* nothing *)")
        (proofs / "index.json").write_text('{"steps": [{"step": 0, "rule": "none", "files": {"coq": "Step00_NONE.v"}}]}')

    monkeypatch.setitem(sys.modules, "codegen.build", _fake_codegen(emit))
    monkeypatch.setitem(sys.modules, "compiler.obligations", types.SimpleNamespace(write_obligations=write_obligations))
    out = tmp_path / "out"
    assert run_cli(["build", str(spec), "-o", str(out)], proofs=True)[0] == 0
    assert (out / "kernel.cu").exists() and (out / "proofs" / "Step00_NONE.v").exists() and seen
    # --no-codegen skips the kernel, not the proofs
    out2 = tmp_path / "out2"
    assert run_cli(["build", str(spec), "-o", str(out2), "--no-codegen"], proofs=True)[0] == 0
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
def test_reserved_subcommands_dispatch(argv, module, monkeypatch, tmp_path):
    got = {}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()  # verify judges its directory before dispatching

    def main(args):
        got["args"] = args
        return 0

    monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(main=main))
    monkeypatch.setattr("compiler.cli.coqc_missing", lambda: None)
    rc, _, _ = run_cli(argv + ["--extra-flag"])
    assert rc == 0 and got["args"].command == argv[0] and got["args"].extra == ["--extra-flag"]


@pytest.mark.parametrize(
    "argv, module",
    [(["run", "f.yaml", "--check", "--sizes", "M=5"], "codegen.run_cmd"), (["bench", "--quick"], "codegen.bench")],
)
def test_gpu_subcommands_dispatch(argv, module, monkeypatch):
    got = {}
    monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(main=lambda args: got.setdefault("args", args) and 0))
    monkeypatch.setattr("compiler.cli.gpu_missing", lambda *modules: None)
    rc, _, _ = run_cli(argv)
    assert rc == 0 and got["args"].command == argv[0]
    rc, _, stderr = run_cli(argv + ["--extra-flag"])
    assert rc == 2 and "unrecognized" in stderr


def test_reserved_subcommand_not_available(monkeypatch):
    monkeypatch.setitem(sys.modules, "codegen.bench", None)  # import fails like a missing module
    monkeypatch.setattr("compiler.cli.gpu_missing", lambda *modules: None)
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
def test_examples_build(example: Path, example_build):
    """`derivc build` succeeds on every example (the run's shared build: seed 0, no proofs, with
    its kernel unless the example has none) and every step passed its numeric check."""
    b = example_build(example, codegen=example.stem not in NO_KERNEL)
    assert b.rc == 0, b.stderr
    trace = json.loads((b.out / "derivation.json").read_text())
    assert all(s["numeric"]["passed"] for s in trace["steps"])
    rule_steps = [s for s in trace["steps"] if s["rule"] not in ("lowering", "kernel")]  # codegen's, no file
    assert len(list((b.out / "steps").iterdir())) == len(rule_steps) + 1


# --------------------------------------------------------------------------- README's exit-code table, row by row


def test_exit_0_success(spec: Path, tmp_path: Path):
    assert build(spec, tmp_path / "out")[0] == 0


def test_exit_1_internal_error(spec: Path, tmp_path: Path, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("compiler.derive.derive", broken)
    rc, _, stderr = build(spec, tmp_path / "out")
    assert rc == 1 and stderr.count("\n") == 1 and "internal error" in stderr and "ZeroDivisionError" in stderr


def test_exit_1_verify_without_coqc_is_not_a_mismatch(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None)
    rc, stdout, stderr = run_cli(["verify", str(tmp_path)])
    assert rc == 1 and stderr.count("\n") == 1 and "coqc not found" in stderr and "not available" in stderr
    assert "mismatch" not in stderr.lower() and stdout == ""


@pytest.mark.parametrize("argv", [["run", "missing.yaml", "--check"], ["bench", "--quick"]])
def test_exit_1_gpu_commands_without_cupy_say_so_before_building(argv, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` fails
    built = []
    monkeypatch.setattr("compiler.cli.build_to", lambda *a, **k: built.append(a))
    rc, stdout, stderr = run_cli(argv)
    assert rc == 1 and stderr.count("\n") == 1 and "no GPU" in stderr and "CuPy" in stderr
    assert "internal error" not in stderr and "missing.yaml" not in stderr and not built and stdout == ""


def test_exit_1_gpu_commands_without_a_device(monkeypatch):
    class NoDevice:
        @staticmethod
        def getDeviceCount():
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=NoDevice))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    rc, _, stderr = run_cli(["run", "examples/gemm.yaml"])
    assert rc == 1 and stderr.count("\n") == 1 and "no GPU" in stderr and "no CUDA-capable device" in stderr


def test_exit_2_invalid_input_and_usage(tmp_path: Path):
    f = tmp_path / "g.yaml"
    f.write_text(gemm_yaml([{"rule": "tile", "def": "Nope", "index": "i", "size": 4}]))
    rc, _, stderr = build(f, tmp_path / "out")
    assert rc == 2 and "no definition named 'Nope'" in stderr
    assert run_cli(["build"])[0] == 2


def test_exit_3_derivation_failed(tmp_path: Path):
    f = tmp_path / "g.yaml"
    f.write_text(gemm_yaml([{"rule": "tile", "def": "C", "index": "i", "size": 16, "guard": False}]))
    assert build(f, tmp_path / "out")[0] == 3


@pytest.mark.skipif(shutil.which("coqc") is None, reason="needs coqc")
def test_exit_4_verify_mismatch(tmp_path: Path):
    f = tmp_path / "g.yaml"
    f.write_text(gemm_yaml([{"rule": "tile", "def": "C", "index": "i", "size": 4}]))
    out = tmp_path / "out"
    assert build(out=out, spec=f)[0] == 0
    (out / "program.txt").write_text("tampered\n")
    rc, _, stderr = run_cli(["verify", str(out)])
    assert rc == 4, stderr


def test_readme_exit_table_matches_the_code():
    from compiler import errors
    from compiler.cli import EXIT_INTERNAL, EXIT_UNAVAILABLE

    table = (ROOT / "README.md").read_text().split("| exit | meaning |", 1)[1].split("\n\n", 1)[0]
    rows = {int(code) for r in table.splitlines()[2:] if r.startswith("|") for code in r.split("|")[1].split(",")}
    assert {errors.EXIT_OK, EXIT_INTERNAL, EXIT_UNAVAILABLE, errors.EXIT_INVALID_INPUT,
            errors.EXIT_DERIVATION_FAILED, errors.EXIT_VERIFY_FAILED, 130} <= rows


# --------------------------------------------------------------------------- example comments match their schedules

_COUNT = {"single": 1, "one": 1, "double": 2, "two": 2, "three": 3, "four": 4}


def _n(word: str) -> int:
    return int(word) if word.isdigit() else _COUNT[word.lower()]


def comment_problems(text: str) -> list[str]:
    """Claims in an example's description and step comments that its schedule contradicts."""
    import re

    import yaml as _yaml

    doc = _yaml.safe_load(text)
    steps = doc.get("schedule") or []
    default = {k: v[0] for k, v in (doc.get("variants") or {}).items()}  # comments describe the default
    steps = [{k: default.get(v[1:], v) if isinstance(v, str) and v.startswith("$") else v for k, v in st.items()}
             for st in steps]
    out: list[str] = []
    groups: list[tuple[str, list[dict]]] = []
    k = 0
    for line in text.split("schedule:", 1)[1].splitlines():
        s = line.strip()
        if s.startswith("#"):
            groups.append((s, []))
        elif s.startswith("- {") and k < len(steps):
            if groups:
                groups[-1][1].append(steps[k])
            k += 1
    for comment, group in groups:
        tiles = [st["size"] for st in group if st["rule"] == "tile"]
        warps = [st["count"] for st in group if st["rule"] == "parallel" and st["to"] == "warp"]
        stages = {st.get("stages", 1) for st in group if st["rule"] == "cache" and st.get("at")}
        if m := re.search(r"tiles of (\d+) x (\d+)", comment):
            if tiles[:2] != [int(m[1]), int(m[2])]:
                out.append(f"{comment!r}: tiles are {tiles[:2]}")
        if m := re.search(r"steps of (\d+)", comment):
            if tiles[:1] != [int(m[1])]:
                out.append(f"{comment!r}: the step is {tiles[:1]}")
        if m := re.search(r"\b(\w+) stages\b|\b(\w+)-buffered", comment):
            if stages != {_n(m[1] or m[2])}:
                out.append(f"{comment!r}: stages are {sorted(stages)}")
        if m := re.search(r"over (\d+) x (\d+) warps", comment):
            if warps != [int(m[1]), int(m[2])]:
                out.append(f"{comment!r}: warp counts are {warps}")
    desc = doc.get("description", "")
    dtype = {"f16": "fp16", "bf16": "bf16", "f32": "fp32", "f64": "fp64"}[next(iter(doc["inputs"].values()))["dtype"]]
    for m in re.finditer(r"\b(fp16|bf16|fp32|fp64)\b(?! accumulat)", desc):
        if m[1] != dtype:
            out.append(f"description says {m[1]}, the inputs are {dtype}")
    all_stages = {st.get("stages", 1) for st in steps if st["rule"] == "cache" and st.get("at")}
    for m in re.finditer(r"(\d+)-stage", desc):
        if all_stages != {int(m[1])}:
            out.append(f"description says {m[0]}, stages are {sorted(all_stages)}")
    counts = [st["count"] for st in steps if st["rule"] == "parallel" and st["to"] == "warp"]
    for m in re.finditer(r"over (\d+) warps", desc):
        total = 1
        for c in counts:
            total *= c
        if total != int(m[1]):
            out.append(f"description says {m[0]}, the schedule has {total} warps")
    for m in re.finditer(r"(\d+)x(\d+) warps", desc):
        if counts != [int(m[1]), int(m[2])]:
            out.append(f"description says {m[0]}, warp counts are {counts}")
    out_def = doc["output"]["tensor"]
    first = {}
    for st in steps:
        if st["rule"] == "tile" and st["def"] == out_def:
            first.setdefault(st["index"], st["size"])
    for m in re.finditer(r"\b(\d+)x(\d+)(?:x(\d+))? tiles", desc):
        want = [int(x) for x in m.groups() if x]
        got = [first.get(i) for i in ("i", "j", "k")[: len(want)]]
        if got != want:
            out.append(f"description says {m[0]}, tiles of i, j, k are {got}")
    for m in re.finditer(r"(\d+)-row query tiles", desc):
        if first.get("i") != int(m[1]):
            out.append(f"description says {m[0]}, query tiles are {first.get('i')}")
    mma = any(st["rule"] == "map_mma" for st in steps)
    if "tensor cores" in desc and "no MAP-MMA" not in desc and not mma:
        out.append("description promises tensor cores, no map_mma step")
    if "no MAP-MMA" in desc and mma:
        out.append("description says no MAP-MMA, the schedule maps to tensor cores")
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_comments_match_the_schedule(example: Path):
    assert comment_problems(example.read_text()) == []


def test_comment_checker_catches_the_old_simt_comments():
    old = (ROOT / "examples" / "gemm_f32_simt.yaml").read_text()
    old = old.replace("C = A·B in fp32,", "C = A·B in fp16 with fp32 accumulation,").replace(
        "# D2: k in steps of 16", "# D2: k in steps of 32").replace("two stages deep", "three stages deep")
    problems = comment_problems(old)
    assert len(problems) == 3 and any("fp16" in p for p in problems), problems
