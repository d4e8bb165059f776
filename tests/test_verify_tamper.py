"""`derivc verify DIR` trusts nothing in DIR: every tampering of a build directory fails with
exit 4 and names the tampered file; `derivc build --verify` checks the obligations with coqc
before the directory is moved into place."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from derivc_testing import gemm_yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import obligations, verify
from compiler.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
SIMT = ROOT / "examples" / "gemm_f32_simt.yaml"
needs_coqc = pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")

SCHEDULE = [
    {"rule": "tile", "def": "C", "index": "i", "size": 4},
    {"rule": "tile", "def": "C", "index": "k", "size": 3},
]


def _build(spec: Path, out: Path, *extra: str) -> int:
    return cli_main(["--plain", "build", str(spec), "-o", str(out), "--seed", "7", *extra])


def _verify(d: Path, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli_main(["--plain", "verify", str(d)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """A 2-step GEMM build without codegen (2 obligations: fast to check)."""
    base = tmp_path_factory.mktemp("verify")
    spec = base / "gemm.yaml"
    spec.write_text(gemm_yaml(SCHEDULE))
    d = base / "build"
    assert _build(spec, d, "--no-codegen") == 0
    return d


@pytest.fixture
def copy(small, tmp_path) -> Path:
    d = tmp_path / "build"
    shutil.copytree(small, d)
    return d


@pytest.fixture(scope="module")
def rebuilt(small, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rebuilt")
    verify.rebuild(small, out)
    return out


# --------------------------------------------------------------------------- untampered


@needs_coqc
def test_untampered_build_verifies_and_verify_leaves_it_as_it_was(copy, capsys):
    spec = Path(json.loads((copy / "derivation.json").read_text())["spec_file"])
    spec.write_text(spec.read_text() + "# edited after the build\n")  # verify uses the recorded text
    before = _tree(copy)
    rc, out, err = _verify(copy, capsys)
    assert rc == 0, out + err
    assert "identical to a rebuild" in out and "Coq: 2/2 obligations passed" in out
    assert f"spec: built from {spec} " in out and "the file there now DIFFERS" in out
    after = _tree(copy)
    assert set(after) - set(before) == {verify.VERIFY_REPORT}  # no coqc by-products in DIR
    assert {k: v for k, v in after.items() if k in before} == before
    assert _verify(copy, capsys)[0] == 0  # its own report is not an extra file


def test_rebuild_is_byte_identical(small, rebuilt):
    mismatches, same = verify.compare_dirs(small, rebuilt)
    assert mismatches == [] and same == len(_tree(small))


# --------------------------------------------------------------------------- each tampering


def _theorem_to_true(d: Path) -> str:
    """Replace step 1's theorem statement by `True`, with a proof that Coq accepts."""
    v = d / "proofs" / "Step01_TILE.v"
    text = v.read_text()
    new = re.sub(r"Theorem (\w+) :.*?Qed\.", r"Theorem \1 : True.\nProof. exact I. Qed.", text, flags=re.S)
    assert new != text
    v.write_text(new)
    return "proofs/Step01_TILE.v: altered"


def _delete_step_v(d: Path) -> str:
    (d / "proofs" / "Step02_TILE.v").unlink()
    return "proofs/Step02_TILE.v: missing"


def _garbage_trace(d: Path) -> str:
    (d / "derivation.json").write_text("{ not json at all\n")
    return "derivation.json: altered: not a derivc trace"


def _edit_program(d: Path) -> str:
    p = d / "program.txt"
    p.write_text(p.read_text().replace("sum(", "max(", 1))
    return "program.txt: altered: line"


def _extra_file(d: Path) -> str:
    (d / "steps" / "03_tile.txt").write_text("an extra step\n")
    return "steps/03_tile.txt: extra file"


def _edit_final_digest(d: Path) -> str:
    p = d / "derivation.json"
    t = json.loads(p.read_text())
    t["final_digest"] = "0" * 16
    p.write_text(json.dumps(t, indent=2) + "\n")
    return "derivation.json: altered: final_digest differs"


def _edit_step_digest(d: Path) -> str:
    p = d / "derivation.json"
    t = json.loads(p.read_text())
    t["steps"][1]["after_hash"] = "f" * 16
    p.write_text(json.dumps(t, indent=2) + "\n")
    return "derivation.json: altered: steps[1].after_hash differs"


def _edit_report_digest(d: Path) -> str:
    p = d / "report.md"
    t = json.loads((d / "derivation.json").read_text())
    p.write_text(p.read_text().replace(t["final_digest"], "0" * 16))
    return "report.md: altered"


def _edit_spec_text(d: Path) -> str:
    p = d / "derivation.json"
    t = json.loads(p.read_text())
    t["spec_text"] = t["spec_text"].replace("size: 4", "size: 2")
    p.write_text(json.dumps(t, indent=2) + "\n")
    return "derivation.json: altered: spec_text does not match"


def _consistent_other_spec(d: Path) -> str:
    """A different spec recorded with its own hash: the rebuild differs from every other file."""
    import hashlib

    p = d / "derivation.json"
    t = json.loads(p.read_text())
    t["spec_text"] = t["spec_text"].replace("size: 4", "size: 2")
    t["spec_file_sha256"] = hashlib.sha256(t["spec_text"].encode()).hexdigest()
    p.write_text(json.dumps(t, indent=2) + "\n")
    return "derivation.json: altered"


def _old_trace(d: Path) -> str:
    p = d / "derivation.json"
    t = json.loads(p.read_text())
    del t["spec_text"]
    p.write_text(json.dumps(t, indent=2) + "\n")
    return "no spec_text recorded"


