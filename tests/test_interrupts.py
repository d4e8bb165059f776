"""A build interrupted at any instant (issue 20): SIGINT exits 130, SIGTERM 143, with one line that
says whether DIR was left as it was or holds the new build; no `.DIR.tmp-*` is left; a second
signal never cuts the clean-up short; libnvrtc's own signal handlers never end the process.
Also: `derivc … | head` is quiet (broken pipe), and a build without NVRTC says so."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from derivc_testing import ROOT, gemm_yaml, run_cli, sweep_sample

from codegen.emu.compile import emu_cache_dir
from compiler import outdir as outdir_mod

EXAMPLE = ROOT / "examples" / "gemm_f32_simt.yaml"
SIMT = [{"rule": "tile", "def": "C", "index": "i", "size": 16}, {"rule": "tile", "def": "C", "index": "j", "size": 16},
        {"rule": "reorder", "def": "C", "outer": "ii", "inner": "jo"},
        {"rule": "parallel", "def": "C", "index": "io", "to": "grid.y"},
        {"rule": "parallel", "def": "C", "index": "jo", "to": "grid.x"}]


def snapshot(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def build_seed(out: Path) -> int:
    return json.loads((out / "derivation.json").read_text())["seed"]


# --------------------------------------------------------------------------- drivers
# A build in a subprocess, with one piece of the machinery replaced so that a signal lands
# exactly in the window under test, run as the console script runs (cli.entry).

PRELUDE = """
import ctypes, os, signal, sys, threading, time
sys.path.insert(0, {root!r})
import compiler.outdir as od
from compiler.cli import entry
"""
# a thread with SIGINT / SIGTERM not blocked, as any library may start: the kernel may hand it a
# signal that the main thread holds back, and Python then runs the handler in the main thread
OTHER_THREAD = """
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
"""
RUN = """
sys.argv = ["derivc", "build", {spec!r}, "-o", {out!r}, "--no-proofs", "--seed", "2", *{extra!r}]
entry()
"""

# libnvrtc installs handlers of its own during a compile (and a signal then ended the process
# with exit 4, no message); this stand-in installs _exit(signum) and does not even restore them.
# The build's other thread here is numpy's BLAS thread.
LIKE_LIBNVRTC = """
import codegen.cuda.nvrtc as nvrtc
libc = ctypes.CDLL(None)
libc.signal.restype = ctypes.c_void_p
libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
EXIT = ctypes.cast(libc._exit, ctypes.c_void_p).value

class LikeLibnvrtc:
    def version(self): return (99, 0)  # never a cache hit
    def supported_archs(self): return (90,)
    def compile(self, source, name, options):
        for s in (signal.SIGINT, signal.SIGTERM):
            libc.signal(s, EXIT)
        os.kill(os.getpid(), {signum})
        time.sleep(0.2)
        return True, b"", ""

nvrtc._backend = lambda: LikeLibnvrtc()
"""

# the signal comes while the new build is swapped in: while the old one is removed (after the
# exchange), or between the two renames (where renameat2 is not offered: DIR is briefly absent)
WHILE_REMOVING_OLD = OTHER_THREAD + """
real_rmtree, sent = od.shutil.rmtree, []
def rmtree(path, *a, **kw):
    if not sent:
        sent.append(os.kill(os.getpid(), signal.SIGTERM))
        time.sleep(0.2)
    real_rmtree(path, *a, **kw)
od.shutil.rmtree = rmtree
"""
BETWEEN_RENAMES = OTHER_THREAD + """
od._exchange = lambda a, b: False
real_replace, sent = od.os.replace, []
def replace(src, dst):
    real_replace(src, dst)
    if not sent and os.path.basename(dst).startswith(".out.old-"):
        sent.append(os.kill(os.getpid(), signal.SIGTERM))
        time.sleep(0.2)
od.os.replace = replace
"""

# a first SIGTERM while writing, a second one while the temporary directory is removed, or
# while the one-line message is printed
FIRST = OTHER_THREAD + """
import compiler.cli as cli
real_write = cli.write_outputs
def write_outputs(d, outdir, **kw):
    real_write(d, outdir, **kw)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
