"""Shared test helpers.

`assert_fails(yaml_text, code, *fragments)` builds a schedule file with `derivc build` and
asserts the one-line failure: exit `code`, a message naming the file and containing every
fragment, and no output (nor temp) directory left behind.  A rule's precondition test is a
one-liner:

    def test_tile_guard_false(assert_fails):
        assert_fails(gemm_yaml([{"rule": "tile", "def": "C", "index": "i", "size": 7,
                                 "guard": False}]), 3, "step 1", "tile", "guard")

(`assert_fails` is both a fixture and a plain function.)  Test modules import these helpers
as `from derivc_testing import ...`: this conftest registers itself under that name, because
the bare name `conftest` is ambiguous once a subdirectory (tests/gpu/) has a conftest too.
"""
from __future__ import annotations

import contextlib
import functools
import io
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a bare checkout

sys.modules.setdefault("derivc_testing", sys.modules[__name__])

from compiler.ir import Bin, Const, Program
from compiler.rules import RULES
from compiler.rules.base import Rule, StepParams

# --------------------------------------------------------------------------- spec texts

GEMM = {
    "name": "gemm",
    "sizes": {"M": "dynamic", "N": "dynamic", "K": "dynamic"},
    "inputs": {"A": {"shape": ["M", "K"], "dtype": "f16"}, "B": {"shape": ["K", "N"], "dtype": "f16"}},
    "statements": ["C[i, j] = sum(k: A[i, k] * B[k, j])"],
    "output": {"tensor": "C", "dtype": "f16"},
}


def spec_yaml(base: dict[str, Any] | None = None, schedule: list[dict[str, Any]] | None = None, **fields: Any) -> str:
    """YAML text of `base` (default: the GEMM spec) with fields replaced and a schedule."""
    doc = dict(GEMM if base is None else base)
    doc.update(fields)
    if schedule is not None:
        doc["schedule"] = schedule
    return yaml.safe_dump(doc, sort_keys=False)


def gemm_yaml(schedule: list[dict[str, Any]] | None = None, **fields: Any) -> str:
    return spec_yaml(GEMM, schedule, **fields)


GEMM_YAML = gemm_yaml([])

# the GEMM spec as a person writes it (flow style, one field a line): tests edit it as text
GOOD_GEMM = """\
name: gemm
sizes: {M: dynamic, N: dynamic, K: dynamic}
inputs:
  A: {shape: [M, K], dtype: f16}
  B: {shape: [K, N], dtype: f16}
statements:
  - "C[i, j] = sum(k: A[i, k] * B[k, j])"
output: {tensor: C, dtype: f16}
"""


# --------------------------------------------------------------------------- running the CLI


