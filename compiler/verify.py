"""`derivc verify DIR`: check a build directory's proof obligations.

Compiles the Coq proof library (proofs_ci/coq, via proofs_ci.coqlib) into a cache directory,
runs coqc on every DIR/proofs/*.v, and runs `lake env lean` on every .lean when a Lean
toolchain (`lake`) is on PATH — otherwise each Lean obligation is reported as
"not checked: no Lean toolchain", never as passed.  Prints a table, writes
DIR/proofs/verify.json, exits 0 only if every Coq obligation passed, else 4.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .errors import EXIT_OK, EXIT_VERIFY_FAILED

ROOT = Path(__file__).resolve().parent.parent
LEAN_DIR = ROOT / "lean"
NO_LEAN = "not checked: no Lean toolchain"


def _library_digest(coq_dir: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(coq_dir.rglob("*.v")):
        if "examples" in p.relative_to(coq_dir).parts:
            continue
        h.update(p.relative_to(coq_dir).as_posix().encode())
        h.update(p.read_bytes())
    h.update((coq_dir / "_CoqProject").read_bytes())
    return h.hexdigest()[:16]


def coq_library(cache_root: Path | None = None) -> Path:
    """The compiled library directory (built once per library content, cached)."""
    from proofs_ci import coqlib

    src = coqlib.COQ_DIR
    digest = _library_digest(src)
    root = Path(cache_root or os.environ.get("DERIVC_COQ_CACHE") or Path(tempfile.gettempdir()) / "derivc_coq_cache")
    lib = root / digest
    if (lib / "All.vo").exists() and (lib / ".complete").exists():
        return lib
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{digest}.tmp-", dir=root))
    try:
        coqlib.build_library(src, tmp / "coq")
        (tmp / "coq" / ".complete").write_text("ok\n")
        try:
            os.replace(tmp / "coq", lib)
        except OSError:  # another process won the race
            if not (lib / ".complete").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return lib


def check_coq(vfile: Path, lib: Path, timeout: float = 600) -> dict[str, Any]:
    from proofs_ci import coqlib

    t0 = time.monotonic()
    try:
        r = coqlib.check_obligation(vfile, lib, timeout=timeout)
        ok, out = r.returncode == 0, (r.stdout + r.stderr).strip()
    except subprocess.TimeoutExpired:
        ok, out = False, f"coqc timed out after {timeout:.0f} s"
    for aux in vfile.parent.glob(vfile.stem + ".vo*"):
        aux.unlink(missing_ok=True)
    for ext in (".glob", ".vos", ".vok"):
        (vfile.parent / (vfile.stem + ext)).unlink(missing_ok=True)
    (vfile.parent / f".{vfile.stem}.aux").unlink(missing_ok=True)
    return {"passed": ok, "seconds": round(time.monotonic() - t0, 2), "output": out[-4000:]}


def check_lean(lfile: Path, timeout: float = 600) -> dict[str, Any]:
    if shutil.which("lake") is None:
        return {"status": NO_LEAN, "passed": None}
    try:
        r = subprocess.run(["lake", "env", "lean", str(lfile.resolve())], cwd=LEAN_DIR,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "FAILED (timeout)", "passed": False}
    ok = r.returncode == 0
    return {"status": "passed" if ok else "FAILED", "passed": ok,
            "output": (r.stdout + r.stderr).strip()[-4000:]}


def verify_dir(build: Path, jobs: int | None = None) -> tuple[list[dict[str, Any]], bool]:
    proofs = Path(build) / "proofs"
    index_path = proofs / "index.json"
    if not proofs.is_dir():
        raise FileNotFoundError(f"{build}: no proofs/ directory (was it built by derivc build?)")
    index = json.loads(index_path.read_text())["steps"] if index_path.exists() else []
    by_file = {e["files"]["coq"]: e for e in index}
    vfiles = sorted(proofs.glob("Step*.v"))
    if not vfiles:
        raise FileNotFoundError(f"{proofs}: no obligations (Step*.v)")
    lib = coq_library()
    jobs = jobs or max(1, min(len(vfiles), os.cpu_count() or 1))
    with ThreadPoolExecutor(jobs) as pool:
        coq = list(pool.map(lambda v: check_coq(v, lib), vfiles))
    rows = []
    for v, c in zip(vfiles, coq):
        e = by_file.get(v.name, {})
        lf = proofs / e.get("files", {}).get("lean", v.with_suffix(".lean").name)
        lean = check_lean(lf) if lf.exists() else {"status": "missing", "passed": False}
        rows.append({
            "step": e.get("step", v.stem), "rule": e.get("rule", "?"), "kind": e.get("kind", "?"),
            "theorem": e.get("theorem", "?"), "obligation": e.get("status", "?"),
            "coq": "passed" if c["passed"] else "FAILED", "coq_seconds": c["seconds"],
            "coq_output": "" if c["passed"] else c["output"],
            "lean": lean["status"], "file": v.name,
        })
    ok = all(r["coq"] == "passed" for r in rows) and all(
        r["lean"] in ("passed", NO_LEAN) for r in rows)
    return rows, ok


def main(args: Any) -> int:
    build = Path(args.dir)
    from proofs_ci import coqlib

    if not coqlib.coqc_available():
        sys.stderr.write("derivc: error: verify: coqc not found (bash proofs_ci/install_coq.sh)\n")
        return EXIT_VERIFY_FAILED
    try:
        rows, ok = verify_dir(build)
    except (FileNotFoundError, coqlib.CoqError) as exc:
        sys.stderr.write(f"derivc: error: {build}: verify: {' '.join(str(exc).split())[:500]}\n")
        return EXIT_VERIFY_FAILED
    from .cli import Out

    out = Out(plain=getattr(args, "plain", False))
    out.table(["step", "rule", "theorem", "obligation", "Coq", "Lean"],
              [[str(r["step"]), r["rule"], r["theorem"], r["obligation"], r["coq"], r["lean"]] for r in rows],
              title=f"{build}: proof obligations")
    for r in rows:
        if r["coq"] != "passed":
            first = next((ln for ln in r["coq_output"].splitlines() if "Error" in ln), "")
            out.line(f"step {r['step']} ({r['file']}): coqc failed {first}".rstrip(), style="red")
    (build / "proofs" / "verify.json").write_text(json.dumps(
        {"passed": ok, "coq": "coqc", "lean": "lake" if shutil.which("lake") else NO_LEAN,
         "steps": rows}, indent=2) + "\n")
    n_ok = sum(r["coq"] == "passed" for r in rows)
    out.line(f"Coq: {n_ok}/{len(rows)} obligations passed; Lean: "
             + ("checked with lake" if shutil.which("lake") else NO_LEAN),
             style="green" if ok else "red")
    return EXIT_OK if ok else EXIT_VERIFY_FAILED