def _edit_index(d: Path) -> str:
    p = d / "proofs" / "index.json"
    t = json.loads(p.read_text())
    t["steps"][0]["status"] = "full (trust me)"
    p.write_text(json.dumps(t, indent=2) + "\n")
    return "proofs/index.json: altered: steps[0].status differs"


def _symlink(d: Path) -> str:
    p = d / "program.txt"
    target = d.parent / "elsewhere.txt"
    target.write_bytes(p.read_bytes())
    p.unlink()
    p.symlink_to(target)
    return "program.txt: altered: a link"


TAMPERINGS = [_theorem_to_true, _delete_step_v, _garbage_trace, _edit_program, _extra_file,
              _edit_final_digest, _edit_step_digest, _edit_report_digest, _edit_spec_text,
              _consistent_other_spec, _old_trace, _edit_index, _symlink]


@pytest.mark.parametrize("tamper", TAMPERINGS, ids=lambda f: f.__name__.strip("_"))
def test_tampering_fails_naming_the_file(copy, capsys, tamper):
    expected = tamper(copy)
    rc, out, err = _verify(copy, capsys)
    assert rc == 4, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"derivc: error: {copy}: verify: "), err
    assert expected in lines[0], (expected, err)


@needs_coqc
def test_true_theorem_passes_coq_but_not_verify(copy, capsys):
    """The hole the audit found: a valid proof of `True` used to pass verify."""
    _theorem_to_true(copy)
    rc, _, err = _verify(copy, capsys)
    assert rc == 4 and "Step01_TILE.v: altered" in err
    report = json.loads((copy / verify.VERIFY_REPORT).read_text())
    assert all(r["coq"] == "passed" for r in report["steps"])  # coqc alone would not notice
    assert report["files"]["mismatches"] and not report["passed"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_byte_changed_in_any_file_is_named(small, rebuilt, tmp_path_factory, data):
    d = tmp_path_factory.mktemp("flip") / "build"
    shutil.copytree(small, d)
    files = sorted(_tree(d))
    rel = data.draw(st.sampled_from(files), label="file")
    raw = bytearray((d / rel).read_bytes())
    at = data.draw(st.integers(0, len(raw) - 1), label="offset")
    raw[at] = data.draw(st.integers(0, 255).filter(lambda b: b != raw[at]), label="byte")
    (d / rel).write_bytes(bytes(raw))
    mismatches, _ = verify.compare_dirs(d, rebuilt)
    assert [(m.path, m.what) for m in mismatches] == [(rel, "altered")]


# --------------------------------------------------------------------------- with codegen


def test_codegen_build_verifies_and_kernel_edit_fails(tmp_path, capsys):
    d = tmp_path / "simt"
    assert _build(SIMT, d) == 0
    if not (d / "kernel.cu").exists():
        pytest.skip("codegen wrote no kernel.cu here")
    assert verify.check_files(d) == ([], len(_tree(d)))
    src = (d / "kernel.cu").read_text()
    (d / "kernel.cu").write_text(src.replace("__syncthreads();", "", 1))
    rc, out, err = _verify(d, capsys)
    assert rc == 4 and "kernel.cu: altered: line" in err, out + err
    (d / "kernel.cu").write_text(src)
    (d / "kernel.cu").unlink()
    assert verify.check_files(d)[0][0].line().startswith("kernel.cu: missing")


# --------------------------------------------------------------------------- build --verify


@needs_coqc
def test_build_verify_passes_and_writes_what_a_plain_build_writes(small, tmp_path, capsys):
    spec = tmp_path / "gemm.yaml"
    spec.write_text(gemm_yaml(SCHEDULE))
    capsys.readouterr()
    assert _build(spec, tmp_path / "v", "--no-codegen", "--verify") == 0
    assert "proofs: 2/2 obligations checked by coqc" in capsys.readouterr().out
    assert _build(spec, tmp_path / "p", "--no-codegen") == 0
    # the same files; only the proof check's record (timings, cache hits) may differ
    timed = {"derivation.json", "report.md", ".derivc-build"}
    v, p = _tree(tmp_path / "v"), _tree(tmp_path / "p")
    assert {k: x for k, x in v.items() if k not in timed} == {k: x for k, x in p.items() if k not in timed}
    assert set(v) == set(p)


@needs_coqc
def test_build_verify_fails_on_a_false_obligation(tmp_path, capsys, monkeypatch):
    write = obligations.write_obligations

    def corrupt(d, proofs):
        files = write(d, proofs)
        v = proofs / "Step02_TILE.v"
        v.write_text(v.read_text().replace("Proof.\n", "Proof.\n  exfalso.\n", 1))
        return files

    monkeypatch.setattr(obligations, "write_obligations", corrupt)
    spec = tmp_path / "gemm.yaml"
    spec.write_text(gemm_yaml(SCHEDULE))
    capsys.readouterr()
    assert _build(spec, tmp_path / "out", "--no-codegen", "--verify") == 4
    err = capsys.readouterr().err
    assert "step 2 (tile): proof obligation proofs/Step02_TILE.v failed" in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["gemm.yaml"]  # no DIR, no temp dir left


def test_build_verify_without_coqc_builds_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("compiler.proofcheck.coqc_path", lambda: None)
    spec = tmp_path / "gemm.yaml"
    spec.write_text(gemm_yaml(SCHEDULE))
    capsys.readouterr()
    assert _build(spec, tmp_path / "out", "--no-codegen", "--verify") == 1
    err = capsys.readouterr().err
    assert "coqc not found" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_build_verify_with_no_proofs_is_a_usage_error(tmp_path, capsys):
    spec = tmp_path / "gemm.yaml"
    spec.write_text(gemm_yaml(SCHEDULE))
    assert _build(spec, tmp_path / "out", "--no-proofs", "--verify") == 2
    assert "--no-proofs" in capsys.readouterr().err
