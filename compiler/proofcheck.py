"""coqc on a build's proof obligations: in parallel, cached per obligation, failing fast.

`derivc build` checks every `proofs/StepNN_<rule>.v` it exports whenever coqc is on PATH
(`start_check` before codegen, `PendingCheck.result` before the build directory is swapped in);
`derivc verify` and `build --verify` use the same checker with the cache bypassed.

* Pool: one coqc process per core (`os.sched_getaffinity`), obligations started in step order.
  With `stop_on_failure`, the first failure kills the running coqc processes and the build
  reports it at once.
* Cache (compiler.coqcache): `$DERIVC_COQ_CACHE`, else `$DERIVC_CACHE_DIR/coq`, else
  `~/.cache/derivc/coq`, private to the user (0700, refused — said once on stderr, and the check
  goes on without it — when someone else could write it).  The Coq library (proofs_ci/coq) is
  compiled once per content and coqc version into `lib-<digest>/` and checked against its
  manifest's hashes at every use; an obligation that passed is recorded under a MAC of its key
  (key = sha256 of the obligation text, the library's sources and compiled files, and the coqc
  version).  Entries are written to a temp file and moved into place (readers never see half a
  file); only passes are cached.  Pass records are read by `derivc build` only; `derivc verify`
  and `build --verify` run coqc on every obligation (identical ones once per process).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import coqcache
from .coqcache import CoqLibrary, CoqLibraryError, UnsafeCache, cache_root  # noqa: F401 (part of this API)

# Bounds per coqc process, far above what the slowest correct obligation of the examples
# needs (~30 s of CPU, < 1 GB): they only stop a runaway proof search on a FALSE obligation
# (conversion unfolding an 8192-column sum took minutes and 14 GB before failing).  CPU time,
# not wall time, so that a loaded machine does not turn a slow true proof into a failure; the
# wall-clock limit is a backstop for a coqc that waits on nothing.
COQC_CPU_LIMIT_S = 300
COQC_MEMORY_LIMIT_KB = 6 * 1024 * 1024
COQC_TIMEOUT_S = 1800.0
CACHE_FORMAT = 1
NO_COQC = "coqc not found"
SKIPPED = "--no-proofs"
OBLIGATION_FILE = re.compile(r"Step[0-9]+_[A-Za-z0-9_]+\.v")


class BadIndex(ValueError):
    """proofs/index.json is not what the build writes (verify trusts nothing in DIR)."""


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ObligationResult:
    """coqc's verdict on one obligation file."""

    step: int
    rule: str
    file: str
    status: str  # passed | FAILED | not run (a failure elsewhere stopped the check)
    cached: bool = False
    seconds: float = 0.0
    error: str = ""  # coqc's first error line, with its line number

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def record(self, by: str) -> dict[str, Any]:
        """derivation.json's `proof` of this step (for a build that passed, every step)."""
        return {"checked": True, "by": by, "cached": self.cached, "seconds": self.seconds}

    def failure_line(self) -> str:
        return f"step {self.step} ({self.rule}): proof obligation proofs/{self.file} failed: {self.error}"


SAFETY = "safety"  # the final program's safety obligation (index.json's `safety`), not a step's


