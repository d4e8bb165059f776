"""DIR/tuning.json: which schedule variant runs at which shape, as `derivc tune` measured it.

A shape falls in a bucket by the binary order of magnitude of each dynamic size, rounded up
(n -> ceil(log2 n): 1, 2, 3-4, 5-8, ..., 2049-4096, ...), so a table measured at a few shapes
serves every shape of the same magnitudes.  The table records every measurement it was
chosen from; `derivc verify` checks that each winner is a variant the build built and that
the winner is the fastest of its row.  No GPU is needed to read it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TUNING_FILE = "tuning.json"


def bucket(sizes: dict[str, int], dynamic: tuple[str, ...]) -> str:
    """The bucket key of a shape: 'M:7,N:12,K:12' (ceil(log2) of the dynamic sizes, in order)."""
    return ",".join(f"{n}:{max(int(sizes[n]) - 1, 0).bit_length()}" for n in dynamic)


def chain_dynamic(program: Any) -> tuple[str, ...]:
    """The sizes a chain of kernels' table buckets by: the spec's dynamic sizes, in its order
    (a one-kernel build buckets by its kernel's dynamic sizes)."""
    return tuple(n for n, v in program.sizes if v is None)


def read_tuning(build: Path, built: set[str]) -> dict[str, Any] | None:
    """DIR/tuning.json checked against the build's variants (ValueError naming the file and the
    problem); None when the build was never tuned."""
    path = Path(build) / TUNING_FILE
    if not path.exists():
        return None
    try:
        table = json.loads(path.read_text())
        dynamic = table["dynamic"]
        rows = table["buckets"]
        assert isinstance(dynamic, list) and all(isinstance(n, str) for n in dynamic)
        assert isinstance(rows, dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise ValueError(f"{path}: not the tuning table `derivc tune` writes") from None
    for key, row in rows.items():
        try:
            winner, times, sizes = row["variant"], row["ms"], row["sizes"]
            assert isinstance(times, dict) and times and isinstance(sizes, dict)
        except (KeyError, TypeError, AssertionError):
            raise ValueError(f"{path}: bucket {key}: not a row `derivc tune` writes") from None
        if key != bucket(sizes, tuple(dynamic)):
            raise ValueError(f"{path}: bucket {key}: its measured sizes {sizes} fall in {bucket(sizes, tuple(dynamic))}")
        unknown = sorted(set(times) - built)
        if winner not in built or unknown:
            raise ValueError(f"{path}: bucket {key}: {winner if winner not in built else unknown[0]} is not a "
                             "variant this build built")
        if times[winner] != min(times.values()):
            raise ValueError(f"{path}: bucket {key}: {winner} ({times[winner]} ms) is not the fastest measured")
    return table
