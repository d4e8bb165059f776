"""`derivc tune`'s pruning rule (compiler.tuning_table): over-split variants skipped by their grid,
a screen of the rest, the finalists timed in full — as pure functions on generated variant /
shape sets, the tuner's per-shape loop with fake timings (no GPU), and `read_tuning` refusing a
table pruned otherwise than by the rule."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen.tune_cmd import FULL, SCREEN, Timing, tune_shape
from compiler.tuning_table import (KEEP, SATURATED_WAVES, WITHIN, Candidate, bucket, finalists, oversplit,
                                   read_tuning, resident_blocks, skipped)

SMS = 132
TILES = [(128, 256), (128, 128), (64, 256), (64, 128), (256, 128)]
SPLITS = [1, 2, 4, 8, 16]


def gemm_candidates(m: int, n: int, tiles=TILES, splits=SPLITS, resident: int = 1) -> tuple[Candidate, ...]:
    """The tuned GEMM's variants at M x N: output tiles x split-K factors (the split on grid.z)."""
    return tuple(Candidate(f"{ti}x{tj}_s{s}", math.ceil(m / ti) * math.ceil(n / tj) * s, s, resident)
                 for ti, tj in tiles for s in splits)


def test_resident_blocks_by_threads_and_shared_memory():
    assert resident_blocks(256, 0) == 8                       # 2048 threads
    assert resident_blocks(32, 0) == 32                       # the block limit
    assert resident_blocks(32, 32 * 1024) == 6                # 233472 // (32 KiB + 1 KiB)
    assert resident_blocks(384, 200 * 1024) == 1
    assert resident_blocks(128, 230 * 1024) == 1              # at least one
    with pytest.raises(ValueError):
        resident_blocks(0, 0)


def test_skips_splits_of_a_grid_that_already_fills_the_gpu():
    # 8192 x 8192 on 128 x 256 tiles: 2048 one-per-SM blocks unsplit: every S > 1 is over-split
    cands = gemm_candidates(8192, 8192, tiles=[(128, 256)])
    assert set(skipped(cands, SMS)) == {"128x256_s2", "128x256_s4", "128x256_s8", "128x256_s16"}
    # 128 x 4096 on 64 x 128 tiles: 64 blocks; even S = 16 (1024 blocks) keeps half its splits useful
    cands = gemm_candidates(128, 4096, tiles=[(64, 128)])
    assert skipped(cands, SMS) == {}
    # 2048 x 2048 on 128 x 128: 256 blocks; S = 8 (2048) fills 4 x 132 with half its splits, S = 4 (1024) does not
    cands = gemm_candidates(2048, 2048, tiles=[(128, 128)])
    assert set(skipped(cands, SMS)) == {"128x128_s8", "128x128_s16"}


def test_the_boundary_of_the_rule():
    edge = SATURATED_WAVES * SMS * 2  # blocks // 2 == waves x SMs x resident (1)
    assert oversplit(Candidate("a", edge, 2, 1), SMS) is not None
    assert oversplit(Candidate("a", edge - 2, 2, 1), SMS) is None
    assert oversplit(Candidate("a", 10 ** 6, 1, 1), SMS) is None  # no split: never skipped
    assert oversplit(Candidate("a", edge, 2, 2), SMS) is None     # two resident blocks per SM: half the waves


def test_never_skips_every_variant():
    # decode at a large batch: every variant splits, and every grid is large: the fewest splits stay
    cands = (Candidate("s8", 100_000, 8, 4), Candidate("s16", 200_000, 16, 4), Candidate("s8b", 90_000, 8, 2))
    assert set(skipped(cands, SMS)) == {"s16"}
    assert skipped((), SMS) == {}


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 20000), resident=st.integers(1, 8), sms=st.integers(1, 200))
def test_generated_gemm_shapes(m, n, resident, sms):
    cands = gemm_candidates(m, n, resident=resident)
    skip = skipped(cands, sms)
    assert len(skip) < len(cands)
    by_name = {c.name: c for c in cands}
    for c in cands:
        if c.splits == 1:
            assert c.name not in skip
        elif c.blocks // 2 >= SATURATED_WAVES * sms * resident:
            assert c.name in skip, c  # the unsplit variants remain: nothing forces keeping it
        else:
            assert c.name not in skip, c
    # monotone in the split factor: a tile's skipped S implies every larger S of that tile is skipped
    for name in skip:
        c = by_name[name]
        tile = name.split("_")[0]
        assert all(f"{tile}_s{s}" in skip for s in SPLITS if s > c.splits)


