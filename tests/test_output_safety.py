"""derivc never deletes or overwrites a file it did not write (issue 10, item 1; item 2's
DIR.failed).  `derivc build FILE -o DIR` replaces DIR only when it is empty or a previous
derivc build holding nothing but what derivc wrote; the replacement is one atomic exchange;
SIGTERM / SIGINT leave DIR as it was and no temporary directory behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from derivc_testing import ROOT, gemm_yaml, run_cli

from compiler import outdir as outdir_mod

SIMT = [{"rule": "tile", "def": "C", "index": "i", "size": 16}, {"rule": "tile", "def": "C", "index": "j", "size": 16},
        {"rule": "reorder", "def": "C", "outer": "ii", "inner": "jo"},
        {"rule": "parallel", "def": "C", "index": "io", "to": "grid.y"},
        {"rule": "parallel", "def": "C", "index": "jo", "to": "grid.x"}]


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    f = tmp_path / "gemm.yaml"
    f.write_text(gemm_yaml([]))
    return f


def build(spec: Path, out: Path | str, *extra: str) -> tuple[int, str, str]:
    return run_cli(["build", str(spec), "-o", str(out), "--no-codegen", "--no-proofs", *extra])


def snapshot(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


# --------------------------------------------------------------------------- refusing


def test_dot_in_a_project_folder_is_refused(tmp_path: Path, monkeypatch):
    """`derivc build myspec.yaml -o .` used to delete main.py and the spec itself."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text("print('mine')\n")
    (project / "myspec.yaml").write_text(gemm_yaml([]))
    before = snapshot(project)
    monkeypatch.chdir(project)
    rc, _, stderr = build(Path("myspec.yaml"), ".")
    assert rc == 2 and stderr.count("\n") == 1 and str(project) in stderr
    assert snapshot(project) == before and leftovers(tmp_path) == [] and leftovers(project) == []


def test_current_directory_is_refused_even_when_empty(spec: Path, tmp_path: Path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    rc, _, stderr = build(spec, ".")
    assert rc == 2 and "current directory" in stderr and list(here.iterdir()) == []


def test_folder_with_user_files_is_refused(spec: Path, tmp_path: Path):
    out = tmp_path / "results"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "data.csv").write_text("1,2\n")
    rc, _, stderr = build(spec, out)
    assert rc == 2 and f"{out}: exists and is not a derivc build" in stderr
    assert snapshot(out) == {"sub/data.csv": b"1,2\n"} and leftovers(tmp_path) == []


