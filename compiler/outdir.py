"""Where a build lands: derivc never deletes or overwrites a file it did not write.

A build is written into a temporary directory beside DIR and swapped into place only when it
is complete.  Every build directory carries a marker, `.derivc-build`: a small JSON listing
each file derivc wrote there with its sha256, and each folder it made.  An existing DIR is
replaced only when it is empty, or when it is such a build and holds nothing but those files,
unchanged, and those folders (plus `proofs/verify.json`, which `derivc verify` writes);
anything else, an empty folder too, is refused (exit 2).

The swap is one `renameat2(RENAME_EXCHANGE)` where the kernel offers it (two renames
otherwise), with SIGINT / SIGTERM held back while the old build is exchanged and removed.
An interrupted or failed build removes its temporary directory and leaves DIR as it was;
under `interrupts_raise` (the command line) one signal unwinds the build, later ones are
ignored so that nothing cuts the clean-up short, and `outcome_line` says what DIR holds.
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
from collections.abc import Callable, Iterable, Iterator, Sequence
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


def _walk_dirs(root: Path) -> Iterator[str]:
    """Posix path relative to root of every directory under it (links not followed)."""
    for dirpath, dirnames, _ in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in sorted(dirnames):
            if not (base / name).is_symlink():
                yield (base / name).relative_to(root).as_posix()


def _implied_dirs(files: Iterable[str]) -> set[str]:
    """The folders that hold these files (posix paths relative to the build)."""
    return {p.as_posix() for rel in files for p in Path(rel).parents if p != Path(".")}


def write_marker(directory: Path, marker: str = BUILD_MARKER) -> None:
    """Record every file and folder now in `directory` as written by derivc.  Folders that hold
    a recorded file are implied; the others (empty ones) are listed under "dirs", which a build
    without such folders leaves out (its marker reads as before folders were recorded)."""
    files = {rel: _sha256(p) for rel, p in _walk_files(directory) if rel != marker and rel not in WRITTEN_LATER}
    body: dict[str, object] = {"derivc": __version__, "kind": "build" if marker == BUILD_MARKER else "failed build",
                               "files": files}
    implied = _implied_dirs(files) | _implied_dirs(WRITTEN_LATER)
    empty = [rel for rel in _walk_dirs(directory) if rel not in implied]
    if empty:
        body["dirs"] = empty
    (directory / marker).write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def foreign_files(directory: Path, marker: str = BUILD_MARKER) -> list[str] | None:
    """Files of `directory` that derivc did not write (or that changed since), then folders it did
    not make (`name/`, empty ones too); None when the directory carries no readable marker."""
    try:
        body = json.loads((directory / marker).read_text())
        recorded = body["files"]
        listed = body.get("dirs", [])
        if not isinstance(recorded, dict) or not isinstance(listed, list):
            return None
        dirs = _implied_dirs(recorded) | {str(d) for d in listed}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    out = []
    for rel, p in _walk_files(directory):
        if rel == marker or rel in WRITTEN_LATER:
            continue
        if p.is_symlink() or not p.is_file() or recorded.get(rel) != _sha256(p):
            out.append(rel)
    dirs |= _implied_dirs(rel for rel in WRITTEN_LATER if (directory / rel).is_file())
    return out + [f"{rel}/" for rel in _walk_dirs(directory) if rel not in dirs]


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


def _reinstall_handlers() -> None:
    """Put Python's SIGINT / SIGTERM handlers back at the C level.  A C library may install its
    own for a while (libnvrtc does, during its first compile) and leave them behind; Python's
    `signal.getsignal` still reports its own then, so re-installing is the only sure check."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in _SIGNALS:
        handler = signal.getsignal(s)
        if handler is not None:  # None: installed outside Python, not ours to restore
            signal.signal(s, handler)


class Interrupts:
    """SIGINT raises KeyboardInterrupt and SIGTERM raises Terminated in the main thread, once:
    every later SIGINT / SIGTERM is ignored, so that the clean-up the first one started (every
    `finally` on the way out) is never cut short by a second (`timeout` and process-group kills
    send two).  A signal that comes during `signals_held` is raised when the held section ends,
    even when another thread took it (Python runs handlers in the main thread whichever thread
    the signal went to, so blocking it in the main thread alone does not hold it back)."""

    def __init__(self) -> None:
        self.received: int | None = None  # the signal raised
        self.deferred: int | None = None  # a signal that came during a held section
        self.holding = 0  # depth of held sections in the main thread
        self.closed = False  # the command is over: nothing raises any more

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None or self.closed:
            return
        if self.holding:
            self.deferred = self.deferred or signum
            return
        self._raise(signum)

    def release(self) -> None:
        """End of the outermost held section: raise the signal that came during it."""
        if self.deferred is not None and self.received is None and not self.closed:
            signum, self.deferred = self.deferred, None
            self._raise(signum)

    def _raise(self, signum: int) -> None:
        self.received = signum
        if signum == getattr(signal, "SIGTERM", None):
            raise Terminated(signum)
        raise KeyboardInterrupt


_active: Interrupts | None = None  # the one `interrupts_raise` in force (signal handlers are per process)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT / SIGTERM wait until the block is done (then they are delivered, to Python's
    handlers even if C code inside the block replaced them)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    state = _active if threading.current_thread() is threading.main_thread() else None
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    if state is not None:
        state.holding += 1
    try:
        yield
    finally:
        _reinstall_handlers()
        if state is not None:
            state.holding -= 1
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if state is not None and not state.holding:
            state.release()


@contextlib.contextmanager
def interrupts_raise(*, exiting: bool = False) -> Iterator[Interrupts]:
    """While active, SIGINT / SIGTERM unwind the main thread once (`Interrupts`), so that an
    interrupted build cleans up after itself.  On the way out the previous handlers come back,
    except after an interrupt (later signals stay ignored).  `exiting`: the process ends right
    after (the command line): SIGINT / SIGTERM are then ignored for good, so that the exit code
    already decided stands (Python's finalization would put the default handlers back)."""
    global _active
    state = Interrupts()
    if threading.current_thread() is not threading.main_thread() or not _SIGNALS:
        yield state
        return
    previous = {s: signal.signal(s, state.handle) for s in _SIGNALS}
    outer, _active = _active, state
    try:
        yield state
    finally:
        state.closed = True
        _active = outer
        if exiting:  # ignored in every thread (Python's finalization keeps SIG_IGN, not its own handlers)
            for s in _SIGNALS:
                signal.signal(s, signal.SIG_IGN)
        elif state.received is None:
            for s, handler in previous.items():
                signal.signal(s, handler)


def dir_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the directory at `path`, None when there is none: the swap gives DIR
    a new inode, so comparing identities tells whether a build was put in place."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def outcome_line(path: Path, before: tuple[int, int] | None) -> str:
    """What an interrupted build left at `path`, given its identity when the build started."""
    now = dir_identity(path)
    if now == before:
        return f"{path} left as it was" if now is not None else f"{path} not created"
    return f"{path} holds the new build (it was complete when the signal came)"


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
    with signals_held():  # an interrupt between mkdtemp and the `try` would leave it behind
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
        with signals_held():  # an interrupt between mkdtemp and the assignment would leave it behind
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
