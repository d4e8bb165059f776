"""DIR/tuning.json: which schedule variant runs at which shape, as `derivc tune` measured it.

A shape falls in a bucket by the binary order of magnitude of each dynamic size, rounded up
(n -> ceil(log2 n): 1, 2, 3-4, 5-8, ..., 2049-4096, ...), so a table measured at a few shapes
serves every shape of the same magnitudes.  The table records every measurement it was
chosen from; `derivc verify` checks that each winner is a variant the build built and that
the winner is the fastest of its row.  No GPU is needed to read it.

Not every variant is timed in full at every shape (the pruning rule, applied per shape):
1. skip: a split variant (a reduction split across S > 1 blocks) whose grid would still fill
   the GPU SATURATED_WAVES times over with half its split factor (`oversplit`): there the split
   buys no parallelism, only the partials' traffic and a combine.  Never every variant: when
   the rule would skip all, those with the fewest splits stay.
2. screen: every other variant is timed briefly (a few repetitions); the KEEP fastest and any
   within WITHIN of the fastest (a short timing's noise) are the finalists (`finalists`).
3. time: the finalists are timed in full; the winner is the fastest of them.
A row records each variant's grid (`candidates`: blocks, splits, resident blocks per SM), the
screen times and the full times, so `read_tuning` re-applies the rule: the skipped and the
finalists must be exactly what the rule gives (a table pruned otherwise is refused).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

TUNING_FILE = "tuning.json"
SATURATED_WAVES = 4  # resident-block waves after which more blocks add no parallelism
KEEP = 3             # finalists per shape, by screen time
WITHIN = 0.05        # ... and any variant screened within 5 % of the fastest


@dataclass(frozen=True)
class Candidate:
    """A built variant at one shape: what its (first) kernel's launch needs."""

    name: str
    blocks: int    # grid blocks of its first kernel at the shape, the split included
    splits: int    # the reduction's split factor across blocks (1: no split)
    resident: int  # its blocks that fit on one SM at once (threads, shared memory)

    def as_list(self) -> list[int]:
        return [self.blocks, self.splits, self.resident]


def resident_blocks(threads: int, smem_bytes: int, *, max_threads: int = 2048, smem_per_sm: int = 233472,
                    max_blocks: int = 32, smem_reserved: int = 1024) -> int:
    """Blocks of one launch that fit on an SM at once by threads and shared memory (H200 limits
    by default; registers are not counted), at least 1."""
    if threads <= 0 or smem_bytes < 0:
        raise ValueError(f"a launch of {threads} threads and {smem_bytes} bytes of shared memory")
    return max(1, min(max_blocks, max_threads // threads, smem_per_sm // (smem_bytes + smem_reserved)))


def oversplit(c: Candidate, sm_count: int, waves: int = SATURATED_WAVES) -> str | None:
    """Why a split variant is not worth timing at a shape (None: time it): with half its split
    factor its grid would still fill every SM `waves` times over with resident blocks."""
    if c.splits > 1 and c.blocks // 2 >= waves * sm_count * c.resident:
        return (f"{c.blocks} blocks over {c.splits} splits: half the splits still fill {sm_count} SMs "
                f"x {c.resident} resident blocks {waves} times over")
    return None


def skipped(cands: tuple[Candidate, ...], sm_count: int, waves: int = SATURATED_WAVES) -> dict[str, str]:
    """{name: why} of the candidates not timed at a shape (rule 1); never all of them."""
    why = {c.name: r for c in cands if (r := oversplit(c, sm_count, waves)) is not None}
    if cands and len(why) == len(cands):
        fewest = min(c.splits for c in cands)
        why = {n: r for n, r in why.items() if next(c for c in cands if c.name == n).splits != fewest}
    return why


def finalists(screen_ms: Mapping[str, float], keep: int = KEEP, within: float = WITHIN) -> tuple[str, ...]:
    """The variants timed in full (rule 2): the `keep` fastest by screen time and any other within
    `within` of the fastest, fastest first (ties by name)."""
    if keep < 1 or within < 0:
        raise ValueError(f"keep {keep} < 1 or within {within} < 0")
    order = sorted(screen_ms, key=lambda n: (screen_ms[n], n))
    if not order:
        return ()
    best = screen_ms[order[0]]
    return tuple(n for k, n in enumerate(order) if k < keep or screen_ms[n] <= best * (1 + within))


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
        if "screen_ms" in row:
            _check_pruned(path, key, row, table.get("rule", {}), built)
    return table


def _check_pruned(path: Path, key: str, row: dict[str, Any], rule: dict[str, Any], built: set[str]) -> None:
    """A pruned row: its skipped variants and finalists are what the rule gives from its own
    recorded grids and screen times (ValueError naming the bucket otherwise)."""
    where = f"{path}: bucket {key}"
    try:
        cands = tuple(Candidate(n, *map(int, v)) for n, v in row["candidates"].items())
        sm_count, waves = int(rule["sm_count"]), int(rule["waves"])
        keep, within = int(rule["keep"]), float(rule["within"])
        screen = {n: float(t) for n, t in row["screen_ms"].items()}
        skip = dict(row["skipped"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{where}: a pruned row without its candidates, skipped variants or the table's rule") from None
    if {c.name for c in cands} != built:
        raise ValueError(f"{where}: its candidates are not the variants this build built")
    if set(skip) != set(skipped(cands, sm_count, waves)):
        raise ValueError(f"{where}: skips {sorted(skip)}, the rule skips {sorted(skipped(cands, sm_count, waves))}")
    if set(screen) != built - set(skip):
        raise ValueError(f"{where}: screened {sorted(screen)}, not every variant the rule keeps")
    if set(row["ms"]) != set(finalists(screen, keep, within)):
        raise ValueError(f"{where}: timed {sorted(row['ms'])} in full, the rule's finalists are "
                         f"{sorted(finalists(screen, keep, within))}")
