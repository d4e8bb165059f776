"""`derivc build` checks the Coq obligations by default (compiler/proofcheck.py).

Every build here has its own proof cache (DERIVC_COQ_CACHE under tmp_path; the library in it is
a copy of the one the test run compiled once, tests/conftest.py) and a small GEMM schedule
(obligations of ~1 s each), so that the cold path really runs coqc.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from compiler import obligations, proofcheck
from derivc_testing import gemm_yaml, run_cli

HAVE_COQC = shutil.which("coqc") is not None
needs_coqc = pytest.mark.skipif(not HAVE_COQC, reason="coqc not installed")

SCHEDULE = [{"rule": "tile", "def": "C", "index": "i", "size": 16},
            {"rule": "reorder", "def": "C", "outer": "ii", "inner": "j"}]


@pytest.fixture(scope="module")
def compiled_library(tmp_path_factory) -> Path | None:
    return proofcheck.library(tmp_path_factory.mktemp("coqlib")).path if HAVE_COQC else None


@pytest.fixture
def spec(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("DERIVC_COQ_CACHE", str(tmp_path / "coq-cache"))
    f = tmp_path / "gemm.yaml"
    f.write_text(gemm_yaml(SCHEDULE))
    return f


def build(spec: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(["--plain", "build", str(spec), "-o", str(out), "--no-codegen", "--seed", "1", *extra],
                   proofs=True)


def trace(out: Path) -> dict:
    return json.loads((out / "derivation.json").read_text())


@needs_coqc
def test_build_checks_the_proofs_then_serves_them_from_the_cache(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    rc, stdout, stderr = build(spec, out)
    assert rc == 0, stderr
    t = trace(out)
    steps = t["steps"]
    assert len(steps) == 2 and all(s["proof"]["checked"] for s in steps)
    assert {s["proof"]["by"] for s in steps} == {proofcheck.coqc_version()}
    assert not any(s["proof"]["cached"] for s in steps) and all(s["proof"]["seconds"] > 0 for s in steps)
    assert t["proofs"]["checked"] and t["proofs"]["obligations"] == 2 and t["proofs"]["cached"] == 0
    assert "proofs: 2/2 obligations checked by coqc" in stdout
    report = (out / "report.md").read_text()
    assert "Proofs: 2/2 obligations checked by coqc" in report
    assert report.count("- proof obligation: checked by coqc") == 2
    assert not list(out.rglob("*.vo")) and not list(out.rglob("*.glob"))  # coqc's products stay out
    # the cache: same obligations, nothing run again
    passed = sorted((tmp_path / "coq-cache" / "passed").glob("*.json"))
    assert len(passed) == 2
    t0 = time.monotonic()
    rc, stdout, stderr = build(spec, out)
    assert rc == 0, stderr
    assert all(s["proof"]["cached"] for s in trace(out)["steps"]) and "2 from the cache" in stdout
    assert time.monotonic() - t0 < 5
    # `derivc verify` trusts no cache: its coqc runs are its own, and they pass
    rc, stdout, stderr = run_cli(["--plain", "verify", str(out)])
    assert rc == 0, stdout + stderr


def test_no_proofs_says_so(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    rc, stdout, stderr = build(spec, out, "--no-proofs")
    assert rc == 0, stderr
    assert "proofs not checked: --no-proofs" in stdout
    t = trace(out)
    assert t["proofs"] == {"checked": False, "reason": "--no-proofs"}
    assert all(s["proof"] == {"checked": False, "reason": "--no-proofs"} for s in t["steps"])
    report = (out / "report.md").read_text()
    assert "**Proofs NOT checked** (--no-proofs)" in report and "- proof obligation: NOT checked" in report
    assert not (out / "proofs").exists()


def test_without_coqc_the_build_succeeds_and_says_not_checked(spec: Path, tmp_path: Path, monkeypatch):
    bare = tmp_path / "bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))  # no coqc (nor anything else) on PATH
    out = tmp_path / "out"
    rc, stdout, stderr = build(spec, out)
    assert rc == 0, stderr
    assert "proofs not checked: coqc not found" in stdout
    t = trace(out)
    assert t["proofs"] == {"checked": False, "reason": "coqc not found"}
    assert all(s["proof"] == {"checked": False, "reason": "coqc not found"} for s in t["steps"])
    assert "**Proofs NOT checked** (coqc not found)" in (out / "report.md").read_text()
    assert (out / "proofs" / "index.json").exists()  # exported all the same
    # --verify insists on coqc
    rc, _, stderr = build(spec, tmp_path / "out2", "--verify")
    assert rc == 1 and "coqc not found" in stderr and not (tmp_path / "out2").exists()


def _corrupt_step(monkeypatch, step: int) -> None:
    """The exporter writes step `step`'s obligation with one more, false, claim."""
    real = obligations.write_obligations

    def corrupted(d, proofs):
        files = real(d, proofs)
        v = next(proofs.glob(f"Step{step:02d}_*.v"))
        v.write_text(v.read_text() + "\nTheorem derivc_corrupted : forall n : nat, n + 1 = n.\n"
                     "Proof. intros. lia. Qed.\n")
        return files

    monkeypatch.setattr(obligations, "write_obligations", corrupted)


