"""`derivc verify DIR`: re-check a build directory, trusting nothing in it.

1. Rebuild: the schedule file's text recorded in DIR/derivation.json (checked against its
   recorded sha256) is parsed and derived again with the recorded seed — every precondition
   and numeric check re-runs — and the build's own writer (`compiler.cli.write_outputs`)
   writes every output into a fresh temporary directory, with codegen when DIR's trace has a
   `lowering` step or DIR holds a kernel.cu or a chain's kernels.json (compiler.kernel_chain).
2. Compare: every file of DIR against its rebuilt twin, byte for byte (NOT_COMPARED lists the
   only exceptions, with the reason).  Every missing, extra or altered file is listed; the
   error line names the first.
3. Prove: coqc checks every obligation DIR/proofs holds, in parallel, each one anew: verify
   never takes a pass from the build's proof cache (compiler.proofcheck; only the compiled
   proof library is reused, once every file of it matches the hash recorded when it was
   compiled, and only from a cache that is the user's alone: compiler.coqcache); Lean obligations are checked with `lake env lean` when `lake` is on PATH,
   otherwise reported as "not checked: no Lean toolchain", never as passed.

Prints the results, writes DIR/proofs/verify.json, exits 0 only if nothing differed and every
Coq obligation passed, else 4 (1 when coqc is not installed: nothing is certified; 2 when
DIR is not a directory).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import proofcheck
from .errors import EXIT_INVALID_INPUT, EXIT_OK, EXIT_VERIFY_FAILED, DerivationError, SpecError

EXIT_UNAVAILABLE = 1  # as compiler.cli: a tool this command needs is not installed

ROOT = Path(__file__).resolve().parent.parent
LEAN_DIR = ROOT / "lean"
NO_LEAN = "not checked: no Lean toolchain"
VERIFY_REPORT = "proofs/verify.json"

# The files of a build directory verify does not rebuild and compare, and why.  Every other
# file — derivation.json, program.txt, steps/, proofs/, report.md, kir.txt, plan.json,
# kernel.cu, kernel.cubin, compile.log, sass.json, … — is rebuilt and compared byte for byte.
NOT_COMPARED: dict[str, str] = {
    VERIFY_REPORT: "written by `derivc verify` itself (its last result), not by the build",
}

# Rebuilt and compared like the rest, but made by the CUDA toolchain of the machine verify runs
# on: a different NVRTC or disassembler (or none) shows them as altered.
TOOLCHAIN_SUFFIXES = (".cubin", ".log", "sass.json")


@dataclass(frozen=True)
class Mismatch:
    """One file of DIR that is not what the rebuild writes."""

    path: str  # relative to DIR, posix
    what: str  # missing | extra | altered
    detail: str = ""

    def line(self) -> str:
        text = {"missing": "missing (the build writes it)", "extra": "extra file (the build does not write it)",
                "altered": "altered"}[self.what]
        if self.path.endswith(TOOLCHAIN_SUFFIXES):
            text += " (made by the CUDA toolchain: rebuilt with this machine's NVRTC)"
        return f"{self.path}: {text}" + (f": {self.detail}" if self.detail else "")


# --------------------------------------------------------------------------- rebuild and compare


class RebuildError(Exception):
    """DIR cannot be rebuilt: its trace is unreadable, or its recorded spec no longer builds."""


def _load_trace(build: Path) -> dict[str, Any]:
    path = build / "derivation.json"
    if not path.is_file():
        raise RebuildError("missing (nothing to rebuild from)")
    try:
        trace = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RebuildError(f"not a derivc trace: {exc}") from None
    if not isinstance(trace, dict):
        raise RebuildError("not a derivc trace: not a JSON object")
    text, sha = trace.get("spec_text"), trace.get("spec_file_sha256")
    if not isinstance(text, str):
        raise RebuildError("no spec_text recorded (built by an older derivc, or the spec file changed "
                           "during the build): rebuild it")
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != sha:
        raise RebuildError("spec_text does not match the recorded spec_file_sha256")
    if not isinstance(trace.get("seed"), int) or not isinstance(trace.get("spec_file"), str):
        raise RebuildError("seed or spec_file missing or not of the recorded type")
    return trace


def rebuild(build: Path, into: Path) -> None:
    """Write into `into` (an empty directory) what `derivc build` writes for DIR's recorded spec."""
    from . import __version__
    from .cli import BuildError, ProofPolicy, write_one_or_chain
    from .kernel_chain import MANIFEST as CHAIN_MANIFEST
    from .derive import derive
    from .schedule_variants import expand, resolve
    from .spec import parse_spec_text

    trace = _load_trace(build)
    file = trace["spec_file"]
    try:
        full = parse_spec_text(trace["spec_text"], file)
        variants = expand(full)
        if isinstance(trace.get("variant"), dict):  # the default of a schedule with variants
            spec = resolve(full, trace["variant"])
        else:
            spec = full
        d = derive(spec, file, seed=trace["seed"])
        if spec is not full:
            d.variant_choice = dict(trace["variant"])
    except (SpecError, DerivationError) as exc:
        made = trace.get("derivc_version")
        note = f" (made by derivc {made}, this is {__version__})" if made != __version__ else ""
        raise RebuildError(f"the recorded spec no longer derives{note}: {exc.message()}") from None
    d.seed_given = bool(trace.get("seed_given"))
    d.spec_text = trace["spec_text"]  # write_trace records it instead of reading spec_file
    steps = trace.get("steps") if isinstance(trace.get("steps"), list) else []
    codegen = (build / "kernel.cu").exists() or (build / CHAIN_MANIFEST).exists() or any(isinstance(s, dict) and s.get("rule") == "lowering" for s in steps)
    recorded = proofcheck.from_trace(trace)
    if recorded is None:
        raise RebuildError("no readable proof record (proofs / steps[].proof): rebuild it")
    try:
        write_one_or_chain(d, into, codegen=codegen, proofs=recorded.reason != proofcheck.SKIPPED,
                           policy=ProofPolicy(recorded=recorded))
        if spec.grad is not None:  # the backward kernels, each with its own recorded proof check
            from .cli import write_backward
            from .derive_grad import derive_gradient

            backward = derive_gradient(spec, file, seed=trace["seed"])
            for k in backward.kernels:
                k.seed_given, k.spec_text = d.seed_given, d.spec_text

            def policy(kernel: str) -> ProofPolicy:
                sub = _load_trace(build / "grad" / kernel) if kernel and (build / "grad" / kernel).is_dir() else trace
                return ProofPolicy(recorded=proofcheck.from_trace(sub) or recorded)

            write_backward(backward, into, codegen=codegen, proofs=recorded.reason != proofcheck.SKIPPED, policy=policy)
        if len(variants) > 1:
            from .cli import write_marker
            from .outdir import BUILD_MARKER
            from .variant_build import write_variants

            def write_one(dv: Any, sub: Path) -> None:
                there = build / sub.relative_to(into)
                rec = proofcheck.from_trace(_load_trace(there)) if there.is_dir() else None
                write_one_or_chain(dv, sub, codegen=codegen, proofs=recorded.reason != proofcheck.SKIPPED,
                                   policy=ProofPolicy(recorded=rec or recorded))

            write_variants(variants[0], variants[1:], into, file=file, seed=trace["seed"], seed_given=d.seed_given,
                           write=write_one, spec_text=trace["spec_text"])
            write_marker(into, BUILD_MARKER)
    except (SpecError, DerivationError, BuildError) as exc:
        raise RebuildError(f"the recorded spec no longer builds: {' '.join(str(exc).split())}") from None