@settings(max_examples=300, deadline=None)
@given(times=st.dictionaries(st.sampled_from([f"v{k}" for k in range(30)]),
                             st.floats(0.001, 10.0, allow_nan=False), min_size=1),
       keep=st.integers(1, 5), within=st.sampled_from([0.0, 0.02, 0.05, 0.2]))
def test_finalists_on_generated_screens(times, keep, within):
    fin = finalists(times, keep, within)
    order = sorted(times, key=lambda n: (times[n], n))
    best = times[order[0]]
    assert fin[0] == order[0]
    assert list(fin) == [n for n in order if n in fin]  # fastest first
    assert set(order[:keep]) <= set(fin)                 # the keep fastest
    for n in order[keep:]:                               # beyond them: exactly those within the margin
        assert (n in fin) == (times[n] <= best * (1 + within))


def test_finalists_exact():
    times = {"a": 1.0, "b": 1.04, "c": 1.06, "d": 1.2, "e": 1.05}
    assert finalists(times, keep=1, within=0.05) == ("a", "b", "e")
    assert finalists(times, keep=2, within=0.0) == ("a", "b")
    assert finalists(times, keep=4, within=0.0) == ("a", "b", "e", "c")
    assert finalists({}, keep=3) == ()
    with pytest.raises(ValueError):
        finalists(times, keep=0)


def _fake_tuner(cands, full_ms, screen_noise=1.0, bad=()):
    checked, timed = [], []

    def check(name):
        checked.append(name)
        if name in bad:
            raise RuntimeError(f"variant {name}: output differs")

    def time_ms(name, timing: Timing):
        timed.append((name, timing))
        return full_ms[name] * (screen_noise if timing == SCREEN else 1.0)

    return check, time_ms, checked, timed


def test_tune_shape_checks_screens_and_times_by_the_rule():
    cands = gemm_candidates(8192, 8192, tiles=[(128, 256), (128, 128)])
    full_ms = {c.name: 1.0 + 0.01 * c.splits + (0.3 if c.name.startswith("128x128") else 0) for c in cands}
    check, time_ms, checked, timed = _fake_tuner(cands, full_ms)
    row = tune_shape(cands, check, time_ms, SMS)
    skip = skipped(cands, SMS)
    assert set(row["skipped"]) == set(skip) and skip
    assert checked == [c.name for c in cands if c.name not in skip]  # every kept variant checked, no skipped one run
    assert {n for n, t in timed if t == SCREEN} == set(checked)
    assert [n for n, t in timed if t == FULL] == list(finalists(row["screen_ms"]))
    assert row["variant"] == "128x256_s1" and row["ms"][row["variant"]] == min(row["ms"].values())
    assert row["candidates"]["128x256_s2"] == [2048 * 2, 2, 1]


def test_tune_shape_winner_by_full_time_not_screen():
    cands = tuple(Candidate(f"v{k}", 64, 1, 1) for k in range(6))
    full_ms = {"v0": 1.0, "v1": 1.01, "v2": 0.99, "v3": 2.0, "v4": 2.0, "v5": 2.0}

    def time_ms(name, timing):  # the screen ranks v0 first; the full timing finds v2 faster
        return {"v2": 1.02}.get(name, full_ms[name]) if timing == SCREEN else full_ms[name]

    row = tune_shape(cands, lambda n: None, time_ms, SMS, keep=3)
    assert set(row["ms"]) == {"v0", "v1", "v2"} and row["variant"] == "v2"


def test_tune_shape_stops_at_a_miscompile():
    cands = gemm_candidates(128, 4096, tiles=[(64, 128)])
    check, time_ms, _, timed = _fake_tuner(cands, {c.name: 1.0 for c in cands}, bad={"64x128_s4"})
    with pytest.raises(RuntimeError, match="64x128_s4"):
        tune_shape(cands, check, time_ms, SMS)
    assert timed == []  # checked before anything is timed


def _write_table(tmp: Path, cands, rows: dict) -> Path:
    rule = {"sm_count": SMS, "waves": SATURATED_WAVES, "keep": KEEP, "within": WITHIN}
    (tmp / "tuning.json").write_text(json.dumps({"dynamic": ["M", "N", "K"], "rule": rule, "buckets": rows}))
    return tmp


