"""The Python API without a GPU (issue 20): `derivc.build` says before any derivation that no GPU
runtime is here (derivc.GPUUnavailableError, the CLI's reason), and never leaves a temporary
directory: not when it refuses, not when the build or the load fails, and a kernel built without
`out_dir` takes its directory with it when it is collected or the interpreter exits."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import derivc
from derivc_testing import ROOT

GEMM = ROOT / "examples" / "gemm.yaml"


@pytest.fixture
def no_cupy(monkeypatch):
    """CuPy not importable (whatever this machine has): sys.modules[name] = None fails `import`."""
    monkeypatch.setitem(sys.modules, "cupy", None)


@pytest.fixture
def tmp_root(monkeypatch, tmp_path) -> Path:
    """tempfile's directory for this test: everything derivc.build leaves behind shows there."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def derive_calls(monkeypatch) -> list:
    """compiler.derive.derive replaced by a recorder that refuses to derive."""
    import compiler.derive

    calls: list = []

    def recorder(*args, **kwargs):
        calls.append(args)
        raise AssertionError("derive ran")

    monkeypatch.setattr(compiler.derive, "derive", recorder)
    return calls


def test_build_without_cupy_refuses_before_deriving(no_cupy, tmp_root, derive_calls):
    with pytest.raises(derivc.GPUUnavailableError, match=r"derivc\.build\(.*gemm\.yaml\): .*CuPy is not installed"):
        derivc.build(GEMM)
    assert derive_calls == []
    assert list(tmp_root.iterdir()) == []


def test_build_into_out_dir_without_cupy_writes_nothing(no_cupy, tmp_path, derive_calls):
    with pytest.raises(derivc.GPUUnavailableError):
        derivc.build(GEMM, tmp_path / "out")
    assert derive_calls == [] and not (tmp_path / "out").exists()


def test_load_without_cupy_refuses_before_reading(no_cupy, tmp_path):
    for load in (derivc.load, derivc.load_training):
        with pytest.raises(derivc.GPUUnavailableError, match="CuPy is not installed"):
            load(tmp_path / "missing")  # not "does not exist": the runtime is checked first


def test_the_refusal_is_the_cli_s_one_check(no_cupy, monkeypatch, tmp_root, derive_calls):
    """No second copy of the decision: with compiler.cli's check saying "here", build goes on."""
    import compiler.cli

    assert derivc.gpu_missing is compiler.cli.gpu_missing
    seen = []
    monkeypatch.setattr(compiler.cli, "gpu_missing", lambda *m: seen.append(m) or "not available: (the CLI's check)")
    monkeypatch.setattr(derivc, "gpu_missing", compiler.cli.gpu_missing)
    with pytest.raises(derivc.GPUUnavailableError, match=r"\(the CLI's check\)"):
        derivc.build(GEMM)
    assert seen == [()]


def test_errors_are_documented():
    doc = derivc.__doc__ + derivc.build.__doc__
    for cls in ("GPUUnavailableError", "SpecError", "DerivationError", "BuildError", "OutputRefused"):
        assert cls in doc and cls in derivc.__all__ and isinstance(getattr(derivc, cls), type), cls
    assert issubclass(derivc.GPUUnavailableError, RuntimeError)
    assert "out_dir" in derivc.build.__doc__ and "garbage-collected" in derivc.build.__doc__
    call = derivc.Kernel.__doc__
    assert "CuPy" in call and "torch" in call and "contiguous" in call and "ValueError" in call


# -- the temporary directory of a build without out_dir -------------------------------------------

class _Loaded:
    """What derivc._open returns in these tests (a kernel needs a GPU)."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir


@pytest.fixture
def gpu_here(monkeypatch):
    """derivc believes a GPU runtime is here; loading gives a stand-in holding its directory."""
    monkeypatch.setattr(derivc, "gpu_missing", lambda *m: None)
    monkeypatch.setattr(derivc, "_open", lambda out_dir, device: _Loaded(out_dir))


@pytest.fixture
def fake_build(monkeypatch):
    """compiler.cli.build_to writing one file, fast (the real one runs in the tests below)."""
    import compiler.cli

    def build_to(file, outdir, **kwargs):
        outdir.mkdir(parents=True)
        (outdir / "kernel.cu").write_text("// built\n")

    monkeypatch.setattr(compiler.cli, "build_to", build_to)


def test_temp_dir_lives_with_the_kernel(gpu_here, fake_build, tmp_root):
    kernel = derivc.build(GEMM)
    (where,) = tmp_root.iterdir()
    assert where.name.startswith(derivc.TEMP_PREFIX) and kernel.out_dir == where / "build"
    assert (kernel.out_dir / "kernel.cu").is_file()
    del kernel
    gc.collect()
    assert list(tmp_root.iterdir()) == []


def test_temp_dir_removed_when_the_build_fails(monkeypatch, gpu_here, tmp_root, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsizes: [1\n")
    with pytest.raises(derivc.SpecError):
        derivc.build(bad)
    assert list(tmp_root.iterdir()) == []


def test_temp_dir_removed_when_the_load_fails(monkeypatch, gpu_here, fake_build, tmp_root):
    def broken(out_dir, device):
        assert (out_dir / "kernel.cu").is_file()
        raise ValueError("the load failed")

    monkeypatch.setattr(derivc, "_open", broken)
    with pytest.raises(ValueError, match="the load failed"):
        derivc.build(GEMM)
    assert list(tmp_root.iterdir()) == []


def test_temp_dir_removed_at_interpreter_exit(tmp_path):
    """A kernel still referenced when the interpreter exits (a module global): its directory goes."""
    script = f"""
import compiler.cli, derivc
from pathlib import Path
class Loaded:
    def __init__(self, out_dir): self.out_dir = out_dir
def build_to(file, outdir, **kw):
    outdir.mkdir(parents=True); (outdir / "kernel.cu").write_text("//")
compiler.cli.build_to = build_to
derivc.gpu_missing = lambda *m: None
derivc._open = lambda out_dir, device: Loaded(out_dir)
KERNEL = derivc.build({str(GEMM)!r})
assert (KERNEL.out_dir / "kernel.cu").is_file()
print(KERNEL.out_dir)
"""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).parent.parent == tmp_path
    assert list(tmp_path.iterdir()) == []


# -- build without loading: no GPU needed -----------------------------------------------------------

def test_build_without_load_needs_no_gpu(no_cupy, tmp_root, tmp_path):
    out = derivc.build(GEMM, tmp_path / "gemm", seed=0, load=False)
    assert out == tmp_path / "gemm" and (out / "kernel.cu").is_file() and (out / "derivation.json").is_file()
    assert list(tmp_root.iterdir()) == []


def test_build_without_load_needs_out_dir(tmp_root, derive_calls):
    with pytest.raises(ValueError, match="pass out_dir"):
        derivc.build(GEMM, load=False)
    assert derive_calls == [] and list(tmp_root.iterdir()) == []