def _files(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def _first_json_difference(got: Any, want: Any, where: str = "") -> str:
    if isinstance(got, dict) and isinstance(want, dict):
        for k in list(want) + [k for k in got if k not in want]:
            if got.get(k, ...) != want.get(k, ...):
                return _first_json_difference(got.get(k), want.get(k), f"{where}.{k}" if where else str(k))
    elif isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        for k, (a, b) in enumerate(zip(got, want)):
            if a != b:
                return _first_json_difference(a, b, f"{where}[{k}]")
    return where or "the whole document"


def _describe(rel: str, got: bytes, want: bytes) -> str:
    if rel.endswith(".json"):
        try:
            return f"{_first_json_difference(json.loads(got), json.loads(want))} differs from the rebuild"
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "not the JSON the build writes"
    try:
        a, b = got.decode("utf-8").splitlines(), want.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return (f"sha256 {hashlib.sha256(got).hexdigest()[:16]}, rebuilt "
                f"{hashlib.sha256(want).hexdigest()[:16]}")
    line = next((k for k, (x, y) in enumerate(zip(a, b), start=1) if x != y), min(len(a), len(b)) + 1)
    return f"line {line} differs from the rebuild"


def _report_order(rel: str) -> tuple[int, str]:
    """derivation.json first (everything is rebuilt from it), then path order, hidden files
    (the build's marker, a list of the other files' hashes) last."""
    return (0 if rel == "derivation.json" else 2 if rel.startswith(".") else 1, rel)


def compare_dirs(build: Path, rebuilt: Path) -> tuple[list[Mismatch], int]:
    """Every file of `build` that is missing, extra or altered against `rebuilt` (in report
    order), and the number of files found identical."""
    have, want = _files(build), _files(rebuilt)
    out: list[Mismatch] = []
    same = 0
    for rel in sorted(set(have) | set(want), key=_report_order):
        if rel in NOT_COMPARED:
            continue
        if rel not in have:
            out.append(Mismatch(rel, "missing"))
        elif rel not in want:
            out.append(Mismatch(rel, "extra"))
        elif have[rel].is_symlink() or not have[rel].is_file():
            out.append(Mismatch(rel, "altered", "a link, not a file the build writes"))
        else:
            got, expect = have[rel].read_bytes(), want[rel].read_bytes()
            if got != expect:
                out.append(Mismatch(rel, "altered", _describe(rel, got, expect)))
            else:
                same += 1
    return out, same


def _tuning_into(build: Path, rebuilt: Path) -> Mismatch | None:
    """A tuned DIR: its tuning.json (measurements, not rebuilt) must name only variants the
    rebuild built, each the fastest of its row; then it joins the rebuild, marker and all."""
    from .outdir import BUILD_MARKER, write_marker
    from .tuning_table import TUNING_FILE, read_tuning
    from .variant_build import built_dirs

    if not (build / TUNING_FILE).exists():
        return None
    built = set(built_dirs(rebuilt))
    try:
        read_tuning(build, built)
    except ValueError as exc:
        return Mismatch(TUNING_FILE, "altered", str(exc).split(": ", 1)[-1])
    shutil.copyfile(build / TUNING_FILE, rebuilt / TUNING_FILE)
    write_marker(rebuilt, BUILD_MARKER)
    return None


def check_files(build: Path) -> tuple[list[Mismatch], int]:
    """Rebuild DIR from its recorded spec into a temporary directory and compare every file."""
    tmp = Path(tempfile.mkdtemp(prefix="derivc-verify-"))
    try:
        try:
            rebuild(build, tmp)
        except RebuildError as exc:
            return [Mismatch("derivation.json", "altered", str(exc))], 0
        tuned = _tuning_into(build, tmp)
        if tuned is not None:
            return [tuned], 0
        return compare_dirs(build, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def spec_origin(build: Path) -> str:
    """Which schedule file DIR was built from, and whether the file at that path still has the
    recorded text (information only: the file may have moved; the recorded text is what counts)."""
    try:
        trace = _load_trace(build)
    except RebuildError:
        return ""
    file, sha = trace["spec_file"], trace["spec_file_sha256"]
    try:
        now = hashlib.sha256(Path(file).read_bytes()).hexdigest()
        state = "the file there now is the same" if now == sha else "the file there now DIFFERS"
    except OSError:
        state = "no such file here"
    return f"spec: built from {file} (sha256 {sha[:16]}…; {state})"


# --------------------------------------------------------------------------- proof obligations


def coq_library(cache_root: Path | None = None) -> Path:
    """The compiled library directory (built once per library content and coqc version, its
    files checked against their recorded hashes at every use; compiled privately in a temporary
    directory when the cache is not the user's alone: compiler.coqcache)."""
    return proofcheck.library(cache_root).path


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


def verify_dir(build: Path, jobs: int | None = None, rel_to: Path | None = None) -> tuple[list[dict[str, Any]], bool]:
    """coqc (and lake, if present) on every obligation of DIR/proofs: one row per step.
    Errors name paths under `rel_to` (the directory `build` is a copy of), if given."""
    proofs = Path(build) / "proofs"
    index_path = proofs / "index.json"
    shown = Path(rel_to or build) / "proofs"
    if not proofs.is_dir():
        raise FileNotFoundError(f"{rel_to or build}: no proofs/ directory (was it built by derivc build?)")
    try:
        payload = json.loads(index_path.read_text()) if index_path.exists() else {"steps": []}
        by_file = {e["files"]["coq"]: e for e in payload["steps"]}
        if payload.get("safety") and payload["safety"]["files"]:  # the final program's safety obligation (none: only listed)
            by_file[payload["safety"]["files"]["coq"]] = {**payload["safety"], "rule": proofcheck.SAFETY}
    except (ValueError, TypeError, KeyError) as exc:
        raise FileNotFoundError(f"{shown / index_path.name}: not the index the build writes ({exc})") from None
    vfiles = sorted(proofs.glob("Step*.v"))
    if not vfiles:
        raise FileNotFoundError(f"{shown}: no obligations (Step*.v)")
    # verify trusts nothing: no cached pass, every obligation checked by coqc again
    check = proofcheck.check_obligations(proofs, use_cache=False, stop_on_failure=False, jobs=jobs)
    by_name = {r.file: r for r in check.results}
    missing = proofcheck.ObligationResult(0, "?", "", "FAILED", error="not in proofs/index.json")
    coq = [by_name.get(v.name, missing) for v in vfiles]
    rows = []
    for v, c in zip(vfiles, coq):
        e = by_file.get(v.name, {})
        lf = proofs / e.get("files", {}).get("lean", v.with_suffix(".lean").name)
        lean = check_lean(lf) if lf.exists() else {"status": "missing", "passed": False}
        rows.append({
            "step": e.get("step", c.step if c.file else v.stem), "rule": e.get("rule", "?"), "kind": e.get("kind", "?"),
            "theorem": e.get("theorem", "?"), "obligation": e.get("status", "?"),
            "coq": c.status, "coq_seconds": c.seconds, "coq_output": c.error,
            "lean": lean["status"], "file": v.name,
        })
    ok = all(r["coq"] == "passed" for r in rows) and all(
        r["lean"] in ("passed", NO_LEAN) for r in rows)
    return rows, ok


def check_copy(build: Path) -> tuple[list[dict[str, Any]], bool]:
    """`verify_dir` on a temporary copy of DIR/proofs: coqc's by-products (.vo, .glob,
    .lia.cache, …) never land in DIR."""
    if not (build / "proofs").is_dir():
        raise FileNotFoundError(f"{build}: no proofs/ directory (was it built by derivc build?)")
    tmp = Path(tempfile.mkdtemp(prefix="derivc-verify-proofs-"))
    try:
        shutil.copytree(build / "proofs", tmp / "proofs", symlinks=True,
                        ignore=shutil.ignore_patterns(Path(VERIFY_REPORT).name))
        return verify_dir(tmp, rel_to=build)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _coq_failure(r: dict[str, Any]) -> str:
    path = r["file"] if "/" in r["file"] else f"proofs/{r['file']}"
    return f"step {r['step']} ({r['rule']}): proof obligation {path} failed: {r['coq_output']}"


def proof_dirs(build: Path) -> list[Path]:
    """DIR, then a backward's grad/ (grad.schedule's obligations) and grad/<kernel>/ (each
    backward kernel's): every directory whose proofs/ verify checks."""
    grad = build / "grad"
    more = [grad] if (grad / "proofs").is_dir() else []
    if grad.is_dir():
        more += sorted(p for p in grad.iterdir() if p.is_dir() and p.name != "proofs")
    return [build] + more


def _lean_summary() -> str:
    return "checked with lake" if shutil.which("lake") else NO_LEAN


def coqc_available() -> bool:
    return proofcheck.coqc_path() is not None


# --------------------------------------------------------------------------- the command


def main(args: Any) -> int:
    build = Path(args.dir)
    from proofs_ci import coqlib

    from .cli import Out

    def fail(reason: str) -> int:
        sys.stderr.write(f"derivc: error: {build}: verify: {' '.join(reason.split())[:500]}\n")
        return EXIT_VERIFY_FAILED

    if not build.is_dir():  # bad input, not a failed verification
        what = "not a directory" if build.exists() else "no such directory"
        sys.stderr.write(f"derivc: error: {build}: verify: {what}\n")
        return EXIT_INVALID_INPUT
    out = Out(plain=getattr(args, "plain", False))
    mismatches, same = check_files(build)
    if mismatches:
        for m in mismatches[:20]:
            out.line(m.line(), style="red")
        if len(mismatches) > 20:
            out.line(f"… and {len(mismatches) - 20} more", style="red")
        out.line(f"files: {len(mismatches)} differ from a rebuild from the recorded spec, {same} identical",
                 style="red")
    else:
        out.line(f"files: all {same} identical to a rebuild from the recorded spec "
                 f"(not compared: {', '.join(NOT_COMPARED)})", style="green")

    origin = spec_origin(build)
    if origin:
        out.line(origin)
    if not coqlib.coqc_available():  # the CLI refuses earlier (exit 1); callers of main() land here
        if mismatches:
            return fail(mismatches[0].line() + "; and coqc not found: the obligations were not checked")
        sys.stderr.write(f"derivc: error: {build}: verify: not available: coqc not found (install Coq 8.16: "
                         "bash proofs_ci/install_coq.sh); the obligations were not checked\n")
        return EXIT_UNAVAILABLE
    rows: list[dict[str, Any]] = []
    proof_error = ""
    coq_ok = True
    for where in proof_dirs(build):
        try:
            got, ok = check_copy(where)
        except (FileNotFoundError, proofcheck.CoqLibraryError, proofcheck.BadIndex) as exc:
            coq_ok, proof_error = False, proof_error or " ".join(str(exc).split())
            continue
        prefix = where.relative_to(build).as_posix()
        rows += [{**r, "step": f"{prefix}/{r['step']}" if prefix != "." else r["step"],
                  "file": f"{prefix}/proofs/{r['file']}" if prefix != "." else r["file"]} for r in got]
        coq_ok = coq_ok and ok
    if rows:
        out.table(["step", "rule", "theorem", "obligation", "Coq", "Lean"],
                  [[str(r["step"]), r["rule"], r["theorem"], r["obligation"], r["coq"], r["lean"]] for r in rows],
                  title=f"{build}: proof obligations")
        for r in rows:
            if r["coq"] != "passed":
                out.line(_coq_failure(r), style="red")
        n_ok = sum(r["coq"] == "passed" for r in rows)
        out.line(f"Coq: {n_ok}/{len(rows)} obligations passed; Lean: {_lean_summary()}",
                 style="green" if coq_ok else "red")
    ok = coq_ok and not mismatches
    if (build / "proofs").is_dir() and not (build / VERIFY_REPORT).is_symlink():
        (build / VERIFY_REPORT).write_text(json.dumps({
            "passed": ok, "coq": "coqc", "lean": "lake" if shutil.which("lake") else NO_LEAN,
            "files": {"identical": same, "mismatches": [m.line() for m in mismatches],
                      "not_compared": NOT_COMPARED},
            "steps": rows}, indent=2) + "\n")
    if mismatches:
        return fail(mismatches[0].line())
    if proof_error:
        return fail(proof_error)
    if not coq_ok:
        failed = [r for r in rows if r["coq"] != "passed"]
        return fail(_coq_failure(failed[0]) if failed else "a Lean obligation failed")
    return EXIT_OK