def _row(cands, sizes, **kw):
    full_ms = {c.name: 1.0 + 0.013 * k for k, c in enumerate(cands)}
    check, time_ms, _, _ = _fake_tuner(cands, full_ms, screen_noise=1.1)
    return {"sizes": sizes, **tune_shape(cands, check, time_ms, SMS, **kw)}


def test_read_tuning_reapplies_the_rule(tmp_path):
    cands = gemm_candidates(8192, 8192)  # 5 tiles unsplit screened, 3 of them finalists
    built = {c.name for c in cands}
    sizes = {"M": 8192, "N": 8192, "K": 1024}
    key = bucket(sizes, ("M", "N", "K"))
    row = _row(cands, sizes)
    assert read_tuning(_write_table(tmp_path, cands, {key: row}), built) is not None

    def refused(bad_row, match):
        _write_table(tmp_path, cands, {key: bad_row})
        with pytest.raises(ValueError, match=match):
            read_tuning(tmp_path, built)

    some_skipped = next(iter(row["skipped"]))
    refused({**row, "skipped": {n: r for n, r in row["skipped"].items() if n != some_skipped},
             "screen_ms": {**row["screen_ms"], some_skipped: 5.0}}, "skips")
    loser = max(row["screen_ms"], key=row["screen_ms"].get)
    refused({**row, "ms": {**row["ms"], loser: 9.0}}, "finalists")
    dropped = next(n for n in row["ms"] if n != row["variant"])
    refused({**row, "ms": {n: t for n, t in row["ms"].items() if n != dropped}}, "finalists")
    refused({**row, "screen_ms": {n: t for n, t in row["screen_ms"].items() if n != loser}}, "screened")
    refused({**row, "candidates": {**row["candidates"], "ghost": [1, 1, 1]}}, "candidates")
    refused({k: v for k, v in row.items() if k != "candidates"}, "without its candidates")
    # the grid recorded smaller than the rule needs to skip: the skipped set no longer follows
    small = {n: [max(1, b // 100), s, r] for n, (b, s, r) in row["candidates"].items()}
    refused({**row, "candidates": small}, "skips")


@pytest.fixture(scope="module")
def decode_tuned(example_build) -> Path:
    """The run's shared build of examples/decode_splitkv_tuned.yaml (seed 0, no proofs): 8 chains."""
    b = example_build(Path(__file__).resolve().parents[1] / "examples" / "decode_splitkv_tuned.yaml")
    assert b.rc == 0, b.stderr
    return b.out


def test_candidates_of_the_tuned_decode_build(decode_tuned):
    """The tuner's view of each built variant (loaded through the CPU emulation's loaders): the grid
    blocks of its first kernel (the partial folds) at the shape, its split factor (from its
    SPLIT-KV step), resident blocks by threads / shared memory; and what the rule skips."""
    from codegen.tune_cmd import _first_printed, _split_factor, candidate
    from codegen.tuned import open_variant
    from compiler.variant_build import built_dirs

    limits = {"max_threads": 2048, "smem_per_sm": 233472, "max_blocks": 32}
    dirs = built_dirs(decode_tuned)
    assert len(dirs) == 8
    loaded = {name: (_first_printed(open_variant(d, device="emu")), _split_factor(d)) for name, d in dirs.items()}

    def cands(b, h, nq, nk):
        sizes = {"B": b, "H": h, "Nq": nq, "Nk": nk}
        return {n: candidate(n, pr, sp, sizes, limits) for n, (pr, sp) in loaded.items()}

    for (b, h, nq, nk) in [(1, 32, 1, 32768), (64, 8, 1, 2048), (2, 3, 17, 100)]:
        for name, c in cands(b, h, nq, nk).items():
            choice = dict(part.split("-") for part in name.split("_"))
            assert c.splits == int(choice["splits"]), name
            assert c.blocks == b * h * math.ceil(nq / 16) * c.splits, name  # one one-warp block per split and 16 rows
    at = cands(1, 32, 1, 32768)
    # a K / V ring of 3 stages holds more shared memory: fewer resident blocks than 2 stages
    assert at["splits-16_stages-3"].resident < at["splits-16_stages-2"].resident
    assert skipped(tuple(at.values()), SMS) == {}
    # 64 x 8 pairs at Nk = 2048: only S = 8 (4096 blocks) is not over-split
    at = cands(64, 8, 1, 2048)
    assert set(at) - set(skipped(tuple(at.values()), SMS)) == {"splits-8_stages-2", "splits-8_stages-3"}
