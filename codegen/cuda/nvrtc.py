"""Compile CUDA C++ to a cubin with NVRTC, no GPU or driver needed.

NVRTC is reached through ``ctypes`` (library found by :mod:`codegen.cuda.toolchain`),
or through CuPy's ``cupy.cuda.nvrtc`` binding when no library file is found but
CuPy is importable.  Compilation targets a *real* architecture (``sm_90``,
``sm_90a``, ...) because the result is fetched with ``nvrtcGetCUBIN``; PTX-only
targets (``compute_XX``) are rejected.

Results go through the on-disk cache of :mod:`codegen.cuda.cache`.

Example::

    result = compile_cubin(src, "attn.cu", ("--gpu-architecture=sm_90a", "-std=c++17"))
    result.cubin  # ELF bytes, ready for cuModuleLoadData or codegen.cuda.sass.disassemble
"""

from __future__ import annotations

import ctypes
import functools
import re
from dataclasses import dataclass
from typing import Protocol

from compiler.outdir import signals_held

from . import cache, toolchain

__all__ = [
    "DEFAULT_ARCH",
    "CompileError",
    "CompileResult",
    "NvrtcUnavailableError",
    "compile_cubin",
    "nvrtc_available",
    "nvrtc_version",
]

DEFAULT_ARCH = "sm_90a"
_ARCH_OPTION = re.compile(r"^(?:--gpu-architecture|-arch)=(\S+)$")
_MIN_VERSION_ARCH_SPECIFIC = (
    12,
    0,
)  # first NVRTC that knows sm_90a (wgmma, setmaxnreg)


@dataclass(frozen=True)
class CompileResult:
    """A compiled cubin plus what produced it."""

    cubin: bytes
    log: str
    options: tuple[str, ...]  # effective options (arch and include path added)
    nvrtc_version: tuple[int, int]
    cache_hit: bool


class CompileError(RuntimeError):
    """NVRTC rejected the program; ``log`` holds the compiler output."""

    def __init__(
        self, message: str, log: str = "", options: tuple[str, ...] = ()
    ) -> None:
        super().__init__(f"{message}\n{log}".rstrip())
        self.log = log
        self.options = options


class NvrtcUnavailableError(RuntimeError):
    """No NVRTC library and no CuPy binding could be found."""


class _Backend(Protocol):
    def version(self) -> tuple[int, int]: ...

    def supported_archs(self) -> tuple[int, ...]: ...

    def compile(
        self, source: str, name: str, options: tuple[str, ...]
    ) -> tuple[bool, bytes, str]:
        """Return (success, cubin, log)."""
        ...


class _CtypesNvrtc:
    """The NVRTC C API over ctypes."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        self._lib = lib

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            text = self._lib.nvrtcGetErrorString(status).decode(errors="replace")
            raise CompileError(f"{what} failed: {text} ({status})")

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(
            self._lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)),
            "nvrtcVersion",
        )
        return major.value, minor.value

    def supported_archs(self) -> tuple[int, ...]:
        count = ctypes.c_int()
        self._check(
            self._lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)),
            "nvrtcGetNumSupportedArchs",
        )
        archs = (ctypes.c_int * count.value)()
        self._check(self._lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
        return tuple(archs)

    def _read(self, prog: ctypes.c_void_p, size_fn: str, get_fn: str) -> bytes:
        size = ctypes.c_size_t()
        self._check(getattr(self._lib, size_fn)(prog, ctypes.byref(size)), size_fn)
        buf = ctypes.create_string_buffer(size.value)
        self._check(getattr(self._lib, get_fn)(prog, buf), get_fn)
        return buf.raw

    def compile(
        self, source: str, name: str, options: tuple[str, ...]
    ) -> tuple[bool, bytes, str]:
        prog = ctypes.c_void_p()
        self._check(
            self._lib.nvrtcCreateProgram(
                ctypes.byref(prog), source.encode(), name.encode(), 0, None, None
            ),
            "nvrtcCreateProgram",
        )
        try:
            argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
            status = self._lib.nvrtcCompileProgram(prog, len(options), argv)
            log = self._read(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
            log_text = log.rstrip(b"\0").decode(errors="replace")
            if status != 0:
                return False, b"", log_text
            return (
                True,
                self._read(prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN"),
                log_text,
            )
        finally:
            self._lib.nvrtcDestroyProgram(ctypes.byref(prog))


class _CupyNvrtc:
    """CuPy's thin NVRTC wrapper (used only when no library file is found)."""

    def __init__(self) -> None:
        from cupy.cuda import nvrtc  # type: ignore[import-not-found, unused-ignore]

        self._nvrtc = nvrtc

    def version(self) -> tuple[int, int]:
        major, minor = self._nvrtc.getVersion()
        return int(major), int(minor)

    def supported_archs(self) -> tuple[int, ...]:
        return tuple(int(a) for a in self._nvrtc.getSupportedArchs())

    def compile(
        self, source: str, name: str, options: tuple[str, ...]
    ) -> tuple[bool, bytes, str]:
        nv = self._nvrtc
        prog = nv.createProgram(source, name, (), ())
        try:
            try:
                nv.compileProgram(prog, options)
            except nv.NVRTCError:
                return False, b"", nv.getProgramLog(prog)
            return True, bytes(nv.getCUBIN(prog)), nv.getProgramLog(prog)
        finally:
            nv.destroyProgram(prog)