cli.write_outputs = write_outputs
"""
SECOND_WHILE_CLEANING = FIRST + """
real_rmtree = od.shutil.rmtree
def rmtree(path, *a, **kw):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    real_rmtree(path, *a, **kw)
od.shutil.rmtree = rmtree
"""
SECOND_WHILE_REPORTING = FIRST + """
real_error_line = cli.error_line
def error_line(message):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    real_error_line(message)
cli.error_line = error_line
"""


def drive(tmp_path: Path, setup: str, *, codegen: bool) -> tuple[Path, dict[str, bytes], subprocess.CompletedProcess]:
    spec = tmp_path / "gemm.yaml"
    spec.write_text(gemm_yaml(SIMT))
    out = tmp_path / "out"
    extra = [] if codegen else ["--no-codegen"]
    assert run_cli(["build", str(spec), "-o", str(out), "--no-proofs", "--seed", "1", *extra])[0] == 0
    before = snapshot(out)
    script = PRELUDE.format(root=str(ROOT)) + setup + RUN.format(spec=str(spec), out=str(out), extra=extra)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return out, before, proc


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_while_libnvrtc_has_its_handlers(tmp_path: Path, signum, code):
    out, before, proc = drive(tmp_path, LIKE_LIBNVRTC.format(signum=int(signum)), codegen=True)
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("derivc: error: ")
    assert f"{out} left as it was" in proc.stderr
    assert snapshot(out) == before and leftovers(tmp_path) == []


@pytest.mark.parametrize("setup", [WHILE_REMOVING_OLD, BETWEEN_RENAMES], ids=["exchange", "two-renames"])
def test_signal_during_the_swap_says_the_new_build_is_in_place(tmp_path: Path, setup: str):
    out, before, proc = drive(tmp_path, setup, codegen=False)
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"{out} holds the new build" in proc.stderr
    assert leftovers(tmp_path) == [] and build_seed(out) == 2 and outdir_mod.foreign_files(out) == []


@pytest.mark.parametrize("setup", [SECOND_WHILE_CLEANING, SECOND_WHILE_REPORTING], ids=["cleaning", "reporting"])
def test_second_sigterm_cuts_nothing_short(tmp_path: Path, setup: str):
    out, before, proc = drive(tmp_path, setup, codegen=False)
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"{out} left as it was" in proc.stderr
    assert snapshot(out) == before and leftovers(tmp_path) == []


# --------------------------------------------------------------------------- real builds, real NVRTC


@pytest.fixture
def fresh_nvrtc_env(tmp_path: Path) -> dict[str, str]:
    """A compile cache of its own (so NVRTC really runs), sharing the CPU emulation's objects."""
    cache = tmp_path / "cache"
    cache.mkdir()
    emu = emu_cache_dir()
    emu.mkdir(parents=True, exist_ok=True)
    (cache / "emu").symlink_to(emu)
    return {**os.environ, "DERIVC_CACHE_DIR": str(cache)}


def _build_cmd(out: Path, seed: int) -> list[str]:
    return [sys.executable, "-m", "compiler", "build", str(EXAMPLE), "-o", str(out), "--no-proofs", "--seed", str(seed)]