@needs_coqc
def test_a_failing_obligation_fails_the_build_fast_and_leaves_no_output(spec: Path, tmp_path: Path, monkeypatch):
    _corrupt_step(monkeypatch, 2)
    out = tmp_path / "out"
    t0 = time.monotonic()
    rc, stdout, stderr = build(spec, out)
    took = time.monotonic() - t0
    assert rc == 4, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith(f"derivc: error: {spec}: step 2 (reorder): proof obligation proofs/Step02_REORDER.v "
                           "failed: line "), line
    assert "Error" in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["coq-cache", "gemm.yaml"]
    assert took < 30, took
    # a previous build stays as it was
    monkeypatch.undo()
    monkeypatch.setenv("DERIVC_COQ_CACHE", str(tmp_path / "coq-cache"))
    assert build(spec, out, "--no-proofs")[0] == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    _corrupt_step(monkeypatch, 1)
    assert build(spec, out)[0] == 4
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@needs_coqc
def test_verify_does_not_trust_the_cache(spec: Path, tmp_path: Path, monkeypatch):
    """A forged cache entry makes a build accept a false obligation (the build trusts its
    cache); `derivc verify` checks everything again and fails."""
    _corrupt_step(monkeypatch, 1)
    probe = tmp_path / "probe"
    (probe / "proofs").mkdir(parents=True)
    from compiler.derive import derive
    from compiler.spec import load_spec_file

    obligations.write_obligations(derive(load_spec_file(spec), str(spec), seed=1), probe / "proofs")
    lib = proofcheck.library()
    for v in (probe / "proofs").glob("Step*.v"):
        proofcheck.store_pass(proofcheck.cache_root(), proofcheck.obligation_key(v.read_bytes(), lib), v.name, 1.0)
    out = tmp_path / "out"
    rc, _, stderr = build(spec, out)
    assert rc == 0, stderr
    assert all(s["proof"]["cached"] for s in trace(out)["steps"])
    rc, stdout, stderr = run_cli(["--plain", "verify", str(out)])
    assert rc == 4 and "step 1 (tile): proof obligation proofs/Step01_TILE.v failed" in stderr, stdout + stderr


