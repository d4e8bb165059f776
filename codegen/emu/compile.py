"""Compile an emitted kernel.cu with the host g++ against the emulation layer (sha256 cache).

    g++ -std=c++17 -O1 -fno-strict-aliasing -DDERIVC_EMU -include derivc_emu.h kernel.cu+stub \
        derivc_emu_runtime.o -shared -fPIC -o k.so

The runtime (fibers, barriers, async queues, the instruction semantics) is compiled once into
object files cached by their own hash, and derivc_emu.h once into a precompiled header (it pulls in
<cmath>, which costs more to parse than a kernel); a kernel compile then reads the .gch, compiles
the kernel at -O1 and links (a cold cache builds the runtime in parallel with the rest).  Cache: ``$DERIVC_CACHE_DIR/emu`` else ``~/.cache/derivc/emu``; keys cover the source,
the entry, every file of the include directories, the flags and the g++ version; files are
written to a temp name in the same directory and moved into place (os.replace), so a reader
never sees a half-written .so.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from codegen.cache import cache_dir

INCLUDE = Path(__file__).resolve().parent / "include"
CXX = os.environ.get("DERIVC_EMU_CXX", "g++")
_COMMON = ("-std=c++17", "-fno-strict-aliasing", "-fPIC", "-fvisibility=hidden", "-DDERIVC_EMU",
           "-fno-exceptions", "-fno-rtti")
# stack-clash probes: a frame larger than the fiber stack touches its guard page, never a neighbour's stack
KERNEL_FLAGS = _COMMON + ("-O1", "-w", "-fstack-clash-protection")
RUNTIME_FLAGS = _COMMON + ("-O2",)
_FORMAT = 1

# the launch entry: calls the kernel by name, parameter types deduced from its declaration
_STUB = r"""
#line 1 "derivc_emu_stub"
#include <type_traits>
#include <utility>
namespace derivc_emu {
const char* launch(void (*)(void**), void**, int, int, int, int, int, int, unsigned);
}
namespace derivc_emu_stub {
template <class... P, std::size_t... I>
void call(void (*f)(P...), void** a, std::index_sequence<I...>) { f(*static_cast<P*>(a[I])...); }
template <class... P> void run(void (*f)(P...), void** a) { call(f, a, std::index_sequence_for<P...>{}); }
template <class P> constexpr char kind() { return std::is_pointer<P>::value ? 'p' : sizeof(P) == 8 ? 'l' : 'i'; }
template <class... P> const char* signature(void (*)(P...)) { static const char s[] = {kind<P>()..., 0}; return s; }
void thunk(void** a) { run(&ENTRY, a); }
}
extern "C" __attribute__((visibility("default"))) const char* derivc_emu_signature() {
    return derivc_emu_stub::signature(&ENTRY);
}
extern "C" __attribute__((visibility("default")))
const char* derivc_emu_launch(void** args, int gx, int gy, int gz, int threads, int smem, int order, unsigned seed) {
    return derivc_emu::launch(&derivc_emu_stub::thunk, args, gx, gy, gz, threads, smem, order, seed);
}
"""


def host_compiler() -> str | None:
    """The host C++ compiler's path ($DERIVC_EMU_CXX, default g++), or None when there is none."""
    import shutil
    return shutil.which(CXX)


class EmuCompileError(RuntimeError):
    """g++ refused the kernel (or the runtime): the message carries its diagnostics."""


def emu_cache_dir() -> Path:
    return cache_dir() / "emu"


def _dir_digest(dirs: tuple[Path, ...]) -> str:
    h = hashlib.sha256()
    for d in dirs:
        for p in sorted(d.iterdir()):
            if p.is_file() and p.suffix in (".h", ".cpp"):
                h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


@lru_cache(maxsize=None)
def _cxx_version() -> str:
    return subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]


