"""The Coq cache of `derivc build`: private to the user, and nothing in it trusted unchecked.

Directory: `$DERIVC_COQ_CACHE`, else `$DERIVC_CACHE_DIR/coq`, else `~/.cache/derivc/coq`; the
parts of it derivc creates are created 0700.  Inside:

    key                   32 random bytes, 0600: the per-user secret of the MACs below
    lib-<src>/            the proof library (proofs_ci/coq) compiled for one source digest and
                          coqc version (<src> covers both)
    lib-<src>/.manifest   sha256 of every file of lib-<src>/ at compile time, with its MAC
    passed/<mac>.json     an obligation coqc passed; <mac> = HMAC(key, obligation key)

Before any use the directory is checked (`open_cache`): it must be owned by the user and not
writable by group or others, and every directory above it — on the path as given, through each
symlink, and on the resolved path — owned by the user or root and not writable by others unless
sticky (/tmp).  A symlink on the path must be owned by the user or root.  Anything else raises
`UnsafeCache` (one line: which directory and why); `compiler.proofcheck` then uses no cache at
all and compiles the library privately in a temporary directory.

A compiled library is used only when its manifest's MAC is right and every file in it matches
its recorded sha256 (otherwise it is compiled again): a planted or damaged .vo never reaches
coqc's `-R`.  A pass record counts only under its MAC'd name.  Why a MAC and not only the
owner and mode of each file: those say who can write the cache now, not who could before — a
record or .vo planted while the directory was open (older derivc versions kept this cache in a
world-writable /tmp/derivc_coq_cache), or copied from another user's or machine's cache, or
restored from a backup, carries no valid MAC, since the key never leaves its 0600 file.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

KEY_FILE = "key"
KEY_BYTES = 32
MANIFEST = ".manifest"
MANIFEST_FORMAT = 1


class UnsafeCache(RuntimeError):
    """The cache directory (or its key) could be written by someone else: not used."""


class CoqLibraryError(RuntimeError):
    """The proof library itself does not compile (a broken installation, not the build's fault)."""


@dataclass(frozen=True)
class CoqLibrary:
    path: Path  # pass as `-R <path> Derivc`
    digest: str  # sha256 over the sources, the compiled files and the coqc version


def cache_root() -> Path:
    if os.environ.get("DERIVC_COQ_CACHE"):
        return Path(os.environ["DERIVC_COQ_CACHE"])
    if os.environ.get("DERIVC_CACHE_DIR"):
        return Path(os.environ["DERIVC_CACHE_DIR"]) / "coq"
    return Path.home() / ".cache" / "derivc" / "coq"


# --------------------------------------------------------------------------- who owns the directory


def _untrusted_above(st: os.stat_result) -> str:
    """Why a directory above the cache would let someone else rename the cache away ("" if not)."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):o}, not sticky)"
    return ""


def _check_path(path: Path, what: str) -> None:
    """The components of absolute `path`: each directory above the last trusted, each symlink
    (the last included) owned by the user or root."""
    part = Path(path.anchor)
    for k, name in enumerate(path.parts[1:], start=2):
        part = part / name
        st = os.lstat(part)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (os.geteuid(), 0):
                raise UnsafeCache(f"{what}: {part} is a symlink owned by uid {st.st_uid}")
        elif k < len(path.parts) and _untrusted_above(st):
            raise UnsafeCache(f"{what}: {part} is {_untrusted_above(st)}")


def check_private(root: Path) -> None:
    """Raise UnsafeCache unless `root` (an existing directory) is the user's alone."""
    root = Path(os.path.abspath(root))
    what = f"Coq cache {root} not used"
    try:
        _check_path(root, what)
        real = Path(os.path.realpath(root))  # where the symlinks lead
        _check_path(real, what)
        st = os.stat(real)
    except OSError as exc:
        raise UnsafeCache(f"{what}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCache(f"{what}: not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeCache(f"{what}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCache(f"{what}: writable by group or others (mode {stat.S_IMODE(st.st_mode):o}; chmod 700 it)")


def _make_private(root: Path) -> None:
    """Create `root` and the parents it lacks, each 0700 (whatever the umask)."""
    missing = []
    p = Path(os.path.abspath(root))
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:  # another process made it: check_private judges it
            continue
        os.chmod(d, 0o700)


def open_cache(root: Path) -> bytes:
    """Create `root` privately if it is missing, check it, and return the user's key (made on
    first use).  Raises UnsafeCache when the cache must not be used."""
    try:
        _make_private(root)
    except OSError as exc:
        raise UnsafeCache(f"Coq cache {root} not used: cannot create it ({exc.strerror or exc})") from None
    check_private(root)
    return _key(Path(root))


def _read_private_file(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise UnsafeCache(f"Coq cache key {path} not used: not a 0600 file of this user "
                              f"(mode {stat.S_IMODE(st.st_mode):o}, uid {st.st_uid})")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def _key(root: Path) -> bytes:
    path = root / KEY_FILE
    try:
        if not os.path.lexists(path):
            fd, tmp = tempfile.mkstemp(prefix=".key.", dir=root)  # mkstemp: 0600
            try:
                os.write(fd, os.urandom(KEY_BYTES))
                os.close(fd)
                try:
                    os.link(tmp, path)  # never over a key another process made first
                except FileExistsError:
                    pass
            finally:
                os.unlink(tmp)
        key = _read_private_file(path)
    except OSError as exc:
        raise UnsafeCache(f"Coq cache key {path} not used: {exc.strerror or exc}") from None
    if len(key) != KEY_BYTES:
        raise UnsafeCache(f"Coq cache key {path} not used: not a key derivc wrote")
    return key


def mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


# --------------------------------------------------------------------------- the compiled library


def source_digest(coq_dir: Path, version: str) -> str:
    h = hashlib.sha256(version.encode())
    for p in sorted(coq_dir.rglob("*.v")):
        if {"examples", "models"} & set(p.relative_to(coq_dir).parts):
            continue
        h.update(p.relative_to(coq_dir).as_posix().encode() + b"\0")
        h.update(p.read_bytes())
    h.update((coq_dir / "_CoqProject").read_bytes())
    return h.hexdigest()[:16]


def _file_hashes(lib: Path) -> dict[str, str]:
    """sha256 of every file under `lib` but the manifest; ValueError on anything not a plain file."""
    out = {}
    for p in sorted(lib.rglob("*")):
        rel = p.relative_to(lib).as_posix()
        if rel == MANIFEST:
            continue
        st = os.lstat(p)
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{rel} is not a plain file")
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _manifest_body(src: str, version: str, files: dict[str, str]) -> str:
    return json.dumps({"format": MANIFEST_FORMAT, "source": src, "coqc": version, "files": files}, sort_keys=True)


def _checked_library(lib: Path, key: bytes, src: str, version: str) -> CoqLibrary | None:
    """`lib` if its manifest is ours and every file matches it, else None."""
    try:
        manifest = json.loads((lib / MANIFEST).read_text())
        files = _file_hashes(lib)
        body = _manifest_body(src, version, files)
        if not hmac.compare_digest(str(manifest.get("mac", "")), mac(key, body)):
            return None
    except (OSError, ValueError, AttributeError):
        return None
    return CoqLibrary(lib, hashlib.sha256(body.encode()).hexdigest())


def _compile_into(parent: Path, src: str, version: str, key: bytes | None) -> Path:
    """Compile the library into a fresh directory under `parent` (with a manifest when `key`)."""
    from proofs_ci import coqlib

    tmp = Path(tempfile.mkdtemp(prefix=f".lib-{src}.tmp-", dir=parent))
    try:
        try:
            coqlib.build_library(coqlib.COQ_DIR, tmp / "coq")
        except coqlib.CoqError as exc:
            raise CoqLibraryError(f"the proof library does not compile: {str(exc).splitlines()[0]}") from None
        if key is not None:
            body = _manifest_body(src, version, _file_hashes(tmp / "coq"))
            (tmp / "coq" / MANIFEST).write_text(json.dumps({"mac": mac(key, body), "body": json.loads(body)}) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def cached_library(root: Path, key: bytes, version: str) -> CoqLibrary:
    """The library compiled under `root` (checked by `open_cache`): reused when every file
    matches its manifest, else compiled again and swapped in."""
    from proofs_ci import coqlib

    src = source_digest(coqlib.COQ_DIR, version)
    lib = root / f"lib-{src}"
    found = _checked_library(lib, key, src, version)
    if found is not None:
        return found
    with _locked(root / ".lock"):  # one process compiles; the others then find its library
        found = _checked_library(lib, key, src, version)
        if found is not None:
            return found
        tmp = _compile_into(root, src, version, key)
        try:
            if os.path.lexists(lib):  # damaged, planted or from before manifests: moved out, removed
                os.replace(lib, tmp / "stale")
            os.replace(tmp / "coq", lib)
        except OSError as exc:
            raise CoqLibraryError(f"cannot replace the compiled library {lib}: {exc.strerror or exc}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        found = _checked_library(lib, key, src, version)
    if found is None:
        raise CoqLibraryError(f"the proof library compiled into {lib} does not match its manifest")
    return found


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


_PRIVATE: dict[str, CoqLibrary] = {}


def private_library(version: str) -> CoqLibrary:
    """The library compiled once per process in a temporary directory of its own (removed at
    exit): for a cache that must not be used."""
    import atexit

    from proofs_ci import coqlib

    src = source_digest(coqlib.COQ_DIR, version)
    if src not in _PRIVATE:
        tmp = _compile_into(Path(tempfile.gettempdir()), src, version, None)
        atexit.register(shutil.rmtree, tmp, True)
        files = _file_hashes(tmp / "coq")
        _PRIVATE[src] = CoqLibrary(tmp / "coq", hashlib.sha256(_manifest_body(src, version, files).encode()).hexdigest())
    return _PRIVATE[src]


# --------------------------------------------------------------------------- pass records


def _entry(root: Path, key: bytes, obligation: str) -> Path:
    return root / "passed" / f"{mac(key, obligation)}.json"


def cached_pass(root: Path, key: bytes, obligation: str) -> bool:
    try:
        fd = os.open(_entry(root, key, obligation), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            return json.load(f).get("key") == obligation
    except (OSError, ValueError, AttributeError):
        return False


def store_pass(root: Path, key: bytes, obligation: str, file: str, seconds: float) -> None:
    """Record a pass atomically; a cache that cannot be written is no error."""
    directory = root / "passed"
    try:
        _make_private(directory)
        fd, tmp = tempfile.mkstemp(prefix=f".{obligation[:16]}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"key": obligation, "file": file, "seconds": seconds}, f)
            os.replace(tmp, _entry(root, key, obligation))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
