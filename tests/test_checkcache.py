"""compiler.checkcache: with $DERIVC_CHECK_CACHE set, a step checked again (same programs, plan,
seed, checking code) reads back the draws its passing check recorded, evaluating nothing; another
seed or another checking code is checked anew; a failing check is not recorded; unset, nothing
is read or written."""
from __future__ import annotations

from pathlib import Path

import pytest

from compiler import checkcache
from compiler import derive as derive_mod
from compiler import draws as draws_mod
from compiler.derive import DerivationError, derive
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
GEMM = ROOT / "examples" / "gemm.yaml"


@pytest.fixture
def evaluations(monkeypatch) -> list[int]:
    """Counts the interpreter runs of the numeric checks (the spec's and the rewritten program's)."""
    calls: list[int] = []
    for mod in (derive_mod, draws_mod):
        run = mod.run_program
        monkeypatch.setattr(mod, "run_program", lambda *a, _run=run, **k: calls.append(1) or _run(*a, **k))
    return calls


def _numeric(seed: int) -> list[dict]:
    return [s.numeric for s in derive(load_spec_file(GEMM), str(GEMM), seed=seed).steps]


def test_a_repeated_check_is_read_back(tmp_path, monkeypatch, evaluations):
    monkeypatch.setenv(checkcache.ENV, str(tmp_path))
    first = _numeric(3)
    assert len(list(tmp_path.glob("*.json"))) == len(first) > 0
    ran = len(evaluations)
    assert ran and _numeric(3) == first
    again = len(evaluations) - ran
    assert again <= 2  # the draw plan's own runs only: no step evaluated again
    assert _numeric(4) != first and len(evaluations) - ran - again > ran // 2  # another seed: checked anew
    assert len(list(tmp_path.glob("*.json"))) == 2 * len(first)


def test_the_key_covers_the_checking_code(tmp_path, monkeypatch, evaluations):
    monkeypatch.setenv(checkcache.ENV, str(tmp_path))
    _numeric(3)
    ran = len(evaluations)
    monkeypatch.setattr(checkcache, "code_digest", lambda: "another interpreter")
    _numeric(3)
    assert len(evaluations) == 2 * ran


def test_a_failing_check_is_not_recorded(tmp_path, monkeypatch, test_rules):
    monkeypatch.setenv(checkcache.ENV, str(tmp_path))
    spec = tmp_path / "bad.yaml"
    spec.write_text(GEMM.read_text().split("schedule:")[0] + "schedule:\n  - {rule: test_corrupt, factor: 1.5}\n")
    for _ in range(2):
        with pytest.raises(DerivationError, match="numeric check failed"):
            derive(load_spec_file(spec), str(spec), seed=3)
    assert not list(tmp_path.glob("*.json"))


def test_unset_nothing_is_recorded(tmp_path, monkeypatch, evaluations):
    monkeypatch.delenv(checkcache.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    _numeric(3)
    ran = len(evaluations)
    _numeric(3)
    assert len(evaluations) == 2 * ran and not list(tmp_path.iterdir())


def test_inside_shared_in_process_a_repeated_check_is_read_from_memory(tmp_path, monkeypatch, evaluations):
    monkeypatch.delenv(checkcache.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(checkcache, "code_digest", lambda: f"this test: {tmp_path}")  # a memory of its own
    with checkcache.shared_in_process():
        first = _numeric(5)
        ran = len(evaluations)
        assert ran and _numeric(5) == first
        assert len(evaluations) - ran <= 2  # the draw plan's own runs only: no step evaluated again
    _numeric(5)  # outside the block: every check runs
    assert len(evaluations) > 2 * ran - 2 and not list(tmp_path.iterdir())


def test_inside_shared_in_process_a_failing_check_runs_every_time(tmp_path, monkeypatch, test_rules):
    monkeypatch.delenv(checkcache.ENV, raising=False)
    spec = tmp_path / "bad.yaml"
    spec.write_text(GEMM.read_text().split("schedule:")[0] + "schedule:\n  - {rule: test_corrupt, factor: 1.5}\n")
    with checkcache.shared_in_process():
        for _ in range(2):
            with pytest.raises(DerivationError, match="numeric check failed"):
                derive(load_spec_file(spec), str(spec), seed=3)
