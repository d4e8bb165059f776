"""A non-editable install carries everything derivc needs (issue 10, item 5): the wheel is
built, installed into a fresh venv, and `derivc build` + `derivc verify` and
`python -m proofs_ci.theorems` run there, away from the checkout.  (Not marked slow: CI runs
it; about a minute on 2 cores, most of it coqc.)"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from derivc_testing import ROOT

PACKAGE_ROOTS = ("derivc", "compiler", "codegen", "proofs_ci")
NOT_SHIPPED = (".git", "build", "dist", "*.egg-info", "__pycache__", "*.vo", "*.vok", "*.vos", "*.glob", ".*.aux",
               ".lia.cache", ".nia.cache", ".lake", "out", "tests", "devtools", ".hypothesis", ".pytest_cache",
               "*.whl", ".venv", "bench-out")


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_python_package_is_listed():
    listed = set(_config()["packages"])
    found = {p.parent.relative_to(ROOT).as_posix().replace("/", ".")
             for root in PACKAGE_ROOTS for p in (ROOT / root).rglob("__init__.py")
             if "__pycache__" not in p.parts}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert "lean" in listed  # the Lean library, a data package beside compiler/


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a clean copy of the checkout (no stale build/ directory)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    isolation = [] if importlib.util.find_spec("wheel") is None else ["--no-build-isolation"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", str(tmp / "dist"), str(src)], tmp, env)
    (whl,) = (tmp / "dist").glob("derivc-*.whl")
    return whl


def test_wheel_contents(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    coq = {p.relative_to(ROOT).as_posix() for p in (ROOT / "proofs_ci" / "coq").rglob("*.v")}
    lean = {p.relative_to(ROOT).as_posix() for p in (ROOT / "lean").rglob("*.lean") if ".lake" not in p.parts}
    templates = {p.relative_to(ROOT).as_posix() for p in (ROOT / "codegen" / "mappings" / "templates").rglob("*.j2")}
    for group in (coq, lean, templates, {"proofs_ci/coq/_CoqProject", "lean/lakefile.toml", "lean/lean-toolchain",
                                         "codegen/mappings/__init__.py", "compiler/names.py"}):
        assert group and group <= names, sorted(group - names)
    assert not [n for n in names if n.endswith((".vo", ".glob", ".pyc")) or n.startswith(("tests/", "devtools/"))]


def test_installed_wheel_builds_and_verifies(wheel: Path, tmp_path: Path):
    assert shutil.which("coqc"), "derivc verify needs coqc: install Coq as README's set-up says"
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], tmp_path, env)
    py, derivc = venv / "bin" / "python", venv / "bin" / "derivc"
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], tmp_path, env)
    work = tmp_path / "elsewhere"  # not the checkout: nothing may be found through the cwd
    work.mkdir()
    where = _run([str(py), "-c", "import compiler, codegen, proofs_ci, lean; print(compiler.__file__)"], work, env)
    assert where.stdout.strip().startswith(str(venv)), where.stdout
    spec = work / "gemm.yaml"
    shutil.copy(ROOT / "examples" / "gemm.yaml", spec)
    _run([str(derivc), "build", str(spec), "--no-codegen", "-o", "X", "--seed", "0"], work, env)
    verify = _run([str(derivc), "--plain", "verify", "X"], work, env)
    assert "obligations passed" in verify.stdout
    theorems = _run([str(py), "-m", "proofs_ci.theorems"], work, env)
    assert "problems: 0" in theorems.stdout