def _key(*parts: str) -> str:
    h = hashlib.sha256(str(_FORMAT).encode())
    for p in parts:
        h.update(b"\0" + p.encode())
    return h.hexdigest()


def _build(out: Path, argv: list[str], what: str) -> Path:
    """Run the compiler into a temp file next to `out`, then move it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.stem[:16]}.", suffix=out.suffix, dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run(argv + ["-o", tmp], capture_output=True, text=True)
        if r.returncode != 0:
            raise EmuCompileError(f"{what}: g++ failed:\n{r.stderr[-6000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _includes(extra: tuple[str, ...]) -> tuple[Path, ...]:
    return (INCLUDE,) + tuple(Path(d) for d in extra)


RUNTIME_SOURCES = ("derivc_emu_runtime.cpp", "derivc_emu_instr.cpp")


def runtime_objects(include_dirs: tuple[str, ...] = ()) -> tuple[Path, ...]:
    """The compiled runtime, one object per source (cached; compiled in parallel when missing)."""
    dirs = _includes(include_dirs)
    key = _key("runtime", _dir_digest(dirs), " ".join(RUNTIME_FLAGS), _cxx_version())
    outs = tuple(emu_cache_dir() / f"{Path(src).stem}-{key[:32]}.o" for src in RUNTIME_SOURCES)

    def one(src: str, out: Path) -> Path:
        if out.exists():
            return out
        argv = [CXX, *RUNTIME_FLAGS, *(f"-I{d}" for d in dirs), "-c", str(INCLUDE / src)]
        return _build(out, argv, src)

    with ThreadPoolExecutor(max_workers=len(outs)) as pool:
        return tuple(pool.map(one, RUNTIME_SOURCES, outs))


def precompiled_header(include_dirs: tuple[str, ...] = ()) -> Path:
    """A directory holding derivc_emu.h.gch for the kernel flags (cached); put it first on -I."""
    dirs = _includes(include_dirs)
    key = _key("pch", _dir_digest(dirs), " ".join(KERNEL_FLAGS), _cxx_version())
    out = emu_cache_dir() / f"pch-{key[:32]}" / "derivc_emu.h.gch"
    if out.exists():
        return out.parent
    argv = [CXX, *KERNEL_FLAGS, *(f"-I{d}" for d in dirs), "-x", "c++-header", str(INCLUDE / "derivc_emu.h")]
    return _build(out, argv, "derivc_emu.h (precompiled)").parent


def compile_shared(source: str, entry: str, include_dirs: tuple[str, ...] = ()) -> Path:
    """The path of the cached .so of `source` with its launch stub for `entry`."""
    if not entry.isidentifier():
        raise ValueError(f"kernel entry {entry!r} is not a C identifier")
    dirs = _includes(include_dirs)
    key = _key("kernel", source, entry, _dir_digest(dirs), " ".join(KERNEL_FLAGS), _cxx_version())
    out = emu_cache_dir() / f"{entry[:40]}-{key[:32]}.so"
    if out.exists():
        return out
    text = '#line 1 "kernel.cu"\n' + source + "\n" + _STUB.replace("ENTRY", entry)
    with ThreadPoolExecutor(max_workers=1) as pool, tempfile.TemporaryDirectory(prefix="derivc-emu-") as tmp:
        runtime = pool.submit(runtime_objects, include_dirs)
        pch = precompiled_header(include_dirs)
        src, obj = Path(tmp) / "kernel_emu.cpp", Path(tmp) / "kernel_emu.o"
        src.write_text(text)
        r = subprocess.run([CXX, *KERNEL_FLAGS, f"-I{pch}", *(f"-I{d}" for d in dirs), "-include", "derivc_emu.h",
                            "-x", "c++", "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
        if r.returncode != 0:
            raise EmuCompileError(f"{entry}: g++ failed:\n{r.stderr[-6000:]}")
        return _build(out, [CXX, str(obj), *map(str, runtime.result()), "-shared"], entry)