@dataclass(frozen=True)
class ProofCheck:
    """What a build did about its proof obligations.  `recorded`: derivation.json's record of
    an earlier check (its `proofs` and each step's `proof`), written back as it was."""

    checked: bool
    by: str = ""  # "coqc 8.16.1"
    reason: str = ""  # why not checked
    results: tuple[ObligationResult, ...] = ()
    seconds: float = 0.0  # wall time from the start of the check to the end of its last coqc
    jobs: int = 0
    recorded: tuple[dict[str, Any], dict[int, dict[str, Any]]] | None = None

    @property
    def failure(self) -> ObligationResult | None:
        return next((r for r in self.results if r.status == "FAILED"), None)

    def step_record(self, step: int) -> dict[str, Any]:
        """derivation.json's `proof` of step `step`."""
        if self.recorded is not None:
            return self.recorded[1].get(step, {"checked": False, "reason": "no obligation exported"})
        if not self.checked:
            return {"checked": False, "reason": self.reason}
        r = next((r for r in self.results if r.step == step and r.rule != SAFETY), None)
        return r.record(self.by) if r is not None else {"checked": False, "reason": "no obligation exported"}

    def summary(self) -> dict[str, Any]:
        """derivation.json's top-level `proofs`."""
        if self.recorded is not None:
            return self.recorded[0]
        if not self.checked:
            return {"checked": False, "reason": self.reason}
        out = {"checked": True, "by": self.by, "obligations": len(self.results),
               "cached": sum(r.cached for r in self.results), "jobs": self.jobs, "seconds": self.seconds}
        safety = next((r for r in self.results if r.rule == SAFETY), None)
        if safety is not None:
            out["safety"] = safety.record(self.by) | {"file": safety.file}
        return out

    def line(self) -> str:
        """The console's and report.md's one line (of a check that passed, or did not run)."""
        top = self.summary()
        if not top["checked"]:
            return f"proofs not checked: {top['reason']}"
        cached = f", {top['cached']} from the cache" if top["cached"] else ""
        n = top["obligations"]
        return f"proofs: {n}/{n} obligations checked by {top['by']}{cached} in {top['seconds']:.1f} s"


def not_checked(reason: str) -> ProofCheck:
    return ProofCheck(checked=False, reason=reason)


def from_trace(trace: dict[str, Any]) -> ProofCheck | None:
    """The check a derivation.json records, to be written back as it is (`derivc verify`'s
    rebuild: timings and cache hits belong to the build machine, and verify runs coqc itself);
    None when it records none, or not in the shape the build writes."""
    top = trace.get("proofs")
    if not isinstance(top, dict) or not isinstance(top.get("checked"), bool):
        return None
    if top["checked"]:
        shapes = {"by": str, "obligations": int, "cached": int, "seconds": (int, float)}
        if not all(isinstance(top.get(k), t) for k, t in shapes.items()):
            return None
    elif not isinstance(top.get("reason"), str):
        return None
    steps = {s["index"]: s["proof"] for s in trace.get("steps") or []
             if isinstance(s, dict) and isinstance(s.get("index"), int) and isinstance(s.get("proof"), dict)}
    return ProofCheck(top["checked"], reason=str(top.get("reason", "")), recorded=(top, steps))


def attach(trace: dict[str, Any], check: ProofCheck) -> dict[str, Any]:
    """derivation.json with the proof check recorded: top-level `proofs` and each rule step's
    `proof` (the codegen steps, lowering and kernel, have no obligation)."""
    from .trace import CODEGEN_STEPS

    for s in trace.get("steps", []):
        if isinstance(s, dict) and isinstance(s.get("index"), int) and s.get("rule") not in CODEGEN_STEPS:
            s["proof"] = check.step_record(s["index"])
    trace["proofs"] = check.summary()
    return trace


# --------------------------------------------------------------------------- coqc and its library


def coqc_path() -> str | None:
    return shutil.which("coqc")


_VERSIONS: dict[str, str] = {}


def coqc_version() -> str:
    """`coqc 8.16.1` (asked once per process and coqc binary)."""
    path = coqc_path()
    if path is None:
        raise FileNotFoundError(NO_COQC)
    if path not in _VERSIONS:
        r = subprocess.run([path, "--print-version"], capture_output=True, text=True, timeout=60)
        _VERSIONS[path] = f"coqc {(r.stdout.split() or ['unknown'])[0]}"
    return _VERSIONS[path]


_WARNED: set[str] = set()


def open_cache(root: Path) -> bytes | None:
    """The key of the cache at `root`, or None when that cache must not be used (said once per
    process on stderr: the check goes on without a cache, its library compiled privately)."""
    try:
        return coqcache.open_cache(root)
    except UnsafeCache as exc:
        if str(exc) not in _WARNED:
            _WARNED.add(str(exc))
            sys.stderr.write(f"derivc: warning: {exc}; proofs are checked without a cache\n")
        return None


def library(root: Path | None = None) -> CoqLibrary:
    """The compiled proof library: compiled once per content and coqc version under `root`
    (default `cache_root()`) and checked against its manifest at every use; compiled privately
    (once per process) when that cache must not be used."""
    version = coqc_version()
    root = Path(root or cache_root())
    key = open_cache(root)
    return coqcache.cached_library(root, key, version) if key is not None else coqcache.private_library(version)


