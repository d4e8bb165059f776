"""Vocabulary rows with the row max and the row sum in one pass (examples/pending/softmax_vocab_online.yaml: parked, see the file):
ONLINE-AGG's streaming fold over column tiles of a row that does not fit in the registers.  The
rowwise mapping reads each tile from memory in a rolled tile loop, the last tile guarded where
the row ends inside it, so X is read twice (the fold, the output) instead of three times.  Run
through the CPU emulation against float64 at widths with tails (a partial last tile, threads
past the count in the warp) and an exact one; a skipped tile and a tile
whose sweeps overlap the previous tile's are caught; a tile that is not whole sweeps is refused
by name."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from codegen.emu import EmuError, run_printed
from codegen.kir.lower import UnsupportedMapping, lower
from codegen.mappings import print_kernel, rowwise
from compiler.derive import derive
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
R = 3

pytestmark = pytest.mark.xdist_group("rows_online_vocab")


def _derived(tmp: Path, C: int, tile: int, threads: int):
    doc = yaml.safe_load((ROOT / "examples" / "pending" / "softmax_vocab_online.yaml").read_text())
    doc["sizes"]["C"] = C
    for step in doc["schedule"]:
        if step["rule"] == "tile":
            step["size"] = tile
        if step["rule"] == "parallel" and step["to"] == "thread":
            step["count"] = threads
    path = tmp / f"svo_{C}_{tile}_{threads}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    d = derive(load_spec_file(path), str(path), seed=3)
    return lower(d.programs[-1], "softmax_vocab_online")


def _rows(C: int, seed: int):
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((R, C)) * 4).astype(np.float16).astype(np.float64)
    X[1, -1] = 40.0  # the row max in the last (partial) tile: the fold must rescale l there
    return X


def _softmax(X):
    e = np.exp(X - X.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _run(printed, X):
    return np.asarray(run_printed(printed, 0, [X], {}), dtype=np.float64)


def _mutated(printed, old: str, new: str):
    src = printed.variants[0].source
    assert old in src.source, old
    return replace(printed, variants=(replace(printed.variants[0], source=replace(src, source=src.source.replace(old, new))),))


# (C, tile, threads): 7 tiles, the last of 1105 columns; 3 tiles of 8 sweeps, the last partial;
# 2 tiles of one column pair over 2 threads of a warp (threads past the count, a partial tile);
# 3 tiles of 2 sweeps of 256 x 4, the last partial; 2 whole tiles of 256 x 8 (no guard); 2 tiles
# of 2 sweeps, the row (3 sweeps) ending at the end of the first sweep of the second (guarded)
SHAPES = [(50257, 8192, 1024), (2500, 1024, 128), (3, 2, 2), (4500, 2048, 256), (4096, 2048, 256), (6144, 4096, 256)]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("online_vocab")
    return {shape: print_kernel(_derived(tmp, *shape), ()) for shape in SHAPES}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "C%d_T%d_NT%d" % s)
def test_one_pass_fold_over_a_row_in_memory(kernels, shape):
    C, tile, threads = shape
    printed = kernels[shape]
    src = printed.variants[0].source.source
    tiles = -(-C // tile)
    assert printed.mapping == "rowwise" and printed.plan.threads == threads
    assert dict(printed.plan.row_passes) == {"X": 2, "Y": 1}
    assert f"#pragma unroll 1\n    for (int co_ = 0; co_ < {tiles}; ++co_)" in src and "xb_" not in src
    assert printed.plan.tail == (C % (threads * printed.plan.vec) != 0 or tiles * tile > C)
    assert (f"if (col0 < {C}LL" in src) == printed.plan.tail  # no read past the row in the last tile
    X = _rows(C, seed=C)
    assert np.abs(_run(printed, X) - _softmax(X)).max() <= 1e-3  # f16 output in [0, 1]


@pytest.mark.parametrize("shape,old,new", [
    ((50257, 8192, 1024), "co_ < 7;", "co_ < 6;"),  # the last (partial) tile skipped
    ((4500, 2048, 256), "const int k = co_ * 2 + kk;", "const int k = co_ * 1 + kk;"),  # tiles overlap
])
def test_online_vocab_mutations_are_caught(kernels, shape, old, new):
    printed = _mutated(kernels[shape], old, new)
    X = _rows(shape[0], seed=7)
    try:
        got = _run(printed, X)
    except EmuError:
        return
    assert not np.abs(got - _softmax(X)).max() <= 1e-3


def test_a_tile_that_is_not_whole_sweeps_is_refused(tmp_path):
    kernel = _derived(tmp_path, 4500, 1000, 256)
    with pytest.raises(UnsupportedMapping, match="rowwise mapping: tile loop over co: 5 tiles of 1000 columns are not "
                                                 "whole sweeps of 256 x 4"):
        rowwise.render(kernel, ())
