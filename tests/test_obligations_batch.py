"""Obligations checked many to a coqc process and identical ones once (compiler.obligations_batch,
compiler.proofcheck): the verdict of each obligation is still its own."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from compiler import proofcheck
from compiler.obligations_batch import canonical_text, combined_text, passed_prefix, split

ROOT = Path(__file__).resolve().parents[1]

HEAD = "(* derivc obligation: step {n}, rule tile (TILE). *)\nFrom Coq Require Import Lia.\nRequire Import Derivc.All.\n\n"


def obligation(n: int, claim: str, proof: str = "lia", rule: str = "TILE") -> str:
    return (HEAD.format(n=n) + f"Section Step{n:02d}.\n"
            f"Theorem step{n:02d}_{rule} : forall a b : nat, {claim}.\nProof. intros. {proof}. Qed.\n\n"
            f"Theorem step{n:02d}_{rule}_frame : True.\nProof. exact I. Qed.\nEnd Step{n:02d}.\n")


def test_obligations_that_differ_in_their_step_number_only_share_a_key():
    a, b = obligation(3, "a + b = b + a"), obligation(14, "a + b = b + a")
    assert a != b and canonical_text(a) == canonical_text(b)
    assert canonical_text(a).count("\n") == a.count("\n")  # lines kept: coqc's error lines stay right
    assert canonical_text(obligation(3, "a + b = b + a", rule="CACHE")) != canonical_text(a)
    assert canonical_text(obligation(3, "a * b = b + a")) != canonical_text(a)
    # a name the file does not declare is never renamed; nor is anything when the renaming could collide
    uses = a.replace("exact I", "exact step03_ELSEWHERE")
    assert "step03_ELSEWHERE" in canonical_text(uses)
    clash = a.replace("a + b", "step___x + b")
    assert canonical_text(clash) == clash


def test_the_library_declares_no_step_name():
    """The renaming is sound only for names the obligation declares itself: the proof library
    (which obligations reference) must not declare a `stepNN` / `StepNN` name."""
    decl = re.compile(r"^\s*(?:\w+\s+)*?(?:Theorem|Lemma|Definition|Fixpoint|Inductive|Record|Section|Module|Ltac|"
                      r"Notation|Corollary|Fact|Remark|Example|Class|Instance|Let|Variable|Hypothesis|Context)"
                      r"\s+[Ss]tep[0-9]", re.M)
    from proofs_ci import coqlib

    files = coqlib.project_files()  # what `Require Import Derivc.All` loads (not examples/, models/)
    assert "Tactics.v" in files
    bad = [f for f in files if decl.search((coqlib.COQ_DIR / f).read_text())]
    assert not bad, bad


def test_combined_file_and_its_markers():
    parts = [split(obligation(n, "a + b = b + a")) for n in (1, 2)]
    assert parts[0].prelude == parts[1].prelude == "\nFrom Coq Require Import Lia.\nRequire Import Derivc.All.\n\n"
    assert all(p.combinable for p in parts)
    assert not split(obligation(1, "True", "Admitted")).combinable
    assert not split(obligation(1, "True", "Ltac derivc_congr ::= idtac")).combinable
    text = combined_text(parts[0].prelude, [p.rest for p in parts], "n0")
    assert text.count("Module DerivcObligation") == 2 and text.count("Require Import Derivc") == 1
    out = "derivc-batch-n0-passed-0\nderivc-batch-n1-passed-1\n"
    assert passed_prefix(out, "n0", 2) == 1


def _proofs(tmp: Path, texts: dict[int, str]) -> Path:
    proofs = tmp / "proofs"
    proofs.mkdir()
    index = {"steps": [{"step": n, "rule": "tile", "files": {"coq": f"Step{n:02d}_TILE.v"}} for n in texts]}
    (proofs / "index.json").write_text(json.dumps(index))
    for n, t in texts.items():
        (proofs / f"Step{n:02d}_TILE.v").write_text(t)
    return proofs


@pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")
def test_a_false_obligation_in_a_batch_fails_alone_and_the_others_pass(tmp_path: Path, monkeypatch):
    """Five obligations, two coqc jobs; the false one (step 3) is reported with the error line of
    its own file; identical ones (steps 4, 5) are checked once; nothing is read from a cache."""
    tag = f"{tmp_path.name}".replace("-", "_")  # proved by nothing earlier in this process
    true_ = f"a + b = b + a + 0 * {len(tag)}"
    texts = {1: obligation(1, true_), 2: obligation(2, f"a * b = b * a + 0 * {len(tag)}"),
             3: obligation(3, f"a + b = b + a + 1 + 0 * {len(tag)}"), 4: obligation(4, f"{true_} * 1"),
             5: obligation(5, f"{true_} * 1")}
    texts = {n: t.replace("Proof.", f"Proof. (* {tag} *)") for n, t in texts.items()}
    runs: list[str] = []
    real = proofcheck.run_coqc
    monkeypatch.setattr(proofcheck, "run_coqc", lambda v, *a: runs.append(v.read_text()) or real(v, *a))
    check = proofcheck.check_obligations(_proofs(tmp_path, texts), use_cache=False, stop_on_failure=False, jobs=1)
    assert [r.status for r in check.results] == ["passed", "passed", "FAILED", "passed", "passed"]
    bad = check.results[2]
    line = next(k for k, ln in enumerate(texts[3].splitlines(), 1) if "Proof." in ln and "step03" not in ln)
    assert bad.error.startswith(f"line {line}: Error"), bad.error
    # one combined file (1, 2, 3, 4: stopped at 3), step 3 alone, then step 4 alone; 5 is 4's twin
    assert len(runs) == 3 and "Module DerivcObligation3" in runs[0] and "Module" not in runs[1] + runs[2], runs
    assert "Section Step03" in runs[1] and "Section Step04" in runs[2]


@pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")
def test_stop_on_failure_leaves_the_rest_not_run(tmp_path: Path):
    tag = len(tmp_path.name)
    texts = {1: obligation(1, f"a + b = b + a + 0 * {tag}"), 2: obligation(2, "a = b + 1"),
             3: obligation(3, f"a * b = b * a + 0 * {tag}")}
    check = proofcheck.check_obligations(_proofs(tmp_path, texts), use_cache=False, stop_on_failure=True, jobs=1)
    assert [r.status for r in check.results] == ["passed", "FAILED", "not run"]
    assert check.failure.failure_line().startswith("step 2 (tile): proof obligation proofs/Step02_TILE.v failed: line")
