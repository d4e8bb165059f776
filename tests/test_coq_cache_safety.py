"""The Coq cache is the user's alone and nothing in it is trusted unchecked (compiler/coqcache.py):
a cache others could write is refused (the build goes on without it, verify compiles the library
privately), a planted .vo is found and compiled again, a planted pass record passes nothing, and
`derivc verify` fails a false obligation whatever the cache holds."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from compiler import coqcache, obligations, proofcheck
from derivc_testing import gemm_yaml, run_cli

pytestmark = pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")

SCHEDULE = [{"rule": "tile", "def": "C", "index": "i", "size": 16},
            {"rule": "reorder", "def": "C", "outer": "ii", "inner": "j"}]
# Closed by the poisoned library below (derivc_congr := apply an axiom proving anything); false.
FALSE_THEOREM = ("\nTheorem derivc_corrupted : forall n : nat, n + 1 = n.\n"
                 "Proof. intros. derivc_congr. Qed.\n")


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    f = tmp_path / "gemm.yaml"
    f.write_text(gemm_yaml(SCHEDULE))
    return f


def _corrupt_step_1(monkeypatch) -> None:
    """The exporter writes step 1's obligation with FALSE_THEOREM appended."""
    real = obligations.write_obligations

    def corrupted(d, proofs):
        files = real(d, proofs)
        v = next(proofs.glob("Step01_*.v"))
        v.write_text(v.read_text() + FALSE_THEOREM)
        return files

    monkeypatch.setattr(obligations, "write_obligations", corrupted)


def build(spec: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(["--plain", "build", str(spec), "-o", str(out), "--no-codegen", "--seed", "1", *extra],
                   proofs=True)


@pytest.fixture(scope="module")
def poisoned_all_vo(tmp_path_factory) -> bytes:
    """An All.vo compiled with an axiom proving anything and derivc_congr redefined to use it:
    planted in a cached library, it makes FALSE_THEOREM pass."""
    lib = proofcheck.library(tmp_path_factory.mktemp("clean")).path
    work = tmp_path_factory.mktemp("poison") / "coq"
    shutil.copytree(lib, work)
    with open(work / "All.v", "a") as f:
        f.write("Axiom derivc_cheat : forall P : Prop, P.\nLtac derivc_congr ::= apply derivc_cheat.\n")
    subprocess.run(["coqc", "-R", ".", "Derivc", "All.v"], cwd=work, check=True, capture_output=True)
    return (work / "All.vo").read_bytes()


def _poison(root: Path, all_vo: bytes) -> Path:
    """Plant `all_vo` in the library cached under `root` (the library compiled first)."""
    lib = proofcheck.library(root).path
    (lib / "All.vo").write_bytes(all_vo)
    return lib


# --------------------------------------------------------------------------- who may own the cache


def test_the_cache_and_the_parents_derivc_creates_are_0700(tmp_path: Path):
    root = tmp_path / "a" / "b" / "coq"
    old = os.umask(0o022)
    try:
        coqcache.open_cache(root)
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "b", root):
        assert d.stat().st_mode & 0o777 == 0o700, d
    assert (root / coqcache.KEY_FILE).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o720])
def test_a_cache_others_can_write_is_refused(tmp_path: Path, mode: int):
    root = tmp_path / "coq"
    root.mkdir()
    root.chmod(mode)
    with pytest.raises(coqcache.UnsafeCache, match="writable by group or others"):
        coqcache.open_cache(root)


def test_a_cache_of_another_user_is_refused(tmp_path: Path, monkeypatch):
    root = tmp_path / "coq"
    root.mkdir(mode=0o700)
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 4242)  # the directory is now someone else's
    with pytest.raises(coqcache.UnsafeCache, match=f"owned by uid {me}"):
        coqcache.open_cache(root)


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_cache_reached_through_a_symlink_into_an_open_directory_is_refused(tmp_path: Path, where: str):
    shared = tmp_path / "shared"  # like /tmp without its sticky bit
    (shared / "coq").mkdir(parents=True)
    (shared / "coq").chmod(0o700)
    shared.chmod(0o777)
    home = tmp_path / "home"
    home.mkdir()
    if where == "last":
        (home / "coq").symlink_to(shared / "coq")
        root = home / "coq"
    else:
        (home / "link").symlink_to(shared)
        root = home / "link" / "coq"
    with pytest.raises(coqcache.UnsafeCache, match=f"{shared} is writable by others"):
        coqcache.open_cache(root)


