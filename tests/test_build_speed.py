"""Build speed without checking less: the FlashAttention derivation stays within a budget of
interpreter work (deterministic) and of CPU time (generous), every step is still checked on its
own fresh inputs, and the check sizes still leave a partial tile for every tile.  Also the
progress line a slow build shows on a terminal (and nowhere else)."""
from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import numpy as np
import pytest

import compiler.interp as interp
from compiler import progress
from compiler.checksizes import choose_check_sizes, tile_constraints, tiled_extents
from compiler.derive import TOLERANCE, derive
from compiler.ir import Program
from compiler.spec import load_spec_file
from derivc_testing import GEMM_YAML, ROOT, gemm_yaml

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
FLASH = ROOT / "examples" / "flash_attention.yaml"

# Measured when the budget was set (interpreter with contractions and strided reads; every
# step on a plain and a large draw, compiler/draws.py): 4,016 evaluations, at most 115,200
# elements in one array, 86 M elements in all (one draw per step: 1,928 and 40 M).  The plain
# elementwise interpreter materialises Q·Kᵀ over (i, j, e): 5.8 M elements in one array.
MAX_EVALUATIONS = 6_000
MAX_ELEMENTS_ONE = 250_000
MAX_ELEMENTS_ALL = 120_000_000
MAX_CPU_SECONDS = 4.0  # measured 0.6-0.8 s; generous for loaded CI machines


@pytest.fixture
def evaluations(monkeypatch):
    """Records the size of every array the interpreter's `evaluate` returns."""
    sizes: list[int] = []
    original = interp.evaluate

    def counting(env, e):
        out = original(env, e)
        sizes.append(int(np.size(out)))
        return out

    monkeypatch.setattr(interp, "evaluate", counting)
    return sizes


def test_flash_attention_derivation_stays_within_its_interpreter_budget(evaluations):
    d = derive(load_spec_file(FLASH), str(FLASH), seed=7)
    assert len(d.steps) == 18 and all(s.numeric["passed"] for s in d.steps)
    assert len(evaluations) <= MAX_EVALUATIONS, f"{len(evaluations)} evaluations"
    assert max(evaluations) <= MAX_ELEMENTS_ONE, f"an array of {max(evaluations)} elements"
    assert sum(evaluations) <= MAX_ELEMENTS_ALL, f"{sum(evaluations)} elements evaluated"


def test_flash_attention_derivation_cpu_time():
    spec = load_spec_file(FLASH)
    derive(spec, str(FLASH), seed=1)  # imports and caches warm
    start = time.process_time()
    derive(spec, str(FLASH), seed=2)
    spent = time.process_time() - start
    assert spent <= MAX_CPU_SECONDS, f"derivation took {spent:.2f} s of CPU"