def obligation_key(text: bytes, lib: CoqLibrary) -> str:
    return hashlib.sha256(json.dumps({"format": CACHE_FORMAT, "library": lib.digest}).encode() + b"\0" + text).hexdigest()


def cached_pass(root: Path, key: str) -> bool:
    """Whether the cache at `root` records a pass of obligation `key` (under its MAC'd name)."""
    secret = open_cache(root)
    return secret is not None and coqcache.cached_pass(root, secret, key)


def store_pass(root: Path, key: str, file: str, seconds: float) -> None:
    secret = open_cache(root)
    if secret is not None:
        coqcache.store_pass(root, secret, key, file, seconds)


# Obligations coqc passed in this process (obligation_key -> seconds): an identical obligation
# (same text, same library content) is not checked twice by one process, verify's included
# (a result of its own coqc, not a record read from anywhere).
_PROVED: dict[str, float] = {}


@dataclass(frozen=True)
class CoqRun:
    returncode: int  # -1: killed (timeout or stopped)
    output: str
    seconds: float
    stopped: bool = False


def run_coqc(vfile: Path, lib: Path, timeout: float, stop: threading.Event) -> CoqRun:
    """coqc on one obligation file (in its directory), killed when `stop` is set or after
    `timeout` seconds."""
    from proofs_ci import coqlib

    t0 = time.monotonic()
    limited = ["sh", "-c", 'ulimit -t "$1" && ulimit -v "$2" && shift 2 && exec "$@"', "coqc-limited",
               str(COQC_CPU_LIMIT_S), str(COQC_MEMORY_LIMIT_KB), *coqlib.obligation_command(vfile.name, lib)]
    p = subprocess.Popen(limited, cwd=vfile.parent, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while True:
        try:
            out, _ = p.communicate(timeout=0.05)
            if p.returncode in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL):
                out = f"coqc stopped after {COQC_CPU_LIMIT_S} s of CPU time (a runaway proof search)\n" + out
            elif "out of memory" in out.lower():
                out = f"coqc ran out of its {COQC_MEMORY_LIMIT_KB // 1024 ** 2} GB of memory (a runaway proof search)\n" + out
            return CoqRun(p.returncode, out, round(time.monotonic() - t0, 2))
        except subprocess.TimeoutExpired:
            late = time.monotonic() - t0 > timeout
            if late or stop.is_set():
                p.kill()
                out, _ = p.communicate()
                note = f"coqc timed out after {timeout:.0f} s\n" if late else ""
                return CoqRun(-1, note + out, round(time.monotonic() - t0, 2), stopped=not late)


def first_error(output: str) -> str:
    """coqc's error as one line: `line N: Error: …` (or its last line when it names none)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    if lines and lines[0].startswith(("coqc timed out", "coqc stopped after", "coqc ran out")):
        return lines[0]
    for k, ln in enumerate(lines):
        if ln.startswith("Error"):
            where = next((w for w in reversed(lines[:k]) if w.startswith("File ")), "")
            line_no = where.split("line ", 1)[1].split(",", 1)[0] if "line " in where else ""
            rest = " ".join(lines[k:k + 2]) if ln.rstrip().endswith(":") and k + 1 < len(lines) else ln
            return (f"line {line_no}: " if line_no else "") + rest[:300]
    return (lines[-1] if lines else "coqc failed without a message")[:300]


# --------------------------------------------------------------------------- the checker


def _index(proofs: Path) -> list[tuple[int, str, str]]:
    """(step, rule, .v file) of every obligation of a proofs/ directory, in step order, the
    final program's safety obligation (if any) last."""
    try:
        index = json.loads((proofs / "index.json").read_text())
        entries = sorted((int(e["step"]), str(e["rule"]), str(e["files"]["coq"])) for e in index["steps"])
        # about the final program: checked last; no file when no site is covered (only listed)
        if index.get("safety") is not None and index["safety"]["files"]:
            safety = str(index["safety"]["files"]["coq"])
            entries.append((int(safety[4:].split("_", 1)[0]), SAFETY, safety))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BadIndex(f"{proofs / 'index.json'}: not the index the build writes ({exc})") from None
    bad = next((f for _, _, f in entries if not OBLIGATION_FILE.fullmatch(f)), None)
    if bad is not None:
        raise BadIndex(f"{proofs / 'index.json'}: {bad!r} is not an obligation file name (StepNN_RULE.v)")
    return entries