def run_cli(args: list[str], proofs: bool = False) -> tuple[int, str, str]:
    """compiler.cli.main(args) → (exit code, stdout, stderr).  A `build` skips coqc
    (`--no-proofs` added) unless `proofs` or the arguments ask for the obligations (`--verify`):
    the proof checks are tested where they are the subject (test_proofs_default.py,
    test_obligations*.py), the other builds stay fast."""
    from compiler.cli import main

    if "build" in args[:3] and not proofs and not {"--verify", "--no-proofs"} & set(args):
        args = [*args, "--no-proofs"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def build_spec(tmp_path: Path, spec: dict | Path, *extra: str) -> tuple[int, str, Path]:
    """`derivc build` a spec (a dict is written to TMP/<name>.yaml first) into TMP/<stem>.build
    without proofs, seed 3 → (exit code, stderr, output directory)."""
    if isinstance(spec, dict):
        path = tmp_path / f"{spec['name']}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
    else:
        path = spec
    out = tmp_path / (path.stem + ".build")
    rc, _, err = run_cli(["build", str(path), "-o", str(out), "--no-proofs", "--seed", "3", *extra])
    return rc, err, out


def assert_fails(yaml_text: str | bytes, code: int, *fragments: str, name: str = "bad.yaml") -> str:
    """Build `yaml_text` (or these bytes); assert exit `code`, one error line naming the file and
    every fragment (case-insensitive), and nothing left in the output's parent.  Returns the line."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        spec = root / name
        spec.write_bytes(yaml_text if isinstance(yaml_text, bytes) else yaml_text.encode())
        out = root / "out" / "build"
        rc, stdout, stderr = run_cli(["build", str(spec), "-o", str(out), "--no-codegen"])
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        assert rc == code, f"exit {rc}, expected {code}; stderr: {stderr!r}"
        assert len(lines) == 1, f"expected one error line, got: {stderr!r}"
        msg = lines[0]
        assert msg.startswith("derivc: error: "), msg
        assert "Traceback" not in stderr
        assert name in msg, f"message does not name the file: {msg}"
        for frag in fragments:
            assert frag.lower() in msg.lower(), f"{frag!r} not in {msg!r}"
        left = sorted(p.name for p in root.iterdir())
        assert left == [name], f"left behind: {left}"
        return msg


@pytest.fixture(name="assert_fails")
def _assert_fails_fixture():
    return assert_fails


# --------------------------------------------------------------------------- test-only rules


class _NoParams(StepParams):
    pass


class _ScaleParams(StepParams):
    factor: float = 1.0 + 1e-6


class IdentityRule(Rule):
    """Rewrites nothing (a copy of the program): always sound."""

    name = "test_identity"
    kind = "TEST"
    theorem = "test_refl"
    Params = _NoParams

    def check(self, prog: Program, params: Any) -> dict[str, Any]:
        d = prog.def_named(prog.output)
        return {"def": prog.output, "body": d.body, "site": d.body, "loops": tuple(lp.var for lp in d.loops)}

    def rewrite(self, prog: Program, params: Any, facts: dict[str, Any]) -> Program:
        return replace(prog)


class CorruptRule(Rule):
    """Scales the output by `factor`: an unsound rewrite the numeric check must catch."""

    name = "test_corrupt"
    kind = "TEST"
    theorem = "test_none"
    Params = _ScaleParams

    def check(self, prog: Program, params: Any) -> dict[str, Any]:
        return {}

    def rewrite(self, prog: Program, params: Any, facts: dict[str, Any]) -> Program:
        d = prog.def_named(prog.output)
        return prog.with_def(replace(d, body=Bin("*", d.body, Const(params.factor))))


class RefuseRule(Rule):
    """Its precondition never holds."""

    name = "test_refuse"
    kind = "TEST"
    theorem = "test_none"
    Params = _NoParams

    def check(self, prog: Program, params: Any) -> dict[str, Any]:
        raise self.fail("precondition never holds")


@pytest.fixture
def test_rules(monkeypatch):
    """Registers test_identity, test_corrupt and test_refuse for the duration of a test."""
    for r in (IdentityRule(), CorruptRule(), RefuseRule()):
        monkeypatch.setitem(RULES, r.name, r)
    return RULES


# --------------------------------------------------------------------------- sweeps
#
# A sweep (marker `sweep`) runs a bounded sample of its cases (generated specs, signal instants):
# `sweep_sample(cases, budget, name)`.  The sample is drawn with the run's seed: $DERIVC_SWEEP_SEED,
# or one derived from the git HEAD and the UTC date (so CI draws other cases each day and on each
# commit), set before the xdist workers start so that they all collect the same cases, and printed
# in the summary and beside every failing sweep case: DERIVC_SWEEP_SEED=S replays a draw.
# DERIVC_SWEEP_FULL=1 runs every case of every sweep.

SWEEP_SEED_ENV = "DERIVC_SWEEP_SEED"
SWEEP_FULL_ENV = "DERIVC_SWEEP_FULL"


def _run_sweep_seed() -> int:
    import datetime
    import hashlib
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    day = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return int.from_bytes(hashlib.sha256(f"{head}:{day}".encode()).digest()[:4], "big") >> 1


def sweep_seed() -> int:
    import os

    if SWEEP_SEED_ENV not in os.environ:  # outside pytest (pytest_configure sets it)
        os.environ[SWEEP_SEED_ENV] = str(_run_sweep_seed())
    return int(os.environ[SWEEP_SEED_ENV])


def sweep_full() -> bool:
    import os

    return os.environ.get(SWEEP_FULL_ENV, "") not in ("", "0")


def sweep_sample(cases: Sequence[Any], budget: int, name: str) -> list[Any]:
    """`budget` of `cases` (kept in their order) drawn with the run's sweep seed and `name` (each
    sweep draws on its own); every case under DERIVC_SWEEP_FULL=1."""
    import random

    if sweep_full() or budget >= len(cases):
        return list(cases)
    picked = sorted(random.Random(f"{sweep_seed()}:{name}").sample(range(len(cases)), budget))
    return [cases[k] for k in picked]


def pytest_configure(config):
    sweep_seed()  # in the controller, before the workers start: they inherit it


def pytest_report_header(config):
    return f"sweeps: {'every case' if sweep_full() else 'a sample'}, {SWEEP_SEED_ENV}={sweep_seed()}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.get_closest_marker("sweep"):
        report.sections.append(("sweep", f"a sweep case: {SWEEP_SEED_ENV}={sweep_seed()} draws it again "
                                         f"({SWEEP_FULL_ENV}=1 runs every case)"))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if terminalreporter.stats and any(r.keywords.get("sweep") for key in ("passed", "failed")
                                      for r in terminalreporter.stats.get(key, []) if hasattr(r, "keywords")):
        terminalreporter.write_line(f"sweeps ran {'every case' if sweep_full() else 'a sample'}: "
                                    f"{SWEEP_SEED_ENV}={sweep_seed()} replays it, {SWEEP_FULL_ENV}=1 runs every case")


# --------------------------------------------------------------------------- parallel runs
#
# The suite runs under pytest-xdist (`-n auto --dist loadgroup`, README).  Modules whose
# module-scoped fixture is expensive (a wheel, a compiled Coq library, every example's kernel)
# run on one worker, so the fixture is built once; the other tests spread over the workers (a
# module-scoped fixture is set up once per worker that runs a test using it).
# test_rules_property.py too: its coverage test reads the rule counts its property tests
# gathered in the same process.

ONE_WORKER_MODULES = frozenset({
    "test_packaging.py", "test_proof_library.py", "test_obligations_mutation.py", "test_rules_property.py",
    "test_bottom_right_grad.py", "test_schedule_variants.py",
})


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        stem = example_of(item)
        if item.path.name in ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
        elif stem is not None and not item.get_closest_marker("xdist_group"):
            # every test of one example on one worker: the first builds it (example_build), the
            # others read that build
            item.add_marker(pytest.mark.xdist_group(f"example-{stem}"))
        elif item.path.name == "test_obligations.py" and hasattr(item, "callspec"):
            # the tests of one example check the same obligations: one after the other, the
            # later ones find coqc's results (coqc_once_per_obligation)
            example = item.callspec.params.get("name", item.callspec.params.get("spec"))
            if example is not None:
                item.add_marker(pytest.mark.xdist_group(f"obligations-{Path(str(example)).stem}"))


def _library_content(lib: Path) -> str | None:
    """sha256 of a compiled Coq library's .vo files (what coqc loads through `-R`), None if
    it has none."""
    import hashlib

    vos = sorted(lib.rglob("*.vo"))
    if not vos:
        return None
    h = hashlib.sha256()
    for p in vos:
        h.update(p.relative_to(lib).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _sources_digest(coq_dir: Path, examples: bool) -> str:
    """sha256 of every source of a Coq library directory (build products left out)."""
    import hashlib

    h = hashlib.sha256(f"examples={examples}".encode())
    for p in sorted(coq_dir.rglob("*")):
        if p.is_file() and p.suffix not in (".vo", ".vok", ".vos", ".glob", ".aux", ".cache"):
            h.update(p.relative_to(coq_dir).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path` (fcntl): one xdist worker at a time."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def example_of(item: pytest.Item) -> str | None:
    """The example a test is parametrized over (a path under examples/, parameter `example`)."""
    value = getattr(item, "callspec", None) and item.callspec.params.get("example")
    return value.stem if isinstance(value, Path) and value.parent == EXAMPLES_DIR else None


# --------------------------------------------------------------------------- one build per example per run

EXAMPLES_DIR = ROOT / "examples"
NO_KERNEL = frozenset({"attention_naive", "attention_tiled_two_pass"})  # derivation branches without one fused kernel
BUILD_ARGS = ("--seed", "0", "--no-proofs")


@dataclass(frozen=True)
class SharedBuild:
    """The result of `derivc build SPEC -o out --seed 0 --no-proofs [--no-codegen]`."""

    rc: int
    stderr: str
    out: Path


@pytest.fixture(scope="session")
def example_build(tmp_path_factory) -> Callable[..., SharedBuild]:
    """get(spec path, codegen=True) -> SharedBuild: `derivc build` (in-process, seed 0, no
    proofs) of each spec once per test run, shared by the tests of every module and by the xdist
    workers (a file lock per build under the run's temporary directory; the tests of one
    example run on one worker, so the lock is rarely waited on).  The builds are read-only: a
    test that changes a build copies it first; a test that patches the compiler builds its own."""
    import fcntl
    import hashlib
    import json
    import os

    from compiler import checkcache

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # .../pytest-N/popen-gwK: share .../pytest-N between the workers
    root = root / "example-builds"
    root.mkdir(exist_ok=True)

    def get(spec: Path, codegen: bool = True) -> SharedBuild:
        spec = Path(spec).resolve()
        args = [*BUILD_ARGS, *([] if codegen else ["--no-codegen"])]
        key = hashlib.sha256(json.dumps([str(spec), spec.read_text(), args]).encode()).hexdigest()[:16]
        out, result = root / f"{spec.stem}-{key}", root / f"{spec.stem}-{key}.json"
        with open(root / f"{spec.stem}-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not result.exists():
                with checkcache.shared_in_process():  # the steps an earlier build (a variant, a twin) checked
                    rc, _, err = run_cli(["build", str(spec), "-o", str(out), *args])
                result.write_text(json.dumps({"rc": rc, "stderr": err}))
        r = json.loads(result.read_text())
        return SharedBuild(r["rc"], r["stderr"], out)

    return get


@pytest.fixture(scope="session", autouse=True)
def coqc_once_per_obligation(tmp_path_factory):
    """Within one test run, the Coq library is compiled once per source content and coqc
    checks each obligation text against each compiled library content once: many tests
    compile the library into a directory of their own (a cache of their own) and build the
    same examples.

    * `coqlib.build_library(src, out_dir)` compiles into a run-wide directory the first time
      (one xdist worker at a time, under a file lock) and copies the compiled library into
      `out_dir` after: same sources (examples or not), same files.  A library changed in any
      source file (a test's broken copy) is compiled for real; so is an in-place build.
    * coqc's verdict on an obligation is keyed by its file name, its text and the content of
      the library's .vo files: a corrupted obligation or a different (planted, rebuilt)
      library is checked anew.
    Results are shared by the xdist workers through files written atomically under the run's
    temporary directory."""
    import dataclasses
    import hashlib
    import json
    import os
    import shutil
    import subprocess
    import threading

    try:
        from proofs_ci import coqlib
    except ImportError:
        yield
        return
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # .../pytest-N/popen-gwK: share .../pytest-N between the workers
    results = root / "coqc-results"
    results.mkdir(exist_ok=True)
    libraries = root / "coq-libraries"
    libraries.mkdir(exist_ok=True)
    check = coqlib.check_obligation
    build = coqlib.build_library
    version = subprocess.run(["coqc", "--print-version"], capture_output=True, text=True).stdout \
        if shutil.which("coqc") else ""

    def build_once(coq_dir: Path = coqlib.COQ_DIR, out_dir: Path | None = None, examples: bool = False,
                   timeout: float = 300) -> Path:
        if out_dir is None:  # in place: the test is about that directory
            return build(coq_dir, out_dir, examples, timeout)
        compiled = libraries / hashlib.sha256(f"{version}:{_sources_digest(Path(coq_dir), examples)}".encode()).hexdigest()
        with _locked(libraries / f"{compiled.name}.lock"):
            if not compiled.is_dir():
                build(coq_dir, compiled.with_suffix(".tmp"), examples, timeout)
                os.replace(compiled.with_suffix(".tmp"), compiled)
        shutil.copytree(compiled, out_dir, dirs_exist_ok=True)
        return Path(out_dir)

    def check_once(vfile, lib_dir=coqlib.COQ_DIR, timeout: float = 300) -> subprocess.CompletedProcess:
        vfile, lib = Path(vfile).resolve(), Path(lib_dir).resolve()
        key = hashlib.sha256(json.dumps([vfile.name, vfile.read_text(), _library_content(lib) or str(lib)]).encode()).hexdigest()
        entry = results / f"{key}.json"
        if entry.exists():
            r = json.loads(entry.read_text())
            return subprocess.CompletedProcess(r["args"], r["returncode"], r["stdout"], r["stderr"])
        r = check(vfile, lib_dir, timeout)
        tmp = results / f"{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"args": [str(a) for a in r.args], "returncode": r.returncode,
                                   "stdout": r.stdout, "stderr": r.stderr}))
        os.replace(tmp, entry)
        return r

    from compiler import proofcheck

    run = proofcheck.run_coqc

    def run_once(vfile, lib, timeout, stop) -> proofcheck.CoqRun:
        """The build's and verify's coqc (compiler.proofcheck), served the same way."""
        vfile, lib = Path(vfile).resolve(), Path(lib).resolve()
        key = hashlib.sha256(json.dumps(["run", vfile.name, vfile.read_text(), _library_content(lib) or str(lib),
                                         proofcheck.COQC_CPU_LIMIT_S]).encode()).hexdigest()
        entry = results / f"{key}.json"
        if entry.exists():
            return proofcheck.CoqRun(**json.loads(entry.read_text()))
        r = run(vfile, lib, timeout, stop)
        if not r.stopped:  # a stopped run says nothing about the obligation
            tmp = results / f"{key}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.write_text(json.dumps(dataclasses.asdict(r)))
            os.replace(tmp, entry)
        return r

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(coqlib, "build_library", build_once)
        mp.setattr(coqlib, "check_obligation", check_once)
        mp.setattr(proofcheck, "run_coqc", run_once)
        # builds of the whole run (in-process and subprocesses) share one proof cache and one
        # compiled library, never the user's ~/.cache
        mp.setenv("DERIVC_COQ_CACHE", str(root / "coq-cache"))
        yield


# --------------------------------------------------------------------------- mutants of codegen/


@functools.lru_cache(maxsize=None)
def checked_derivations(spec: Path, seed: int) -> tuple[Any, Any]:
    """(the derivation, its backward or None) of `derivc build SPEC --seed SEED`, numeric checks
    included (they give the kernel step its sizes and draws): derived once per test process."""
    from compiler.derive import derive
    from compiler.derive_grad import derive_gradient
    from compiler.spec import load_spec_file

    loaded = load_spec_file(spec)
    assert not loaded.variants, f"{spec}: schedule variants: build it through the CLI"
    d = derive(loaded, str(spec), seed=seed)
    backward = derive_gradient(loaded, str(spec), seed=d.seed) if loaded.grad is not None else None
    return d, backward


def codegen_checks_of_mutant(spec: Path, copy: Path, seed: int = 7, timeout: int = 600) -> str | None:
    """The codegen checks of `derivc build SPEC --seed SEED` (`lowering`, then the `kernel` step:
    the printed text run on the CPU), for every kernel the build prints (the forward or each
    kernel of its chain, then the backward's), by the codegen/ package of `copy` (a mutated copy):
    the first failure as "KERNEL: message", or None when every kernel passes.

    The derivation is the unmutated compiler's, derived once per process (checked_derivations):
    a child forked from this process imports copy/codegen in place of codegen/ and runs
    codegen.build's prepare / print_checked / check_text on it, as compiler.cli does before it
    writes a kernel (NVRTC and the SASS checks come after the kernel step; a mutant never gets
    there).  A mutation of compiler/ needs a subprocess build instead."""
    import os
    import signal

    d, backward = checked_derivations(Path(spec).resolve(), seed)
    result = Path(copy) / "codegen-checks.txt"
    result.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            signal.alarm(timeout)
            for name in [m for m in sys.modules if m == "codegen" or m.startswith("codegen.")]:
                del sys.modules[name]
            sys.path.insert(0, str(Path(copy).resolve()))
            from codegen import build

            assert Path(build.__file__).resolve().is_relative_to(Path(copy).resolve()), build.__file__
            from compiler.kernel_chain import chain_of, kernel_derivations

            kernels = kernel_derivations(d) if chain_of(d) else [d]
            kernels += list(backward.kernels) if backward is not None else []
            failure = ""
            for k in kernels:
                name = getattr(k, "grad_kernel", None) or (getattr(k, "chain_kernel", None) or {}).get("kernel") or k.final.output
                try:
                    build.check_text(k, build.print_checked(build.prepare(k)[0]))
                except Exception as exc:  # noqa: BLE001 - what the build would report
                    failure = f"{name}: {exc}" if isinstance(exc, build.CodegenError) else f"{name}: {type(exc).__name__}: {exc}"
                    break
            result.write_text(failure)
            code = 0
        except BaseException:  # noqa: BLE001
            import traceback

            result.write_text("helper failed: " + traceback.format_exc())
            code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    text = result.read_text() if result.exists() else ""
    assert os.waitstatus_to_exitcode(status) == 0, f"the forked codegen checks died ({status}): {text}"
    return text or None


def spec_builder(root: Path):
    """get(name, spec dict) -> (Derivation, derivc.load(...)): each spec built once under root,
    without proofs (the GPU tests' check is their run against float64)."""
    import derivc
    from compiler.cli import build_to

    cache = {}

    def get(name: str, spec: dict):
        if name not in cache:
            path = root / f"{name}.yaml"
            path.write_text(yaml.safe_dump(spec, sort_keys=False))
            d = build_to(path, root / name, proofs=False)
            cache[name] = (d, derivc.load(root / name))
        return cache[name]

    return get


def grad_kernel_irs(spec_path: Path) -> dict:
    """The kernel IR of every backward kernel of a spec with grad:, by kernel name (derived
    without numeric checks, seed 1)."""
    from codegen.kir.lower import lower
    from compiler.derive_grad import derive_gradient
    from compiler.spec import load_spec_file

    g = derive_gradient(load_spec_file(spec_path), str(spec_path), seed=1, check=False)
    return {k.grad_kernel: lower(k.final, k.grad_kernel) for k in g.kernels}
