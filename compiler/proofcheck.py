"""coqc on a build's proof obligations: in parallel, cached per obligation, failing fast.

`derivc build` checks every `proofs/StepNN_<rule>.v` it exports whenever coqc is on PATH
(`start_check` before codegen, `PendingCheck.result` before the build directory is swapped in);
`derivc verify` and `build --verify` use the same checker with the cache bypassed.

* Pool: one coqc process per core (`os.sched_getaffinity`).  The obligations to check are
  split into one combined file per process (compiler.obligations_batch: each obligation in a
  module of its own, the library loaded once per process instead of once per file); coqc
  stopping inside an obligation (an error, a limit) checks that one alone, so its verdict,
  error line and CPU / memory limits are those of its own file, and the rest goes on in a new
  combined file.  With `stop_on_failure`, the first failure kills the running coqc processes
  and the build reports it at once.  Obligations with the same canonical text (they differ only
  in their step number and header comment) are checked once.
* Cache (compiler.coqcache): `$DERIVC_COQ_CACHE`, else `$DERIVC_CACHE_DIR/coq`, else
  `~/.cache/derivc/coq`, private to the user (0700, refused — said once on stderr, and the check
  goes on without it — when someone else could write it).  The Coq library (proofs_ci/coq) is
  compiled once per content and coqc version into `lib-<digest>/` and checked against its
  manifest's hashes at every use; an obligation that passed is recorded under a MAC of its key
  (key = sha256 of the obligation's canonical text, the library's sources and compiled files,
  and the coqc version).  Entries are written to a temp file and moved into place (readers never see half a
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import coqcache
from . import obligations_batch as batching
from .coqcache import CoqLibrary, CoqLibraryError, UnsafeCache, cache_root  # noqa: F401 (part of this API)

# Bounds per coqc process, far above what the slowest correct obligation of the examples
# needs (~30 s of CPU, < 1 GB): they only stop a runaway proof search on a FALSE obligation
# (conversion unfolding an 8192-column sum took minutes and 14 GB before failing).  CPU time,
# not wall time, so that a loaded machine does not turn a slow true proof into a failure; the
# wall-clock limit is a backstop for a coqc that waits on nothing.
COQC_CPU_LIMIT_S = 300
COQC_MEMORY_LIMIT_KB = 6 * 1024 * 1024
COQC_TIMEOUT_S = 1800.0
CACHE_FORMAT = 2  # 2: keyed by the canonical text
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
    """The key of an obligation's verdict: its canonical text (compiler.obligations_batch: the
    same for obligations that differ only in their step number and header comment) under one
    library content."""
    try:
        canon = batching.canonical_text(text.decode()).encode()
    except UnicodeDecodeError:
        canon = text
    return hashlib.sha256(json.dumps({"format": CACHE_FORMAT, "library": lib.digest}).encode() + b"\0" + canon).hexdigest()


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
    """A proof check running in the background: the obligations not found in the cache,
    identical ones (same canonical text, compiler.obligations_batch) once, split into one
    combined file per job, each checked by one coqc process in a thread pool."""

    def __init__(self, proofs: Path, *, use_cache: bool, stop_on_failure: bool, jobs: int | None,
                 timeout: float) -> None:
        self._t0 = self._finished = time.monotonic()
        self._stop = threading.Event()
        self._stop_on_failure = stop_on_failure
        self._by = coqc_version()
        self._root = cache_root()
        self._timeout = timeout
        self._entries = _index(proofs)
        self._texts = {f: (proofs / f).read_bytes() for _, _, f in self._entries}
        secret = open_cache(self._root)  # None: the cache is not the user's alone, not used at all
        self._lib = (coqcache.cached_library(self._root, secret, self._by) if secret is not None
                     else coqcache.private_library(self._by))
        self._keys = {f: obligation_key(t, self._lib) for f, t in self._texts.items()}
        self._secret = secret if use_cache else None  # verify and --verify: no record read or written
        cached = {f for f, k in self._keys.items()
                  if self._secret is not None and coqcache.cached_pass(self._root, self._secret, k)}
        # one file per key: the others take its verdict
        todo: dict[str, tuple[int, str, str]] = {}
        for step, rule, f in self._entries:
            if f not in cached:
                todo.setdefault(self._keys[f], (step, rule, f))
        self._cached = cached
        cores = jobs or jobs_for_machine()
        batches = _batches(list(todo.values()), self._texts, cores)
        self.jobs = max(1, min(cores, len(batches)))
        # coqc runs on copies: its by-products (.vo, .glob, .aux) never land in the build
        self._scratch = Path(tempfile.mkdtemp(prefix="derivc-coqc-"))
        self._pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="coqc") if batches else None
        self._futures = [self._pool.submit(self._check_batch, b) for b in batches] if self._pool else []
        self._finished = max(self._finished, time.monotonic())  # moved on by each coqc run that ends later

    # ----------------------------------------------------------------- one coqc process

    def _run(self, name: str, text: bytes) -> CoqRun:
        d = Path(tempfile.mkdtemp(prefix="run-", dir=self._scratch))
        (d / name).write_bytes(text)
        try:
            return run_coqc(d / name, self._lib.path, self._timeout, self._stop)
        finally:
            self._finished = max(self._finished, time.monotonic())

    def _passed(self, entry: tuple[int, str, str], seconds: float) -> ObligationResult:
        step, rule, f = entry
        key = self._keys[f]
        _PROVED[key] = seconds
        if self._secret is not None:
            coqcache.store_pass(self._root, self._secret, key, f, seconds)
        return ObligationResult(step, rule, f, "passed", seconds=seconds)

    def _check_alone(self, entry: tuple[int, str, str]) -> ObligationResult:
        step, rule, f = entry
        if self._stop.is_set():
            return ObligationResult(step, rule, f, "not run")
        key = self._keys[f]
        r = CoqRun(0, "", _PROVED[key]) if key in _PROVED else self._run(f, self._texts[f])
        if r.stopped:
            return ObligationResult(step, rule, f, "not run", seconds=r.seconds)
        if r.returncode == 0:
            return self._passed(entry, r.seconds)
        if self._stop_on_failure:
            self._stop.set()
        return ObligationResult(step, rule, f, "FAILED", seconds=r.seconds, error=first_error(r.output))

    def _check_batch(self, batch: list[tuple[int, str, str]]) -> list[ObligationResult]:
        """Every obligation of `batch` (combinable ones, one prelude) in one combined file;
        when coqc stops inside module k (an error, a limit, a kill), the modules before k
        passed, obligation k is checked alone (its verdict, error line and limits are those of
        its own file) and the rest goes on in a new combined file."""
        out: list[ObligationResult] = []
        pending = [e for e in batch if self._keys[e[2]] not in _PROVED]
        out += [self._check_alone(e) for e in batch if self._keys[e[2]] in _PROVED]
        while pending:
            if self._stop.is_set():
                out += [ObligationResult(s, r, f, "not run") for s, r, f in pending]
                break
            if len(pending) == 1:
                out.append(self._check_alone(pending[0]))
                break
            parts = [batching.split(self._texts[f].decode()) for _, _, f in pending]
            # the marker's nonce is a digest of the modules: no obligation can print the marker of
            # another (it would have to hold a digest of itself), and the same obligations give
            # the same file (the test suite serves coqc's verdict on a text once per run)
            nonce = hashlib.sha256("\0".join([parts[0].prelude] + [p.rest for p in parts]).encode()).hexdigest()[:32]
            text = batching.combined_text(parts[0].prelude, [p.rest for p in parts], nonce)
            r = self._run(f"Batch{pending[0][0]:02d}_{len(pending)}.v", text.encode())
            done = len(pending) if r.returncode == 0 else batching.passed_prefix(r.output, nonce, len(pending))
            each = round(r.seconds / max(1, done + (done < len(pending))), 2)
            out += [self._passed(e, each) for e in pending[:done]]
            if done < len(pending):
                out.append(self._check_alone(pending[done]))
            pending = pending[done + 1:]
        return out

    def cancel(self) -> None:
        """Stop every coqc process (the build failed elsewhere)."""
        self._stop.set()
        self.result()

    def result(self) -> ProofCheck:
        try:
            checked = {r.file: r for fut in self._futures for r in fut.result()}
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            shutil.rmtree(self._scratch, ignore_errors=True)
        by_key = {self._keys[f]: r for f, r in checked.items()}
        results = []
        for step, rule, f in self._entries:
            if f in self._cached:
                results.append(ObligationResult(step, rule, f, "passed", cached=True))
            else:  # checked itself, or an identical obligation was
                r = checked.get(f) or by_key[self._keys[f]]
                results.append(ObligationResult(step, rule, f, r.status, seconds=r.seconds if f in checked else 0.0,
                                                error=r.error))
        # the check's own time (start to the last coqc's end), not the codegen it ran beside
        return ProofCheck(True, self._by, "", tuple(results), round(self._finished - self._t0, 2), self.jobs)


def _batches(todo: list[tuple[int, str, str]], texts: dict[str, bytes], jobs: int) -> list[list[tuple[int, str, str]]]:
    """The obligations to check, in at most `jobs` lists of similar size (text length), each
    list one prelude's combinable obligations in step order; an obligation that must not be
    combined is a list of its own."""
    alone: list[list[tuple[int, str, str]]] = []
    groups: dict[str, list[tuple[int, str, str]]] = {}
    for e in todo:
        part = batching.split(texts[e[2]].decode(errors="replace"))
        if part.combinable:
            groups.setdefault(part.prelude, []).append(e)
        else:
            alone.append([e])
    out = list(alone)
    for group in groups.values():
        n = max(1, min(jobs, len(group)))
        bins: list[list[tuple[int, str, str]]] = [[] for _ in range(n)]
        sizes = [0] * n
        for e in sorted(group, key=lambda e: -len(texts[e[2]])):
            k = sizes.index(min(sizes))
            bins[k].append(e)
            sizes[k] += len(texts[e[2]])
        out += [sorted(b) for b in bins if b]
    return out


def start_check(proofs: Path, *, use_cache: bool = True, stop_on_failure: bool = True, jobs: int | None = None,
                timeout: float = COQC_TIMEOUT_S) -> PendingCheck:
    """Start checking every obligation of `proofs` (a directory with index.json); the caller
    checks `coqc_path()` first."""
    return PendingCheck(proofs, use_cache=use_cache, stop_on_failure=stop_on_failure, jobs=jobs, timeout=timeout)


def check_obligations(proofs: Path, **kw: Any) -> ProofCheck:
    return start_check(proofs, **kw).result()
