"""The proof library (lean/ and proofs_ci/coq/): names, integrity, Coq check, mutations.

Coq parts are skipped when coqc is absent (install: proofs_ci/install_coq.sh).
The Lean library cannot be built here (no toolchain); CI builds it
(.github/workflows/lean.yml).  Here it is only checked statically.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a bare checkout

from proofs_ci import coqlib  # noqa: E402
from proofs_ci import theorems as th  # noqa: E402

needs_coq = pytest.mark.skipif(not coqlib.coqc_available(), reason="coqc not installed")


def _copy_libraries(tmp_path: Path) -> Path:
    """A scratch repo root holding copies of both libraries (sources only)."""
    root = tmp_path / "repo"
    coqlib.copy_sources(ROOT / "proofs_ci" / "coq", root / "proofs_ci" / "coq")
    shutil.copytree(ROOT / "lean", root / "lean", ignore=shutil.ignore_patterns(".lake"))
    return root


# ----------------------------------------------------------------------------- static

def test_rule_table_shape():
    assert set(th.RULE_THEOREMS) == {"TILE", "REORDER", "SPLIT", "FUSE", "CACHE", "PARALLEL",
                                     "ASSOC", "SPLIT_SOFTMAX", "ONLINE_AGG", "MASK", "MAP_MMA",
                                     "RECOMPUTE", "SOFTMAX_BWD_ROWTERM", "SOFTMAX_VJP", "FOLD_STAT", "SPLIT_KV",
                                     "SPLIT_K", "FUSE_SUMS", "MASK_DATA"}
    assert set(th.RULE_FILES) == set(th.RULE_THEOREMS)
    for names in th.RULE_THEOREMS.values():
        assert names and all(isinstance(n, str) for n in names)


def test_same_rule_theorem_names_in_both_libraries():
    lean, coq = th.lean_theorems(ROOT), th.coq_theorems(ROOT)
    assert th.ALL_RULE_THEOREMS <= lean
    assert th.ALL_RULE_THEOREMS <= coq
    assert th.check_same(lean, coq) == []
    assert th.rule_file_errors(ROOT) == []


def test_check_same_reports_missing_names():
    lean, coq = th.lean_theorems(ROOT), th.coq_theorems(ROOT)
    errs = th.check_same(lean - {"softmax_split"}, coq - {"mma_tile"})
    assert any("softmax_split" in e and "Lean" in e for e in errs)
    assert any("mma_tile" in e and "Coq" in e for e in errs)


def test_integrity_clean():
    assert th.integrity_errors(ROOT) == []


def test_cli_exit_code():
    assert th.main(["--root", str(ROOT)]) == 0


def test_comments_do_not_count():
    assert th.strip_coq_comments("a (* Admitted (* nested *) admit *) b") == "a  b"
    assert "sorry" not in th.strip_lean_comments("x -- sorry\n/- sorry /- nested -/ -/ y")


@pytest.mark.parametrize("lib,rel,old,new", [
    ("coq", "proofs_ci/coq/Rules/Split.v", "Proof. exact sumTo_app. Qed.", "Proof. Admitted."),
    ("coq", "proofs_ci/coq/Rules/Fuse.v", "Require Import Arith.", "Axiom cheat : False."),
    ("lean", "lean/Derivc/Rules/Split.lean", "  sumTo_app a b f", "  sorry"),
    ("lean", "lean/Derivc/Rules/Fuse.lean", "import Derivc.Sum", "import Mathlib"),
])
def test_integrity_catches_cheats(tmp_path, lib, rel, old, new):
    root = _copy_libraries(tmp_path)
    p = root / rel
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new, 1))
    assert th.integrity_errors(root), f"integrity check missed `{new}` in {rel}"
    assert th.main(["--root", str(root)]) != 0


def test_missing_rule_theorem_fails(tmp_path):
    root = _copy_libraries(tmp_path)
    p = root / "lean/Derivc/Rules/Reorder.lean"
    p.write_text(p.read_text().replace("theorem sumTo_swap", "theorem sumTo_swap'"))
    assert th.main(["--root", str(root)]) != 0


def test_lean_project_layout():
    lean = ROOT / "lean"
    toml = (lean / "lakefile.toml").read_text()
    assert 'name = "derivc"' in toml and 'name = "Derivc"' in toml
    assert "autoImplicit = false" in toml
    tc = (lean / "lean-toolchain").read_text().strip()
    assert tc.startswith("leanprover/lean4:v4.") and "rc" not in tc
    for rule, (_, lean_f) in th.RULE_FILES.items():
        assert (ROOT / lean_f).exists(), lean_f
    for p in th.lean_library_files(ROOT):
        assert len(p.read_text().splitlines()) < 600, p
    for p in th.coq_library_files(ROOT, include_examples=True):
        assert len(p.read_text().splitlines()) < 600, p


# ----------------------------------------------------------------------------- coq

@pytest.fixture(scope="module")
def built_lib(tmp_path_factory):
    if not coqlib.coqc_available():
        pytest.skip("coqc not installed")
    out = tmp_path_factory.mktemp("coqlib") / "coq"
    return coqlib.build_library(ROOT / "proofs_ci" / "coq", out, examples=True)


@needs_coq
def test_coq_library_compiles_with_examples(built_lib):
    for f in coqlib.project_files(built_lib):
        assert (built_lib / f).with_suffix(".vo").exists(), f
    assert (built_lib / "examples" / "ExampleTile.vo").exists()
    assert (built_lib / "examples" / "ExampleOnline.vo").exists()
    # the algebra has models: the intended one (reals) and GF(2) (what is not provable about -inf)
    assert (built_lib / "models" / "ModelReals.vo").exists()
    assert (built_lib / "models" / "ModelRat.vo").exists()


@needs_coq
def test_coq_only_funext_assumed(built_lib):
    report = coqlib.print_assumptions(sorted(th.ALL_RULE_THEOREMS), built_lib)
    assert set(report) == set(th.ALL_RULE_THEOREMS)
    for name, axioms in report.items():
        assert set(axioms) <= th.ALLOWED_COQ_AXIOMS, (name, axioms)
    assert report["sumTo_tile"] == [] and report["online_agg"] == []


@needs_coq
def test_obligation_checks_and_corrupted_obligation_fails(built_lib, tmp_path):
    src = (ROOT / "proofs_ci/coq/examples/ExampleTile.v").read_text()
    good = tmp_path / "Step03_TILE.v"
    good.write_text(src)
    r = coqlib.check_obligation(good, built_lib)
    assert r.returncode == 0, r.stdout + r.stderr
    # corrupt the rewritten program: swap outer/inner index in the tiled body
    bad = tmp_path / "Step03_TILE_bad.v"
    corrupted = src.replace("then mul (A i (o * 64 + jj)) (B (o * 64 + jj) k)",
                            "then mul (A i (jj * 64 + o)) (B (o * 64 + jj) k)", 1)
    assert corrupted != src
    bad.write_text(corrupted)
    r = coqlib.check_obligation(bad, built_lib)
    assert r.returncode != 0


@needs_coq
def test_corrupted_theorem_statement_fails(tmp_path):
    lib = coqlib.copy_sources(ROOT / "proofs_ci" / "coq", tmp_path / "coq")
    tile = lib / "Rules" / "Tile.v"
    text = tile.read_text()
    stmt = "sumTo (n * t) f = sumTo n (fun o => sumTo t (fun i => f (o * t + i)))."
    assert stmt in text
    tile.write_text(text.replace(stmt, stmt.replace("f (o * t + i)", "f (i * t + o)"), 1))
    with pytest.raises(coqlib.CoqError) as ei:
        coqlib.build_library(lib)
    assert "Tile.v" in str(ei.value)


@needs_coq
def test_admitted_compiles_but_integrity_fails(tmp_path):
    # coqc alone accepts Admitted; the integrity scan is what rejects it
    root = _copy_libraries(tmp_path)
    split = root / "proofs_ci/coq/Rules/Split.v"
    split.write_text(split.read_text().replace("Proof. exact sumTo_app. Qed.", "Proof. Admitted."))
    coqlib.build_library(root / "proofs_ci" / "coq")
    assert any("Admitted" in e for e in th.integrity_errors(root))


def test_every_compiler_rule_cites_theorems_in_both_libraries():
    from proofs_ci.theorems import compiler_rule_errors, repo_root

    assert compiler_rule_errors(repo_root()) == []


def test_a_rule_citing_a_missing_theorem_is_reported(monkeypatch):
    from compiler.rules import RULES
    from proofs_ci.theorems import compiler_rule_errors, repo_root

    monkeypatch.setattr(type(RULES["split"]), "theorem", "sumTo_split_typo")
    assert any("sumTo_split_typo" in e for e in compiler_rule_errors(repo_root()))


# ----------------------------------------------------------------------------- -inf and the Lean mirror

def test_ninf_is_not_a_ring_element():
    """-inf is a constructor of ext R, not a field of the ring class: no ring law mentions it."""
    algebra = th.strip_coq_comments((ROOT / "proofs_ci/coq/Algebra.v").read_text())
    klass = algebra[algebra.index("Class KAlg"):algebra.index("}.")]
    assert "ninf" not in klass and "NInf" not in klass
    assert "| NInf : ext R" in algebra and "undef : R" in klass


def test_obligation_lemmas_exist_in_lean():
    used = th.obligation_lemmas(ROOT)
    # the lemmas and tactics the exporter's proofs and the Coq tactics name
    assert {"online_agg_guard", "online_max_ok", "softmaxAtG_shift", "foldN_trunc_eq",
            "maxTo_NInf_inv", "derivc_congr", "derivc_mnext", "derivc_valid"} <= used
    assert th.obligation_lemma_errors(ROOT) == []


def test_missing_obligation_lemma_in_lean_fails(tmp_path):
    root = _copy_libraries(tmp_path)
    for f in th.OBLIGATION_SOURCES:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, root / f)
    p = root / "lean/Derivc/Tactics.lean"
    p.write_text(p.read_text().replace("theorem foldN_trunc_eq", "theorem foldN_trunc_eq'"))
    errs = th.obligation_lemma_errors(root)
    assert any("foldN_trunc_eq" in e for e in errs)
    assert th.main(["--root", str(root)]) != 0


def test_theorems_cli_compares_obligation_lemmas():
    import subprocess

    r = subprocess.run([sys.executable, "-m", "proofs_ci.theorems"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "obligation lemmas:" in r.stdout and "missing from Lean: 0" in r.stdout


def test_lean_congruence_tactic_is_not_the_old_stub():
    tactics = (ROOT / "lean/Derivc/Tactics.lean").read_text()
    assert "first | rfl | omega))" not in tactics  # the old derivc_congr that closed nothing
    for name in ("derivc_congr", "derivc_kill_masked", "derivc_valid", "derivc_mnext", "derivc_ring"):
        assert f'"{name}"' in tactics, name
