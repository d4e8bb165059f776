"""Passing numeric checks of derivation steps, shared between the processes of one test run.

A step's numeric check (compiler.derive.numeric_check) is a function of the spec program, the
rewritten program, the draw plan, the step's seed and error scale, and of the checking code (this
package's sources).  With $DERIVC_CHECK_CACHE naming a directory, a check of the same step done
before (a key over all of these) returns the draws it recorded: the test suite sets it for the
subprocess builds of its mutation tests, which rebuild the same examples at the same seed with
only a kernel template or printer changed.  Unset (the default, and every user's build), every
check runs.  Only passing checks are recorded, each entry written to a temporary name and moved
into place (os.replace), so a reader never sees half an entry.

Inside `shared_in_process()` a passing check is also kept in memory under the same key: the
variants of a tuned build derive the same first steps again (the same programs, plan and seed:
the same check; decode_splitkv_nq's 116 checks are 68 distinct ones).  The test suite's shared
example builds run inside it.  A check is a deterministic function of its key (the checking
code included); the memory is used only inside the context, because a test that patches the
interpreter in memory changes no source file (its checks must run).
"""
from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

ENV = "DERIVC_CHECK_CACHE"


@lru_cache(maxsize=None)
def code_digest() -> str:
    """sha256 over this package's sources (the interpreter, the draws, the rules, ...)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


_MEMO: dict[str, str] = {}  # key -> the records' JSON, passing checks of this process
_SHARING: list[bool] = []  # non-empty inside shared_in_process()


@contextmanager
def shared_in_process() -> Iterator[None]:
    """Within the block, a check done before in this process (inside such a block) is read back
    from memory."""
    _SHARING.append(True)
    try:
        yield
    finally:
        _SHARING.pop()


def _key(parts: tuple[Any, ...]) -> str:
    return hashlib.sha256((code_digest() + "\0" + repr(parts)).encode()).hexdigest()


def _exact_json(records: list[dict[str, Any]]) -> str | None:
    """The records as JSON when they come back from it as they were (a NaN or a tuple would not)."""
    try:
        text = json.dumps(records)
        return text if json.loads(text) == records else None
    except (TypeError, ValueError):
        return None


def cached(parts: tuple[Any, ...], check: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """check()'s records, or those a passing check with the same parts (compared by repr: the
    programs and the plan are frozen dataclasses) recorded in this process (inside
    shared_in_process()) or under $DERIVC_CHECK_CACHE."""
    sharing = bool(_SHARING)
    root = os.environ.get(ENV)
    if not (sharing or root):
        return check()
    key = _key(parts)
    if sharing and key in _MEMO:
        return json.loads(_MEMO[key])
    entry = Path(root) / f"{key}.json" if root else None
    if entry is not None:
        try:
            text = entry.read_text()
            records = json.loads(text)
            if sharing:
                _MEMO[key] = text
            return records
        except (OSError, ValueError):
            pass
    records = check()  # raises on a failing check: nothing recorded
    text = _exact_json(records)
    if text is not None:
        if sharing:
            _MEMO[key] = text
        if entry is not None:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, entry)
    return records