def test_every_step_is_checked_on_its_own_fresh_inputs(monkeypatch):
    """Each step runs IR₀ and its new program on the same inputs, drawn anew for the step and
    for each of its draws (after the plan's own runs of IR₀)."""
    runs: list[tuple[str, bytes]] = []
    original = interp.run_program

    def recording(p: Program, sizes, inputs, **kw):
        runs.append((p.digest(), b"".join(np.asarray(inputs[k]).tobytes() for k in sorted(inputs))))
        return original(p, sizes, inputs, **kw)

    import compiler.derive as derive_mod
    import compiler.draws as draws_mod

    monkeypatch.setattr(derive_mod, "run_program", recording)
    monkeypatch.setattr(draws_mod, "run_program", recording)
    d = derive(load_spec_file(FLASH), str(FLASH), seed=11)
    ir0 = d.initial.digest()
    news = [k for k, (digest, _) in enumerate(runs) if digest != ir0]
    kinds = [x["kind"] for x in d.steps[0].numeric["draws"]]
    assert kinds[:2] == ["plain", "large"] and len(news) == len(kinds) * len(d.steps)
    for n, k in enumerate(news):
        step = d.steps[n // len(kinds)]
        assert runs[k][0] == step.after_hash
        assert runs[k - 1] == (ir0, runs[k][1]), "IR₀ and the step's program ran on different inputs"
        draw = step.numeric["draws"][n % len(kinds)]
        assert draw["seed"] == d.seed + step.index + (n % len(kinds)) * 2**32
        assert step.numeric["seed"] == d.seed + step.index and step.numeric["tolerance"] <= 1e-12
    inputs = [runs[k][1] for k in news]
    assert len(set(inputs)) == len(inputs), "two checks ran on the same inputs"
    assert TOLERANCE <= 1e-12


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_check_sizes_leave_a_partial_tile_for_every_tile(path: Path):
    """Every tile applied along a dynamic size gets a partial last tile at the check sizes."""
    spec = load_spec_file(path)
    d = derive(spec, str(path), check=False)
    # the sizes a checked derivation chooses, from the same programs (its steps are checked by the
    # example's build, conftest.example_build)
    sizes = choose_check_sizes(spec, d.programs[0], d.programs, [s.params() for s in spec.schedule])
    tiled, guarded_dynamic = 0, False
    for prog, step in zip(d.programs, spec.schedule):
        dynamic = {n for n, v in prog.sizes if v is None}
        if step.rule == "tile" and step.params().get("guard", True):
            # a guarded tile along a fixed size has its partial tile (or none) from the spec itself
            guarded_dynamic |= any(t.size in dynamic for t in tiled_extents(prog, step.params()))
        for size, tiles in tile_constraints(prog, step.params()).items():
            for t in tiles:
                tiled += 1
                assert sizes[size] % t != 0, f"{step.rule} {step.params()}: {size}={sizes[size]} is a multiple of {t}"
    if guarded_dynamic:
        assert tiled, "a guarded tile step along a dynamic size constrained no size"


# --------------------------------------------------------------------------- progress line


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_shows_each_step_on_a_terminal_and_erases_itself():
    term = _Terminal()
    with progress.progress_line("building gemm", stream=term, delay=0.0):
        progress.report(0, 2, "step 1 (tile)")
        time.sleep(0.3)  # one refresh shows step 1
        progress.report(2, 2, "derived")
    text = term.getvalue()
    assert "building gemm: step 1 (tile)" in text and "building gemm: derived" in text
    assert "2/3" in text  # two steps done, writing the build left
    assert text.endswith("\x1b[2K")  # the line is erased at the end


def test_progress_line_waits_before_showing():
    term = _Terminal()
    with progress.progress_line("building gemm", stream=term, delay=60.0):
        progress.report(0, 2, "step 1 (tile)")
    assert "building" not in term.getvalue()


def test_no_progress_line_off_a_terminal():
    stream = io.StringIO()
    with progress.progress_line("building gemm", stream=stream, delay=0.0):
        progress.report(0, 2, "step 1 (tile)")
    assert stream.getvalue() == ""
    progress.report(1, 2, "outside any progress line")  # a no-op


def test_build_stdout_unchanged_by_progress(tmp_path, monkeypatch):
    """The same build with stderr a terminal (progress shown at once) and captured: the same
    stdout; the progress line went to the terminal only."""
    from compiler.cli import main

    monkeypatch.chdir(tmp_path)  # a short title: the line is cut to the terminal's width
    spec = Path("gemm.yaml")
    spec.write_text(GEMM_YAML)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    outputs = []
    for name, err in (("plain", io.StringIO()), ("tty", _Terminal())):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["build", str(spec), "-o", "build", "--no-codegen", "--no-proofs", "--seed", "1"])
        assert rc == 0
        outputs.append((out.getvalue(), err.getvalue()))
    (plain_out, plain_err), (tty_out, tty_err) = outputs
    assert plain_out == tty_out and "wrote" in plain_out
    assert plain_err == "" and f"building {spec}: derived" in tty_err


# --------------------------------------------------------------------------- coqc once per text


@pytest.mark.skipif(__import__("shutil").which("coqc") is None, reason="coqc not installed")
def test_an_obligation_edited_in_place_is_checked_again(tmp_path):
    """The test run checks each obligation text once (conftest): the same file name with a
    corrupted text must still fail."""
    from compiler.cli import main
    from compiler.verify import coq_library
    from proofs_ci import coqlib

    spec = tmp_path / "gemm.yaml"
    spec.write_text(gemm_yaml([{"rule": "tile", "def": "C", "index": "i", "size": 16}]))
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["--plain", "build", str(spec), "-o", str(tmp_path / "b"), "--no-codegen", "--seed", "1"]) == 0
    (vfile,) = (tmp_path / "b" / "proofs").glob("Step01*.v")
    lib = coq_library()
    assert coqlib.check_obligation(vfile, lib).returncode == 0
    assert coqlib.check_obligation(vfile, lib).returncode == 0  # served once checked
    vfile.write_text(vfile.read_text() + "\nTheorem derivc_not_provable : False.\nProof. auto. Qed.\n")
    assert coqlib.check_obligation(vfile, lib).returncode != 0