@needs_coqc
def test_the_cache_key_covers_text_library_and_coqc(tmp_path: Path, compiled_library):
    from compiler import coqcache
    from proofs_ci import coqlib

    lib = proofcheck.library(compiled_library.parent)
    key = proofcheck.obligation_key(b"Goal True. exact I. Qed.", lib)
    assert key != proofcheck.obligation_key(b"Goal True. exact I. Qed. ", lib)
    other = proofcheck.CoqLibrary(lib.path, lib.digest[::-1])
    assert key != proofcheck.obligation_key(b"Goal True. exact I. Qed.", other)
    real = proofcheck.coqc_version()  # another coqc: another library directory, other keys
    assert coqcache.source_digest(coqlib.COQ_DIR, "coqc 0.0") != coqcache.source_digest(coqlib.COQ_DIR, real)
    assert lib.path.name == f"lib-{coqcache.source_digest(coqlib.COQ_DIR, real)}"
    proofcheck.store_pass(tmp_path, key, "x.v", 1.0)
    assert proofcheck.cached_pass(tmp_path, key)
    entry = f"{coqcache.mac(coqcache.open_cache(tmp_path), key)}.json"  # named by the user's MAC
    assert [p.name for p in (tmp_path / "passed").iterdir()] == [entry]  # no temp file left
    (tmp_path / "passed" / entry).write_text("{")  # a torn entry is a miss
    assert not proofcheck.cached_pass(tmp_path, key)


def test_first_error_names_the_line():
    out = ('File "./Step03_X.v", line 17, characters 2-14:\nError:\nIn environment\nx : nat\n'
           'Unable to unify "0" with "1".\n')
    assert proofcheck.first_error(out) == "line 17: Error: In environment"
    assert proofcheck.first_error('File "./a.v", line 4, characters 0-1:\nError: No applicable tactic.\n') == \
        "line 4: Error: No applicable tactic."
    assert proofcheck.first_error("coqc timed out after 300 s\n") == "coqc timed out after 300 s"


def test_the_safety_obligation_is_checked_last_and_file_names_are_checked(tmp_path: Path):
    proofs = tmp_path / "proofs"
    proofs.mkdir()
    index = {"steps": [{"step": 2, "rule": "tile", "files": {"coq": "Step02_TILE.v"}},
                       {"step": 1, "rule": "tile", "files": {"coq": "Step01_TILE.v"}}],
             "safety": {"files": {"coq": "Step02_SAFETY.v"}}}
    (proofs / "index.json").write_text(json.dumps(index))
    assert proofcheck._index(proofs) == [(1, "tile", "Step01_TILE.v"), (2, "tile", "Step02_TILE.v"),
                                         (2, "safety", "Step02_SAFETY.v")]
    index["steps"][0]["files"]["coq"] = "../Step02_TILE.v"  # verify trusts nothing in DIR
    (proofs / "index.json").write_text(json.dumps(index))
    with pytest.raises(proofcheck.BadIndex, match="not an obligation file name"):
        proofcheck._index(proofs)
    check = proofcheck.ProofCheck(True, "coqc 8.16.1", results=(
        proofcheck.ObligationResult(2, "tile", "Step02_TILE.v", "passed", seconds=1.0),
        proofcheck.ObligationResult(2, "safety", "Step02_SAFETY.v", "passed", cached=True)))
    assert check.step_record(2) == {"checked": True, "by": "coqc 8.16.1", "cached": False, "seconds": 1.0}
    assert check.summary()["safety"]["file"] == "Step02_SAFETY.v" and check.summary()["cached"] == 1


@needs_coqc
def test_a_runaway_proof_search_is_stopped_by_cpu_time(tmp_path: Path, monkeypatch, compiled_library):
    """The bound is CPU time (a loaded machine does not fail a slow true proof), and the
    error line says what happened."""
    import threading

    monkeypatch.setattr(proofcheck, "COQC_CPU_LIMIT_S", 1)
    v = tmp_path / "Step01_LOOP.v"
    v.write_text("Require Import NArith.\nEval vm_compute in N.iter 10000000000%N negb true.\n")
    r = proofcheck.run_coqc(v, compiled_library, 600, threading.Event())
    assert r.returncode != 0
    assert proofcheck.first_error(r.output) == "coqc stopped after 1 s of CPU time (a runaway proof search)"
