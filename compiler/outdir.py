"""Where a build lands: derivc never deletes or overwrites a file it did not write.

A build is written into a temporary directory beside DIR and swapped into place only when it
is complete.  Every build directory carries a marker, `.derivc-build`: a small JSON listing
each file derivc wrote there with its sha256.  An existing DIR is replaced only when it is
empty, or when it is such a build and holds nothing but those files, unchanged (plus
`proofs/verify.json`, which `derivc verify` writes); anything else is refused (exit 2).

The swap is one `renameat2(RENAME_EXCHANGE)` where the kernel offers it (two renames
otherwise), with SIGINT / SIGTERM held back while the old build is exchanged and removed.
An interrupted or failed build removes its temporary directory and leaves DIR as it was.
When codegen fails, the kernel source and the compiler log are moved to `DIR.failed/` (a
directory of its own kind, marked `.derivc-failed`, replaced under the same rules).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType

from . import __version__
from .errors import EXIT_INVALID_INPUT

BUILD_MARKER = ".derivc-build"
FAILED_MARKER = ".derivc-failed"
# Files that derivc itself adds to a finished build later (not listed in the marker).
WRITTEN_LATER = frozenset({"proofs/verify.json"})
_SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s is not None)


class OutputRefused(Exception):
    """DIR (or DIR.failed) holds something derivc did not write: nothing is touched (exit 2)."""

    exit_code = EXIT_INVALID_INPUT


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like KeyboardInterrupt, so every `finally` cleans up."""

    def __init__(self, signum: int):
        super().__init__(f"terminated by signal {signum}")
        self.exit_code = 128 + signum


# --------------------------------------------------------------------------- markers


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _walk_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(posix path relative to root, path) of every non-directory entry, links not followed."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        links = [d for d in dirnames if (base / d).is_symlink()]
        for name in sorted(filenames + links):
            yield (base / name).relative_to(root).as_posix(), base / name


def write_marker(directory: Path, marker: str = BUILD_MARKER) -> None:
    """Record every file now in `directory` as written by derivc."""
    files = {rel: _sha256(p) for rel, p in _walk_files(directory) if rel != marker and rel not in WRITTEN_LATER}
    body = {"derivc": __version__, "kind": "build" if marker == BUILD_MARKER else "failed build", "files": files}
    (directory / marker).write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def foreign_files(directory: Path, marker: str = BUILD_MARKER) -> list[str] | None:
    """Files of `directory` that derivc did not write (or that changed since), in path order;
    None when the directory carries no readable marker."""
    try:
        recorded = json.loads((directory / marker).read_text())["files"]
        if not isinstance(recorded, dict):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    out = []
    for rel, p in _walk_files(directory):
        if rel == marker or rel in WRITTEN_LATER:
            continue
        if p.is_symlink() or not p.is_file() or recorded.get(rel) != _sha256(p):
            out.append(rel)
    return out


def check_replaceable(target: Path, marker: str = BUILD_MARKER) -> None:
    """Raise OutputRefused unless `target` is absent, empty, or a derivc directory of this
    kind holding only what derivc wrote."""
    if not target.exists() and not target.is_symlink():
        return
    if target.is_symlink():
        raise OutputRefused(f"{target}: is a symbolic link; refusing to replace it")
    if not target.is_dir():
        raise OutputRefused(f"{target}: exists and is not a directory")
    cwd = Path(os.path.abspath(os.getcwd()))
    if cwd == target or target in cwd.parents:
        raise OutputRefused(f"{target}: is the current directory (or contains it); refusing to replace it "
                            "(choose a new directory for the build)")
    if not any(target.iterdir()):
        return
    foreign = foreign_files(target, marker)
    if foreign is None:
        raise OutputRefused(f"{target}: exists and is not a derivc build (no {marker}); refusing to replace it "
                            "(choose a new directory, or remove it yourself)")
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise OutputRefused(f"{target}: holds {foreign[0]}{more}, which derivc did not write (or which changed "
                            "since); refusing to replace it")


# --------------------------------------------------------------------------- signals


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT / SIGTERM wait until the block is done (then they are delivered)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """While active, SIGTERM raises Terminated in the main thread (SIGINT already raises
    KeyboardInterrupt), so that an interrupted build cleans up after itself."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        yield
        return

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- the swap


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2); False where that is not offered."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _put_in_place(staged: Path, target: Path) -> None:
    """Move the complete directory `staged` to `target`, replacing what is there (already
    checked to be replaceable).  Call with signals held."""
    if not target.exists():
        os.replace(staged, target)
        return
    if _exchange(staged, target):
        old = staged
    else:
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, old)  # onto an empty directory: allowed
        try:
            os.replace(staged, target)
        except BaseException:
            os.replace(old, target)
            raise
    shutil.rmtree(old, ignore_errors=True)


def keep_failed(outdir: Path, staged: Path, keep: Sequence[str]) -> str:
    """Move the files `keep` of a failed build's staging directory into `outdir.failed/`;
    returns a note for the error line ('' when there was nothing to keep)."""
    files = [staged / k for k in keep if (staged / k).is_file()]
    if not files:
        return ""
    failed = outdir.with_name(outdir.name + ".failed")
    names = " and ".join(f.name for f in files)
    try:
        check_replaceable(failed, FAILED_MARKER)
    except OutputRefused:
        return f"{names} not kept: {failed} exists and derivc did not write it"
    stage = Path(tempfile.mkdtemp(prefix=f".{failed.name}.tmp-", dir=outdir.parent))
    try:
        os.chmod(stage, 0o755)
        for f in files:
            os.replace(f, stage / f.name)
        write_marker(stage, FAILED_MARKER)
        _put_in_place(stage, failed)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return f"{names} kept in {failed}"


def atomic_dir(outdir: Path, fill: Callable[[Path], None]) -> None:
    """Build a directory in a temp dir beside `outdir`, then swap it into place.

    An existing `outdir` must be replaceable (`check_replaceable`), else OutputRefused before
    anything is written.  On failure or interruption `outdir` is untouched, and neither the
    temp dir nor any parent directory created for it is left behind; an exception with a
    `keep` attribute (file names) has those files moved to `outdir.failed/` first.
    """
    outdir = Path(os.path.abspath(outdir))
    check_replaceable(outdir)
    created: list[Path] = []
    p = outdir.parent
    while not p.exists():
        created.append(p)
        p = p.parent
    tmp: Path | None = None
    try:
        for q in reversed(created):
            q.mkdir()
        tmp = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.tmp-", dir=outdir.parent))
        os.chmod(tmp, 0o755)
        fill(tmp)
        write_marker(tmp)
        with signals_held():
            check_replaceable(outdir)  # again: it may have changed during the build
            _put_in_place(tmp, outdir)
            tmp = None
    except BaseException as exc:
        with signals_held():
            keep = getattr(exc, "keep", ())
            if keep and tmp is not None and not isinstance(exc, (KeyboardInterrupt, Terminated)):
                note = keep_failed(outdir, tmp, keep)
                if note and exc.args and isinstance(exc.args[0], str):
                    exc.args = (f"{exc.args[0]} ({note})",) + exc.args[1:]
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for q in created:  # innermost first
                try:
                    q.rmdir()
                except OSError:
                    break
        raise