def test_a_build_with_an_unsafe_cache_goes_on_without_it_and_says_so_once(spec: Path, tmp_path: Path, monkeypatch):
    root = tmp_path / "coq"
    root.mkdir()
    root.chmod(0o777)
    monkeypatch.setenv("DERIVC_COQ_CACHE", str(root))
    monkeypatch.setattr(proofcheck, "_WARNED", set())
    rc, stdout, stderr = build(spec, tmp_path / "out")
    assert rc == 0, stderr
    warnings = [ln for ln in stderr.splitlines() if ln]
    assert len(warnings) == 1 and warnings[0].startswith(f"derivc: warning: Coq cache {root} not used: "), stderr
    assert "proofs: 2/2 obligations checked by coqc" in stdout
    assert list(root.iterdir()) == []  # neither a library nor a pass record written there
    rc, _, stderr = build(spec, tmp_path / "out")  # the next build in the process: checked, not said again
    assert rc == 0 and stderr == "", stderr


# --------------------------------------------------------------------------- what in it is trusted


def test_a_changed_byte_in_a_cached_vo_is_found_and_compiled_again(tmp_path: Path):
    lib = proofcheck.library(tmp_path).path
    clean = {p.name: p.read_bytes() for p in lib.glob("*.vo")}
    data = bytearray(clean["Algebra.vo"])
    data[len(data) // 2] ^= 1
    (lib / "Algebra.vo").write_bytes(bytes(data))
    again = proofcheck.library(tmp_path)
    assert again.path == lib
    assert {p.name: p.read_bytes() for p in lib.glob("*.vo")} == clean


def test_a_planted_library_with_a_rewritten_manifest_is_compiled_again(tmp_path: Path, poisoned_all_vo: bytes):
    """The manifest's hashes alone do not vouch: its MAC needs the user's key."""
    lib = _poison(tmp_path, poisoned_all_vo)
    body = coqcache._manifest_body(lib.name[4:], proofcheck.coqc_version(), coqcache._file_hashes(lib))
    (lib / coqcache.MANIFEST).write_text(json.dumps({"mac": coqcache.mac(b"\0" * 32, body)}))
    assert (proofcheck.library(tmp_path).path / "All.vo").read_bytes() != poisoned_all_vo


def test_a_poisoned_library_does_not_pass_a_false_obligation_in_a_build(spec: Path, tmp_path: Path, monkeypatch,
                                                                        poisoned_all_vo: bytes):
    monkeypatch.setenv("DERIVC_COQ_CACHE", str(tmp_path / "coq"))
    _poison(tmp_path / "coq", poisoned_all_vo)
    _corrupt_step_1(monkeypatch)
    rc, _, stderr = build(spec, tmp_path / "out")
    assert rc == 4 and "step 1 (tile): proof obligation proofs/Step01_TILE.v failed" in stderr, stderr


def test_a_planted_pass_record_does_not_pass_a_false_obligation(spec: Path, tmp_path: Path, monkeypatch):
    """An attacker who could write the cache knows every obligation key (sha256 of public
    inputs); the record's name is a MAC under the user's key, which the attacker does not have."""
    root = tmp_path / "coq"
    monkeypatch.setenv("DERIVC_COQ_CACHE", str(root))
    _corrupt_step_1(monkeypatch)
    probe = tmp_path / "probe" / "proofs"
    from compiler.derive import derive
    from compiler.spec import load_spec_file

    obligations.write_obligations(derive(load_spec_file(spec), str(spec), seed=1), probe)
    lib = proofcheck.library(root)
    (root / "passed").mkdir()
    for v in probe.glob("Step*.v"):
        key = proofcheck.obligation_key(v.read_bytes(), lib)
        for name in (key, coqcache.mac(b"\0" * 32, key)):  # by key; under a MAC of another key
            (root / "passed" / f"{name}.json").write_text(json.dumps({"key": key, "file": v.name, "seconds": 1.0}))
    rc, _, stderr = build(spec, tmp_path / "out")
    assert rc == 4 and "step 1 (tile): proof obligation proofs/Step01_TILE.v failed" in stderr, stderr


@pytest.mark.parametrize("cache", ["private", "open to others"])
def test_verify_on_a_poisoned_library_cache_fails_a_false_obligation(spec: Path, tmp_path: Path, monkeypatch,
                                                                      poisoned_all_vo: bytes, cache: str):
    """The build dir holds a false obligation (the build passed it from the user's own forged
    record); the library cache is then poisoned.  verify reads no record and uses no library
    that does not match its manifest (nor any from a cache others can write)."""
    root = tmp_path / "coq"
    monkeypatch.setenv("DERIVC_COQ_CACHE", str(root))
    _corrupt_step_1(monkeypatch)
    probe = tmp_path / "probe" / "proofs"
    from compiler.derive import derive
    from compiler.spec import load_spec_file

    obligations.write_obligations(derive(load_spec_file(spec), str(spec), seed=1), probe)
    lib = proofcheck.library(root)
    for v in probe.glob("Step*.v"):
        proofcheck.store_pass(root, proofcheck.obligation_key(v.read_bytes(), lib), v.name, 1.0)
    out = tmp_path / "out"
    rc, _, stderr = build(spec, out)
    assert rc == 0, stderr
    lib = _poison(root, poisoned_all_vo)
    if cache == "open to others":  # whatever it holds, even a manifest that vouches for the poison
        body = coqcache._manifest_body(lib.name[4:], proofcheck.coqc_version(), coqcache._file_hashes(lib))
        (lib / coqcache.MANIFEST).write_text(json.dumps({"mac": coqcache.mac(coqcache.open_cache(root), body)}))
        root.chmod(0o777)
    rc, stdout, stderr = run_cli(["--plain", "verify", str(out)])
    assert rc == 4 and "step 1 (tile): proof obligation proofs/Step01_TILE.v failed" in stderr, stdout + stderr


# --------------------------------------------------------------------------- checked once per process


def test_an_identical_obligation_is_checked_once_per_process_and_a_false_one_every_time(tmp_path: Path,
                                                                                        monkeypatch):
    proofs = tmp_path / "proofs"
    proofs.mkdir()
    index = {"steps": [{"step": 1, "rule": "tile", "files": {"coq": "Step01_TILE.v"}},
                       {"step": 2, "rule": "tile", "files": {"coq": "Step02_TILE.v"}}]}
    (proofs / "index.json").write_text(json.dumps(index))
    fresh = f"derivc_once_{os.getpid()}_{tmp_path.name}"  # proved by nothing earlier in this process
    (proofs / "Step01_TILE.v").write_text(f"Require Import Derivc.All.\nTheorem {fresh} : True. exact I. Qed.\n")
    (proofs / "Step02_TILE.v").write_text(f"Theorem {fresh} : 1 = 2. reflexivity. Qed.\n")
    runs: list[str] = []
    real = proofcheck.run_coqc
    monkeypatch.setattr(proofcheck, "run_coqc", lambda v, *a: runs.append(v.name) or real(v, *a))
    monkeypatch.setenv("DERIVC_COQ_CACHE", str(tmp_path / "coq"))
    for _ in range(2):  # as verify does: no pass record read
        check = proofcheck.check_obligations(proofs, use_cache=False, stop_on_failure=False)
        assert [r.status for r in check.results] == ["passed", "FAILED"]
    assert sorted(runs) == ["Step01_TILE.v", "Step02_TILE.v", "Step02_TILE.v"]