def test_file_added_to_a_previous_build_is_not_deleted(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    assert build(spec, out)[0] == 0
    (out / "notes.md").write_text("my notes")
    before = snapshot(out)
    rc, _, stderr = build(spec, out)
    assert rc == 2 and "holds notes.md" in stderr and "did not write" in stderr
    assert snapshot(out) == before


@pytest.mark.parametrize("folder", ["mine", "steps/mine", "mine/deeper"])
def test_empty_folder_added_to_a_previous_build_is_not_deleted(spec: Path, tmp_path: Path, folder: str):
    """Issue 20: folders count like files; an empty one the user made is theirs too."""
    out = tmp_path / "out"
    assert build(spec, out)[0] == 0
    (out / folder).mkdir(parents=True)
    before = snapshot(out)
    rc, _, stderr = build(spec, out)
    assert rc == 2 and stderr.count("\n") == 1 and f"holds {folder.split('/deeper')[0]}/" in stderr
    assert (out / folder).is_dir() and snapshot(out) == before and leftovers(tmp_path) == []


def test_folders_in_the_marker(tmp_path: Path):
    """Folders holding a recorded file are implied (the marker reads as before folders were
    recorded); an empty folder derivc made is listed, one made later is not derivc's."""
    d = tmp_path / "d"
    (d / "steps").mkdir(parents=True)
    (d / "steps" / "00_spec.txt").write_text("x")
    (d / "kernels" / "none").mkdir(parents=True)
    outdir_mod.write_marker(d)
    marker = json.loads((d / ".derivc-build").read_text())
    assert marker["dirs"] == ["kernels", "kernels/none"] and outdir_mod.foreign_files(d) == []
    (d / "kernels" / "none").rmdir()
    (d / "kernels").rmdir()
    outdir_mod.write_marker(d)
    assert "dirs" not in json.loads((d / ".derivc-build").read_text())
    (d / "steps" / "mine").mkdir()
    assert outdir_mod.foreign_files(d) == ["steps/mine/"]


def test_edited_file_of_a_previous_build_is_not_overwritten(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    assert build(spec, out)[0] == 0
    (out / "report.md").write_text("edited by hand")
    rc, _, stderr = build(spec, out)
    assert rc == 2 and "report.md" in stderr and (out / "report.md").read_text() == "edited by hand"


def test_forged_or_broken_marker_is_not_trusted(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("x")
    (out / ".derivc-build").write_text("not json")
    assert build(spec, out)[0] == 2
    (out / ".derivc-build").write_text(json.dumps({"files": {}}))
    assert build(spec, out)[0] == 2 and (out / "precious.txt").read_text() == "x"


def test_symlink_is_refused(spec: Path, tmp_path: Path):
    real = tmp_path / "real"
    assert build(spec, real)[0] == 0
    link = tmp_path / "link"
    link.symlink_to(real)
    rc, _, stderr = build(spec, link)
    assert rc == 2 and "symbolic link" in stderr and link.is_symlink()


def test_refused_before_deriving(spec: Path, tmp_path: Path, test_rules):
    """A refused DIR is reported first (exit 2), not after minutes of numeric checks."""
    spec.write_text(gemm_yaml([{"rule": "test_corrupt"}]))  # would fail with exit 3
    out = tmp_path / "out"
    out.mkdir()
    (out / "x").write_text("x")
    assert build(spec, out)[0] == 2


# --------------------------------------------------------------------------- replacing


def test_empty_directory_is_used(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    assert build(spec, out)[0] == 0 and (out / "derivation.json").exists()


def test_marker_lists_what_derivc_wrote(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    assert build(spec, out)[0] == 0
    marker = json.loads((out / ".derivc-build").read_text())
    assert marker["kind"] == "build" and set(marker["files"]) == set(snapshot(out)) - {".derivc-build"}


def test_previous_build_with_verify_report_is_replaced(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    assert build(spec, out, "--seed", "1")[0] == 0
    (out / "proofs").mkdir(exist_ok=True)
    (out / "proofs" / "verify.json").write_text("{}")  # what `derivc verify` adds
    assert build(spec, out, "--seed", "2")[0] == 0
    assert json.loads((out / "derivation.json").read_text())["seed"] == 2
    assert leftovers(tmp_path) == []


def test_replacement_is_one_atomic_exchange(spec: Path, tmp_path: Path, monkeypatch):
    out = tmp_path / "out"
    assert build(spec, out, "--seed", "1")[0] == 0
    old = snapshot(out)
    seen = []
    real = outdir_mod._exchange

    def spy(a: Path, b: Path) -> bool:
        assert b == out and snapshot(out) == old  # DIR is the whole old build up to the exchange
        ok = real(a, b)
        seen.append(ok)
        assert snapshot(out) != old and (out / ".derivc-build").exists()  # and the whole new one after
        return ok

    monkeypatch.setattr(outdir_mod, "_exchange", spy)
    assert build(spec, out, "--seed", "2")[0] == 0
    assert seen == [True] and leftovers(tmp_path) == []


def test_replacement_without_renameat2(spec: Path, tmp_path: Path, monkeypatch):
    out = tmp_path / "out"
    assert build(spec, out, "--seed", "1")[0] == 0
    monkeypatch.setattr(outdir_mod, "_exchange", lambda a, b: False)
    assert build(spec, out, "--seed", "2")[0] == 0
    assert json.loads((out / "derivation.json").read_text())["seed"] == 2 and leftovers(tmp_path) == []


def test_failure_while_writing_leaves_previous_build(spec: Path, tmp_path: Path, monkeypatch):
    out = tmp_path / "out"
    assert build(spec, out)[0] == 0
    before = snapshot(out)

    def broken(d, outdir, **kw):
        (outdir / "derivation.json").write_text("partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("compiler.cli.write_outputs", broken)
    rc, _, stderr = build(spec, out)
    assert rc == 1 and "No space left" in stderr
    assert snapshot(out) == before and leftovers(tmp_path) == []


# --------------------------------------------------------------------------- signals

DRIVER = """
import sys, time
sys.path.insert(0, {root!r})
import compiler.cli as cli
real = cli.write_outputs
def slow(d, outdir, **kw):
    real(d, outdir, **kw)
    (outdir / "HALFWAY").write_text("x")
    time.sleep(60)
cli.write_outputs = slow
sys.exit(cli.main(["build", {spec!r}, "-o", {out!r}, "--no-codegen", "--no-proofs", "--seed", "5"]))
"""


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_mid_build_leaves_dir_and_no_temp(spec: Path, tmp_path: Path, signum, code):
    out = tmp_path / "out"
    assert build(spec, out, "--seed", "1")[0] == 0
    before = snapshot(out)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER.format(root=str(ROOT), spec=str(spec), out=str(out))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(tmp_path.glob(".out.tmp-*/HALFWAY")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the build never reached its temporary directory"
            time.sleep(0.05)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("derivc: error: ")
    assert snapshot(out) == before and leftovers(tmp_path) == []


def test_sigterm_at_any_moment_of_a_real_build(tmp_path: Path):
    """A real build killed after a moment: whatever it was doing, DIR is the old or the new build."""
    spec = tmp_path / "gemm.yaml"
    spec.write_text(gemm_yaml(SIMT))
    out = tmp_path / "out"
    assert build(spec, out, "--seed", "1")[0] == 0
    before = snapshot(out)
    for delay in (0.3, 1.5, 3.0):
        proc = subprocess.Popen([sys.executable, "-m", "compiler.cli", "build", str(spec), "-o", str(out), "--seed", "2"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode in (0, 143, -signal.SIGTERM), stderr
        after = snapshot(out)
        assert leftovers(tmp_path) == []
        if after != before:  # the signal came after the swap: the whole new build is in place
            assert json.loads(after["derivation.json"])["seed"] == 2 and outdir_mod.foreign_files(out) == []
            return
        assert proc.returncode != 0


# --------------------------------------------------------------------------- DIR.failed (item 2)


def _nvrtc_fails(monkeypatch):
    import codegen.cuda.nvrtc as nvrtc

    log = 'kernel.cu(12): error: identifier "tile_x" is undefined\nkernel.cu(14): error: expected a ";"\n2 errors detected\n'

    def compile_cubin(*args, **kwargs):
        raise nvrtc.CompileError("NVRTC failed to compile kernel", log=log)

    monkeypatch.setattr(nvrtc, "compile_cubin", compile_cubin)
    monkeypatch.setattr(nvrtc, "nvrtc_available", lambda: True)
    return log


def test_nvrtc_failure_keeps_source_and_log_beside_dir(tmp_path: Path, monkeypatch):
    spec = tmp_path / "gemm.yaml"
    spec.write_text(gemm_yaml(SIMT))
    out = tmp_path / "out"
    assert build(spec, out, "--seed", "1")[0] == 0
    before = snapshot(out)
    log = _nvrtc_fails(monkeypatch)
    rc, _, stderr = run_cli(["build", str(spec), "-o", str(out), "--no-proofs"])
    assert rc == 3 and stderr.count("\n") == 1
    assert 'identifier "tile_x" is undefined' in stderr and 'expected a ";"' in stderr  # the first errors
    assert f"kernel.cu and compile.log kept in {out}.failed" in stderr
    failed = tmp_path / "out.failed"
    assert sorted(p.name for p in failed.iterdir()) == [".derivc-failed", "compile.log", "kernel.cu"]
    assert (failed / "compile.log").read_text() == log and "__global__" in (failed / "kernel.cu").read_text()
    assert snapshot(out) == before and leftovers(tmp_path) == []
    # a second failure replaces derivc's own DIR.failed
    assert run_cli(["build", str(spec), "-o", str(out), "--no-proofs"])[0] == 3
    assert (failed / "compile.log").read_text() == log and leftovers(tmp_path) == []


def test_nvrtc_failure_never_touches_a_foreign_dir_failed(tmp_path: Path, monkeypatch):
    spec = tmp_path / "gemm.yaml"
    spec.write_text(gemm_yaml(SIMT))
    out = tmp_path / "out"
    failed = tmp_path / "out.failed"
    failed.mkdir()
    (failed / "kernel.cu").write_text("// mine")
    _nvrtc_fails(monkeypatch)
    rc, _, stderr = run_cli(["build", str(spec), "-o", str(out), "--no-proofs"])
    assert rc == 3 and "not kept" in stderr and "derivc did not write it" in stderr
    assert snapshot(failed) == {"kernel.cu": b"// mine"} and not out.exists() and leftovers(tmp_path) == []


def test_build_without_kernel_is_exit_3_and_no_codegen_is_0(tmp_path: Path):
    """No silent partial success: an untiled GEMM has no kernel (no grid mapping)."""
    spec = tmp_path / "gemm.yaml"
    spec.write_text(gemm_yaml([]))
    rc, stdout, stderr = run_cli(["build", str(spec), "-o", str(tmp_path / "out"), "--no-proofs"])
    assert rc == 3 and "codegen" in stderr and "wrote" not in stdout and not (tmp_path / "out").exists()
    rc, stdout, _ = run_cli(["build", str(spec), "-o", str(tmp_path / "out"), "--no-proofs", "--no-codegen"])
    assert rc == 0 and "wrote" in stdout


def test_codegen_error_from_emit_is_exit_3(tmp_path: Path, monkeypatch):
    """codegen.build.emit raising CodegenError (e.g. no kernel for the program) is exit 3 with its reason."""
    import codegen.build as cb

    def emit(d, outdir, kernel=None, printed=None):
        raise cb.CodegenError("the program has no kernel: naive attention is neither a contraction nor a fold")

    monkeypatch.setattr(cb, "emit", emit)
    spec = tmp_path / "gemm.yaml"
    spec.write_text(gemm_yaml(SIMT))
    rc, _, stderr = run_cli(["build", str(spec), "-o", str(tmp_path / "out"), "--no-proofs"])
    assert rc == 3 and "has no kernel" in stderr and not (tmp_path / "out").exists()
    assert not (tmp_path / "out.failed").exists()  # nothing to keep


def test_os_helpers_do_not_follow_links(tmp_path: Path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a").write_text("a")
    outdir_mod.write_marker(d)
    (d / "link").symlink_to(tmp_path)
    assert outdir_mod.foreign_files(d) == ["link"]
    os.unlink(d / "link")
    assert outdir_mod.foreign_files(d) == []


def test_marker_leaves_out_what_verify_writes_later(tmp_path: Path):
    """`build --verify` leaves proofs/verify.json in the build; the marker must equal the one a
    rebuild writes (derivc verify compares them), so it never lists that file."""
    d = tmp_path / "d"
    (d / "proofs").mkdir(parents=True)
    (d / "a").write_text("a")
    outdir_mod.write_marker(d)
    without = (d / ".derivc-build").read_text()
    (d / "proofs" / "verify.json").write_text("{}")
    outdir_mod.write_marker(d)
    assert (d / ".derivc-build").read_text() == without and outdir_mod.foreign_files(d) == []
