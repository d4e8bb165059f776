"""SPLIT-K's vectorised combine (codegen/mappings/combine.py) in examples/gemm_splitk_tiles_tuned.yaml:
printed from the kernel IR (8 consecutive columns per thread, 16-byte loads, the splits summed in
order), run on the CPU through the emulation against float64 with the vector path and the
per-column tail path, bit for bit the SIMT printer's kernel of the same kernel IR (and the same
bits twice); a combine that drops a partial fails the kernel check, one that reorders the sum
fails the bit comparison.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from codegen.build import CodegenError
from codegen.emu import host_compiler
from codegen.multi_kernel import check_stages, stages
from compiler.derive import derive
from compiler.schedule_variants import resolve
from compiler.spec import load_spec_file

pytestmark = pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler")

ROOT = Path(__file__).resolve().parents[1]
TUNED = ROOT / "examples" / "gemm_splitk_tiles_tuned.yaml"
TILES = {"M": 128, "N": 256, "K": 64}


@functools.lru_cache(maxsize=None)
def _final(splits: int):
    spec = resolve(load_spec_file(TUNED), {"tile_i": 128, "tile_j": 256, "split_k": splits})
    return derive(spec, str(TUNED), check=False).final


def combine_stage(sizes: dict[str, int], splits: int = 4):
    return stages(_final(splits), "gemm_tuned", sizes, 1)


def _run(printed, ws: np.ndarray) -> np.ndarray:
    from codegen.emu.run import run_printed

    out = run_printed(printed, 0, [ws])
    return np.asarray(out[0] if isinstance(out, tuple) else out)


def _workspace(m: int, n: int, seed: int = 0) -> np.ndarray:
    """4 splits: a large partial, its negation, two small ones.  In split order the large ones
    cancel exactly and the small ones survive; in another order they are absorbed (other bits)."""
    rng = np.random.default_rng(seed)
    big = rng.standard_normal((m, n)) * 1e8
    return np.stack([big, -big, rng.standard_normal((m, n)), rng.standard_normal((m, n))]).astype(np.float32)


def test_the_combine_prints_on_the_combine_mapping():
    _, combine = combine_stage({"M": 150, "N": 270, "K": 300})
    assert combine.printed.mapping == "combine"
    src = combine.printed.variants[0].source.source
    assert "reinterpret_cast<const float4*>" in src and "for (long long ks = 0; ks < 4LL; ++ks)" in src
    assert combine.printed.variants[0].launch.threads == 128


@pytest.mark.parametrize("sizes", [{"M": 6, "N": 2048, "K": 300},      # every thread on the vector path
                                   {"M": 150, "N": 270, "K": 300},     # rows misaligned, column tails
                                   {"M": 5, "N": 5, "K": 100}])        # fewer columns than one vector
def test_the_combine_passes_the_emulation(sizes):
    found = combine_stage(sizes)
    records = check_stages(found[1:], sizes, 3, TILES)
    assert all(r["passed"] for r in records)


@pytest.mark.parametrize("n", [2048, 270])
def test_same_bits_as_simt_and_run_to_run(n):
    _, combine = combine_stage({"M": 8, "N": n, "K": 300})
    ws = _workspace(8, n)
    got = _run(combine.printed, ws)
    want = ws[0] + ws[1]  # float32, in split order, as both printers add
    want = ((want + ws[2]) + ws[3]).astype(np.float16)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    assert np.array_equal(got.view(np.uint16), _run(combine.printed, ws).view(np.uint16))
    simt = _simt_printed(combine.printed)
    assert np.array_equal(got.view(np.uint16), _run(simt, ws).view(np.uint16))


def _simt_printed(printed):
    """The same kernel IR printed by the SIMT mapping."""
    from codegen.mappings.simt import _print

    return _print(printed.kernel, printed.variants[0].source.options)


def _mutated(monkeypatch, old: str, new: str) -> None:
    from codegen.mappings import combine

    orig = combine.render_template

    def bad(name, ctx):
        src = orig(name, ctx)
        assert old in src
        return src.replace(old, new)

    monkeypatch.setattr(combine, "render_template", bad)


VECTOR_LOOP = "for (long long ks = 0; ks < 4LL; ++ks) {\n            const float4*"


def test_a_combine_dropping_a_partial_is_caught(monkeypatch):
    _mutated(monkeypatch, VECTOR_LOOP, VECTOR_LOOP.replace("4LL", "3LL"))
    sizes = {"M": 6, "N": 2048, "K": 300}
    found = combine_stage(sizes)
    with pytest.raises(CodegenError, match="kernel C"):
        check_stages(found[1:], sizes, 3, TILES)


def test_a_combine_summing_out_of_order_changes_the_bits(monkeypatch):
    """Reversed split order: within the kernel check's tolerance, but not the SIMT kernel's bits."""
    _mutated(monkeypatch, VECTOR_LOOP, VECTOR_LOOP.replace("ks = 0; ks < 4LL; ++ks", "ks = 3; ks >= 0; --ks"))
    _, combine = combine_stage({"M": 8, "N": 2048, "K": 300})
    ws = _workspace(8, 2048)
    got = _run(combine.printed, ws)
    assert not np.array_equal(got.view(np.uint16), _run(_simt_printed(combine.printed), ws).view(np.uint16))


def test_a_combine_without_a_vector_lane_is_refused_by_name_and_printed_by_simt():
    """gemm_splitk.yaml's combine (one column per lane point, no unmapped run of columns)."""
    from codegen.kir.lower import UnsupportedMapping
    from codegen.mappings import combine
    from compiler.spec import parse_spec_text

    text = (ROOT / "examples" / "gemm_splitk.yaml").read_text()
    final = derive(parse_spec_text(text), check=False).final
    _, scalar = stages(final, "gemm_splitk", {"M": 150, "N": 270, "K": 300}, 1)
    assert scalar.printed.mapping == "simt"
    with pytest.raises(UnsupportedMapping, match=r"combine: the kernel is not a combine over \(thread, vector\) lanes"):
        combine.render(scalar.kernel, ())
