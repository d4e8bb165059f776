"""DIR/variants/<name>/ and DIR/variants.json: the non-default schedule variants of a build.

Each variant is derived with the default's seed and written as an ordinary build directory
(its derivation.json records the choice, so `derivc.load` and `derivc verify` replay it); a
variant whose derivation or codegen fails is listed with its one-line reason and leaves no
directory.  A failing proof obligation is not a refusal: it fails the whole build.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from .errors import DerivationError, SpecError
from .schedule_variants import ScheduleVariant

VARIANTS_FILE = "variants.json"
VARIANTS_DIR = "variants"


def build_variant(v: ScheduleVariant, file: str, seed: int, seed_given: bool, spec_text: str | None = None) -> Any:
    """Derive one variant (raises SpecError / DerivationError when it is illegal)."""
    from .derive import derive
    from .trace import verify_roundtrip

    d = derive(v.spec, file, seed=seed)
    d.seed_given = seed_given
    d.variant_choice = v.as_dict()
    if spec_text is not None:
        d.spec_text = spec_text
    try:
        verify_roundtrip(d)
    except AssertionError as exc:
        raise DerivationError("trace", f"the derivation does not replay: {exc}", None, file) from None
    return d


def write_variants(default: ScheduleVariant, others: list[ScheduleVariant], outdir: Path, *, file: str, seed: int,
                   seed_given: bool, write: Callable[[Any, Path], None], spec_text: str | None = None) -> dict[str, Any]:
    """Build every variant of `others` into outdir/variants/<name>/ with `write(derivation, dir)`;
    write outdir/variants.json (the default first) and return it."""
    from .cli import BuildError

    rows: list[dict[str, Any]] = [{"name": default.name, "choice": default.as_dict(), "dir": ".", "status": "built"}]
    for v in others:
        sub = outdir / VARIANTS_DIR / v.name
        try:
            d = build_variant(v, file, seed, seed_given, spec_text)
            sub.mkdir(parents=True)
            write(d, sub)
        except (SpecError, DerivationError, BuildError) as exc:
            if sub.exists():  # a directory this build made inside its own temporary tree
                shutil.rmtree(sub)
            reason = " ".join(str(exc).split()).removeprefix(f"{file}: ")
            rows.append({"name": v.name, "choice": v.as_dict(), "dir": None, "status": "refused", "reason": reason})
            continue
        rows.append({"name": v.name, "choice": v.as_dict(), "dir": f"{VARIANTS_DIR}/{v.name}", "status": "built"})
    table = {"default": default.name, "variants": rows}
    (outdir / VARIANTS_FILE).write_text(json.dumps(table, indent=2, allow_nan=False) + "\n")
    return table


def read_variants(build: Path) -> dict[str, Any] | None:
    """DIR/variants.json, checked for shape (ValueError naming the file); None without one."""
    path = Path(build) / VARIANTS_FILE
    if not path.exists():
        return None
    try:
        table = json.loads(path.read_text())
        rows = table["variants"]
        assert isinstance(rows, list) and rows and rows[0]["dir"] == "." and rows[0]["name"] == table["default"]
        for r in rows:
            assert isinstance(r["name"], str) and r["status"] in ("built", "refused")
            assert (r["dir"] is None) == (r["status"] == "refused")
    except (ValueError, KeyError, TypeError, AssertionError, IndexError):
        raise ValueError(f"{path}: not the variants table derivc build writes") from None
    return table


def built_dirs(build: Path) -> dict[str, Path]:
    """Variant name -> its build directory (the default is DIR itself)."""
    table = read_variants(build)
    if table is None:
        return {}
    return {r["name"]: Path(build) / r["dir"] for r in table["variants"] if r["status"] == "built"}