def sweep(tmp_path: Path, env: dict[str, str], shots: list[tuple[float, tuple[int, ...]]]) -> None:
    """Interrupt a real build at each (delay, signals) and check what it leaves behind."""
    out = tmp_path / "out"
    cache = Path(env["DERIVC_CACHE_DIR"])
    for seed, (delay, signals) in enumerate(shots, start=10):
        before = snapshot(out) if out.exists() else None
        for entry in cache.glob("*.cubin.entry"):
            entry.unlink()
        proc = subprocess.Popen(_build_cmd(out, seed), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        for k, s in enumerate(signals):
            if k:
                time.sleep(random.uniform(0.0, 0.03))
            if proc.poll() is None:
                proc.send_signal(s)
        _, stderr = proc.communicate(timeout=120)
        what = f"delay {delay:.2f} s, signals {signals}: exit {proc.returncode}: {stderr!r}"
        assert proc.returncode in (0, 130, 143), what
        assert leftovers(tmp_path) == [], what
        if proc.returncode == 0:
            assert build_seed(out) == seed and outdir_mod.foreign_files(out) == [], what
            continue
        assert stderr.count("\n") == 1 and stderr.startswith("derivc: error: "), what
        assert proc.returncode == (130 if signals[0] == signal.SIGINT else 143), what
        if "holds the new build" in stderr:
            assert build_seed(out) == seed and outdir_mod.foreign_files(out) == [], what
        elif before is None:
            assert ("not created" in stderr or "nothing written" in stderr) and not out.exists(), what
        else:  # "nothing written": still importing (compiler/__main__.py)
            assert ("left as it was" in stderr or "nothing written" in stderr) and snapshot(out) == before, what


def _timed_build(tmp_path: Path, env: dict[str, str]) -> tuple[float, float]:
    """(seconds until derivc's first line runs, seconds of a whole build).  A signal before
    compiler/__main__.py runs meets the interpreter's own handlers: derivc cannot answer it."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import compiler"], cwd=ROOT, env=env, check=True)
    t1 = time.monotonic()
    assert subprocess.run(_build_cmd(tmp_path / "out", 1), cwd=ROOT, env=env, capture_output=True).returncode == 0
    return 2 * (t1 - t0), time.monotonic() - t1


TERM, INT = signal.SIGTERM, signal.SIGINT


def test_real_build_interrupted_at_a_few_instants(tmp_path: Path, fresh_nvrtc_env):
    start, duration = _timed_build(tmp_path, fresh_nvrtc_env)
    sweep(tmp_path, fresh_nvrtc_env, [(max(start, 0.4 * duration), (TERM, TERM)), (max(start, 0.7 * duration), (INT,)),
                                      (0.9 * duration, (TERM,))])


@pytest.mark.slow
@pytest.mark.sweep
def test_real_build_interrupted_at_any_instant(tmp_path: Path, fresh_nvrtc_env):
    """20 instants spread over a real build (NVRTC uncached), one signal or two in a row: a sweep,
    6 of them drawn per run (DERIVC_SWEEP_FULL=1: all 20)."""
    start, duration = _timed_build(tmp_path, fresh_nvrtc_env)
    rng = random.Random(20)
    kinds = [(TERM,), (INT,), (TERM, TERM), (INT, TERM)]
    shots = [(start + (duration * 1.05 - start) * k / 19, kinds[k % 4]) for k in range(20)]
    rng.shuffle(shots)
    sweep(tmp_path, fresh_nvrtc_env, sweep_sample(shots, 6, "interrupted build"))


# --------------------------------------------------------------------------- broken pipe


@pytest.mark.parametrize("command", [
    ["explain", str(EXAMPLE)],
    ["--plain", "explain", str(EXAMPLE)],
    ["build", str(EXAMPLE), "-o", "{out}", "--no-proofs", "--no-codegen"],
    ["verify", "{out}"],
])
def test_output_into_a_closed_pipe_is_quiet(tmp_path: Path, command):
    """`derivc … | head`: the reader is gone; no traceback, no error line, exit 141."""
    out = tmp_path / "built"
    if "verify" in command:  # without proofs: verify prints its file comparison, then fails (no coqc run)
        assert run_cli(["build", str(EXAMPLE), "-o", str(out), "--no-codegen"])[0] == 0
    read, write = os.pipe()
    os.close(read)  # `head` that has already read its line and exited
    try:
        proc = subprocess.run([sys.executable, "-m", "compiler", *(c.format(out=out) for c in command)],
                              cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert proc.returncode in (0, 141) and proc.stderr == "", proc.stderr


# --------------------------------------------------------------------------- no CUDA tools


def test_build_without_nvrtc_says_so(tmp_path: Path, monkeypatch):
    import codegen.cuda.nvrtc as nvrtc

    monkeypatch.setattr(nvrtc, "_backend", lambda: None)  # no libnvrtc found, no CuPy
    rc, stdout, _ = run_cli(["--plain", "build", str(EXAMPLE), "-o", str(tmp_path / "out"), "--no-proofs"])
    assert rc == 0
    lines = [ln for ln in stdout.splitlines() if "NVRTC" in ln]
    assert len(lines) == 1 and "NOT compiled" in lines[0] and "SASS checks were skipped" in lines[0]


def test_build_without_disassembler_says_so(tmp_path: Path, monkeypatch):
    import codegen.cuda.nvrtc as nvrtc
    import codegen.cuda.sass as sass

    if not nvrtc.nvrtc_available():
        pytest.skip("NVRTC not installed: the kernel is not compiled, so there is no SASS to check")

    def disassemble(*args, **kwargs):
        raise FileNotFoundError("cuobjdump not found")

    monkeypatch.setattr(sass, "disassemble", disassemble)
    rc, stdout, _ = run_cli(["--plain", "build", str(EXAMPLE), "-o", str(tmp_path / "out"), "--no-proofs"])
    assert rc == 0 and "SASS checks skipped: cuobjdump not found" in stdout
