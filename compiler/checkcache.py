"""Passing numeric checks of derivation steps, shared between the processes of one test run.

A step's numeric check (compiler.derive.numeric_check) is a function of the spec program, the
rewritten program, the draw plan, the step's seed and error scale, and of the checking code (this
package's sources).  With $DERIVC_CHECK_CACHE naming a directory, a check of the same step done
before (a key over all of these) returns the draws it recorded: the test suite sets it for the
subprocess builds of its mutation tests, which rebuild the same examples at the same seed with
only a kernel template or printer changed.  Unset (the default, and every user's build), every
check runs.  Only passing checks are recorded, each entry written to a temporary name and moved
into place (os.replace), so a reader never sees half an entry.
"""
from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

ENV = "DERIVC_CHECK_CACHE"


@lru_cache(maxsize=None)
def code_digest() -> str:
    """sha256 over this package's sources (the interpreter, the draws, the rules, ...)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def cached(parts: tuple[Any, ...], check: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """check()'s records, or those a passing check with the same parts (compared by repr: the
    programs and the plan are frozen dataclasses) recorded under $DERIVC_CHECK_CACHE."""
    root = os.environ.get(ENV)
    if not root:
        return check()
    key = hashlib.sha256((code_digest() + "\0" + repr(parts)).encode()).hexdigest()
    entry = Path(root) / f"{key}.json"
    try:
        return json.loads(entry.read_text())
    except (OSError, ValueError):
        pass
    records = check()  # raises on a failing check: nothing recorded
    try:
        text = json.dumps(records)
        exact = json.loads(text) == records  # (a NaN or a tuple would not come back as it was)
    except (TypeError, ValueError):
        exact = False
    if exact:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, entry)
    return records
