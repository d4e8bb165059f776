"""On-disk cache of compiled cubins.

* Key: sha256 over (entry format, source, program name, effective options,
  NVRTC version, derivc version).
* Directory: ``$DERIVC_CACHE_DIR``, else ``~/.cache/derivc``.
* Entry file ``<key>.cubin.entry``: a magic line, the sha256 of the payload, the
  log length, the log, the cubin.  Entries are written to a temp file in the
  same directory and moved into place with ``os.replace``, so readers never
  see a half-written file; any entry that fails validation (truncated,
  corrupted, wrong magic, not ELF) is treated as a miss, deleted and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

__all__ = [
    "CacheEntry",
    "cache_dir",
    "cache_key",
    "derivc_version",
    "entry_path",
    "load",
    "store",
]

_FORMAT = 1
_MAGIC = b"DERIVC-CUBIN-CACHE-1\n"
_HEADER = struct.Struct("<32sQ")  # payload sha256, log length
_ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class CacheEntry:
    cubin: bytes
    log: str


def derivc_version() -> str:
    """Version of the installed derivc distribution, or a placeholder from a bare checkout."""
    try:
        return metadata.version("derivc")
    except metadata.PackageNotFoundError:
        return "0+checkout"


def cache_dir() -> Path:
    """The cache directory (not created until the first store)."""
    override = os.environ.get("DERIVC_CACHE_DIR")
    return Path(override) if override else Path.home() / ".cache" / "derivc"


def cache_key(
    *, source: str, name: str, options: tuple[str, ...], nvrtc_version: tuple[int, int]
) -> str:
    """Hex sha256 identifying one compilation."""
    blob = json.dumps(
        {
            "format": _FORMAT,
            "source": source,
            "name": name,
            "options": list(options),
            "nvrtc": list(nvrtc_version),
            "derivc": derivc_version(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def entry_path(key: str) -> Path:
    return cache_dir() / f"{key}.cubin.entry"


def _decode(data: bytes) -> CacheEntry | None:
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _HEADER.size:
        return None
    digest, log_len = _HEADER.unpack_from(data, len(_MAGIC))
    payload = data[len(_MAGIC) + _HEADER.size :]
    if hashlib.sha256(payload).digest() != digest or log_len > len(payload):
        return None
    cubin = payload[log_len:]
    if not cubin.startswith(_ELF_MAGIC):
        return None
    return CacheEntry(cubin=cubin, log=payload[:log_len].decode(errors="replace"))


def load(key: str) -> CacheEntry | None:
    """The cached entry for ``key``; None on a miss or an invalid entry (which is removed)."""
    path = entry_path(key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    entry = _decode(data)
    if entry is None:
        try:
            path.unlink()
        except OSError:
            pass
    return entry


def store(key: str, cubin: bytes, log: str) -> None:
    """Write an entry atomically.  Failures (read-only disk, ...) are ignored: the cache is optional."""
    log_bytes = log.encode()
    payload = log_bytes + cubin
    data = (
        _MAGIC
        + _HEADER.pack(hashlib.sha256(payload).digest(), len(log_bytes))
        + payload
    )
    write_entry(entry_path(key), data)


def write_entry(path: Path, data: bytes) -> None:
    """Write a cache entry atomically: a temp file beside it, then os.replace, so a reader never
    sees half an entry.  Failures (read-only disk, ...) are ignored: every cache is optional."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