@functools.lru_cache(maxsize=1)
def _backend() -> _Backend | None:
    path = toolchain.find_nvrtc_library()
    if path is not None:
        try:
            return _CtypesNvrtc(str(path))
        except OSError:
            pass
    try:
        return _CupyNvrtc()
    except Exception:  # noqa: BLE001 - ImportError, or CuPy failing to load its own NVRTC
        return None


def _require_backend() -> _Backend:
    backend = _backend()
    if backend is None:
        raise NvrtcUnavailableError(
            "NVRTC not found: run .ci/install_cuda_tools.sh (pip nvidia-cuda-nvrtc-cu12) "
            "or set DERIVC_NVRTC_LIB"
        )
    return backend


def nvrtc_available() -> bool:
    """True when an NVRTC library (or CuPy's binding) can be loaded."""
    return _backend() is not None


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC in use; raises NvrtcUnavailableError if none."""
    return _require_backend().version()


def _effective_options(backend: _Backend, options: tuple[str, ...]) -> tuple[str, ...]:
    """Check the target architecture and add the default arch and CUDA include path."""
    archs = [m.group(1) for m in map(_ARCH_OPTION.match, options) if m]
    if not archs:
        options = (f"--gpu-architecture={DEFAULT_ARCH}", *options)
        archs = [DEFAULT_ARCH]
    for arch in archs:
        match = re.fullmatch(r"sm_(\d+)([af]?)", arch)
        if match is None:
            raise ValueError(
                f"{arch!r}: a real architecture (sm_XX) is needed to get a cubin, not PTX"
            )
        number, suffix = int(match.group(1)), match.group(2)
        version = backend.version()
        if number not in backend.supported_archs() or (
            suffix and version < _MIN_VERSION_ARCH_SPECIFIC
        ):
            raise CompileError(
                f"NVRTC {version} does not support {arch}", options=options
            )
    include = toolchain.find_cuda_include_dir()
    if include is not None and f"-I{include}" not in options:
        options = (*options, f"-I{include}")
    return options


def compile_cubin(
    source: str, name: str, options: tuple[str, ...] = (), *, use_cache: bool = True
) -> CompileResult:
    """Compile ``source`` (CUDA C++) to a cubin.

    ``name`` is the program name NVRTC uses in diagnostics.  Without an
    ``--gpu-architecture=``/``-arch=`` option the target is :data:`DEFAULT_ARCH`.
    Raises :class:`CompileError` (with ``.log``) when NVRTC rejects the
    program, :class:`NvrtcUnavailableError` when NVRTC is missing.
    """
    backend = _require_backend()
    version = backend.version()
    effective = _effective_options(backend, tuple(options))
    key = cache.cache_key(
        source=source, name=name, options=effective, nvrtc_version=version
    )
    if use_cache:
        entry = cache.load(key)
        if entry is not None:
            return CompileResult(
                entry.cubin, entry.log, effective, version, cache_hit=True
            )
    # libnvrtc installs SIGINT / SIGTERM handlers of its own while it compiles (the first
    # compile of a process): a signal then would end the process at once (exit 4, no message, a
    # half-written build left behind).  Held back, it reaches derivc's handler when NVRTC returns,
    # provided no other thread takes it meanwhile: derivc starts its threads (coqc's, numpy's
    # BLAS threads) with SIGINT / SIGTERM blocked (compiler.cli).
    with signals_held():
        ok, cubin, log = backend.compile(source, name, effective)
    if not ok:
        raise CompileError(
            f"NVRTC failed to compile {name}", log=log, options=effective
        )
    if use_cache:
        cache.store(key, cubin, log)
    return CompileResult(cubin, log, effective, version, cache_hit=False)
