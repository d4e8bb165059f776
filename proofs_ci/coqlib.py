"""Drive coqc for the derivc Coq library and for per-step obligation files.

    lib = build_library()                  # compiles proofs_ci/coq in place
    check_obligation("Step03_TILE.v", lib) # coqc -R <lib> Derivc Step03_TILE.v
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

COQ_DIR = Path(__file__).resolve().parent / "coq"
LOGICAL_NAME = "Derivc"


class CoqError(RuntimeError):
    pass


def coqc_available() -> bool:
    return shutil.which("coqc") is not None


def project_files(coq_dir: Path = COQ_DIR) -> list[str]:
    proj = Path(coq_dir) / "_CoqProject"
    return [ln.strip() for ln in proj.read_text().splitlines()
            if ln.strip().endswith(".v") and not ln.strip().startswith("#")]


def _coqc(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["coqc", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def copy_sources(coq_dir: Path, dest: Path) -> Path:
    """Copy the library sources (no build products) to dest."""
    dest = Path(dest)
    shutil.copytree(coq_dir, dest, ignore=shutil.ignore_patterns(
        "*.vo", "*.vok", "*.vos", "*.glob", ".*.aux", ".lia.cache", ".nia.cache", "_build"),
        dirs_exist_ok=True)
    return dest


def build_library(coq_dir: Path = COQ_DIR, out_dir: Path | None = None,
                  examples: bool = False, timeout: float = 300) -> Path:
    """Compile every file of _CoqProject in order (in place, or in a copy at out_dir); with
    `examples`, also the worked obligations (examples/) and the models of the algebra (models/).
    Returns the directory to pass as `-R <dir> Derivc`.  Raises CoqError on failure."""
    src = Path(coq_dir)
    lib = copy_sources(src, Path(out_dir)) if out_dir is not None else src
    files = project_files(lib)
    if examples:
        files += sorted(p.relative_to(lib).as_posix() for p in (lib / "examples").glob("*.v"))
        files += sorted(p.relative_to(lib).as_posix() for p in (lib / "models").glob("*.v"))
    for f in files:
        r = _coqc(["-R", ".", LOGICAL_NAME, f], lib, timeout)
        if r.returncode != 0:
            raise CoqError(f"coqc {f} failed:\n{r.stdout}{r.stderr}")
    return lib


def check_obligation(vfile: Path | str, lib_dir: Path = COQ_DIR,
                     timeout: float = 300) -> subprocess.CompletedProcess:
    """coqc one obligation file against the compiled library (returncode 0 = proved)."""
    vfile = Path(vfile).resolve()
    return subprocess.run(obligation_command(vfile.name, lib_dir), cwd=vfile.parent, capture_output=True,
                          text=True, timeout=timeout)


def obligation_command(vfile_name: str, lib_dir: Path = COQ_DIR) -> list[str]:
    """The coqc command line that checks one obligation file (run in its directory)."""
    return ["coqc", "-R", str(Path(lib_dir).resolve()), LOGICAL_NAME, vfile_name]


def print_assumptions(names: list[str], lib_dir: Path = COQ_DIR,
                      timeout: float = 300) -> dict[str, list[str]]:
    """Axioms each theorem depends on, from Coq's `Print Assumptions`."""
    with tempfile.TemporaryDirectory(prefix="derivc_pa_") as tmp:
        v = Path(tmp) / "PrintAssumptions.v"
        body = ["Require Import Derivc.All."]
        for n in names:
            body.append(f'Goal True. idtac "@@derivc {n}". Abort.')
            body.append(f"Print Assumptions {n}.")
        v.write_text("\n".join(body) + "\n")
        r = check_obligation(v, lib_dir, timeout)
        if r.returncode != 0:
            raise CoqError(f"Print Assumptions failed:\n{r.stdout}{r.stderr}")
    out: dict[str, list[str]] = {}
    current: str | None = None
    in_axioms = False
    for line in r.stdout.splitlines():
        if line.startswith("@@derivc "):
            current, in_axioms = line.split(None, 1)[1].strip(), False
            out[current] = []
        elif current is None:
            continue
        elif line.startswith("Axioms:"):
            in_axioms = True
        elif in_axioms and line and not line[0].isspace():
            out[current].append(line.split(" :")[0].strip())
    missing = [n for n in names if n not in out]
    if missing:
        raise CoqError(f"no Print Assumptions output for {missing}:\n{r.stdout}")
    return out