def jobs_for_machine() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class PendingCheck:
    """A proof check running in the background (coqc processes in a thread pool)."""

    def __init__(self, proofs: Path, *, use_cache: bool, stop_on_failure: bool, jobs: int | None,
                 timeout: float) -> None:
        self._t0 = self._finished = time.monotonic()
        self._stop = threading.Event()
        self._stop_on_failure = stop_on_failure
        self._by = coqc_version()
        self._root = cache_root()
        self._timeout = timeout
        self._futures: list[tuple[int, str, str, Future[ObligationResult] | ObligationResult]] = []
        entries = _index(proofs)
        self.jobs = max(1, min(jobs or jobs_for_machine(), len(entries) or 1))
        texts = {f: (proofs / f).read_bytes() for _, _, f in entries}
        secret = open_cache(self._root)  # None: the cache is not the user's alone, not used at all
        lib = (coqcache.cached_library(self._root, secret, self._by) if secret is not None
               else coqcache.private_library(self._by))
        keys = {f: obligation_key(t, lib) for f, t in texts.items()}
        self._secret = secret if use_cache else None  # verify and --verify: no record read or written
        misses = [e for e in entries
                  if not (self._secret is not None and coqcache.cached_pass(self._root, self._secret, keys[e[2]]))]
        # coqc runs on copies: its by-products (.vo, .glob, .aux) never land in the build
        self._scratch = Path(tempfile.mkdtemp(prefix="derivc-coqc-"))
        for _, _, f in misses:
            (self._scratch / f).write_bytes(texts[f])
        self._pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="coqc") if misses else None
        for step, rule, f in entries:
            if self._pool is None or (step, rule, f) not in misses:
                self._futures.append((step, rule, f, ObligationResult(step, rule, f, "passed", cached=True)))
            else:
                fut = self._pool.submit(self._check_one, step, rule, f, lib.path, keys[f])
                self._futures.append((step, rule, f, fut))
        self._finished = max(self._finished, time.monotonic())  # moved on by each coqc run that ends later

    def _check_one(self, step: int, rule: str, file: str, lib: Path, key: str) -> ObligationResult:
        if self._stop.is_set():
            return ObligationResult(step, rule, file, "not run")
        r = CoqRun(0, "", _PROVED[key]) if key in _PROVED else run_coqc(self._scratch / file, lib, self._timeout, self._stop)
        self._finished = max(self._finished, time.monotonic())
        if r.stopped:
            return ObligationResult(step, rule, file, "not run", seconds=r.seconds)
        if r.returncode == 0:
            _PROVED[key] = r.seconds
            if self._secret is not None:
                coqcache.store_pass(self._root, self._secret, key, file, r.seconds)
            return ObligationResult(step, rule, file, "passed", seconds=r.seconds)
        if self._stop_on_failure:
            self._stop.set()
        return ObligationResult(step, rule, file, "FAILED", seconds=r.seconds, error=first_error(r.output))

    def cancel(self) -> None:
        """Stop every coqc process (the build failed elsewhere)."""
        self._stop.set()
        self.result()

    def result(self) -> ProofCheck:
        try:
            results = tuple(f.result() if isinstance(f, Future) else f for _, _, _, f in self._futures)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            shutil.rmtree(self._scratch, ignore_errors=True)
        # the check's own time (start to the last coqc's end), not the codegen it ran beside
        return ProofCheck(True, self._by, "", results, round(self._finished - self._t0, 2), self.jobs)


def start_check(proofs: Path, *, use_cache: bool = True, stop_on_failure: bool = True, jobs: int | None = None,
                timeout: float = COQC_TIMEOUT_S) -> PendingCheck:
    """Start checking every obligation of `proofs` (a directory with index.json); the caller
    checks `coqc_path()` first."""
    return PendingCheck(proofs, use_cache=use_cache, stop_on_failure=stop_on_failure, jobs=jobs, timeout=timeout)


def check_obligations(proofs: Path, **kw: Any) -> ProofCheck:
    return start_check(proofs, **kw).result()
