"""Prefix-LM's backward (examples/attention_prefix_lm_grad.yaml, j <= i || j < Prefix) on wgmma (the
tile ranges also through the mma.sync printer): dV with dK, and dQ map to score_sum with the
disjunction printed as one C ||; each tile range is the union
of the disjuncts' ranges (dQ's key tiles end at the greater of the diagonal's and the prefix's
ends, dK / dV's query tiles start at 0 where the key tile meets the prefix); the whole backward run
through the emulation agrees with float64 at a prefix crossing the diagonal and one beyond N; MASK
(skip_masked) on dQ is refused by name; and a dropped disjunct, or one disjunct's range in place of the union, fails the build at the kernel
step."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_attention_bwd_mma import _build, _lowered  # noqa: E402
from test_kernel_mutations import Mutation, assert_caught_at_the_kernel_step, mutation_params  # noqa: E402

EXAMPLE = ROOT / "examples" / "attention_prefix_lm_grad.yaml"
BACKWARD = ("dV", "dQ")  # dK: written by dV's kernel (FUSE-SUMS)


@pytest.fixture(scope="module")
def built(example_build) -> Path:
    """The example's build (the run's shared one, conftest.example_build)."""
    b = example_build(EXAMPLE)
    assert b.rc == 0, b.stderr[-2000:]
    return b.out


@pytest.mark.xdist_group("example-attention_prefix_lm_grad")  # with the build it reads
def test_backward_kernels_map_to_score_sum_with_the_disjunction_printed(built):
    manifest = json.loads((built / "grad.json").read_text())
    assert [k["name"] for k in manifest["kernels"]] == ["Dsum", "dV", "dQ"]
    assert sorted(manifest["saved"]) == ["LSE", "O"]
    for k in BACKWARD:
        d = built / "grad" / k
        assert json.loads((d / "plan.json").read_text())["mapping"] == "score_sum_wgmma", k
        steps = json.loads((d / "derivation.json").read_text())["steps"]
        assert "skip_masked" not in [s["rule"] for s in steps], k  # the printer's range skips
        kernel = next(s for s in steps if s["rule"] == "kernel")
        assert kernel["numeric"]["draws"] and all(x["passed"] for x in kernel["numeric"]["draws"]), k
        src = (d / "kernel.cu").read_text()
        # rows = keys for dK / dV (the score tile transposed), rows = queries for dQ
        i, j = ("ec_ + 64 * it", "er_ + 64 * rt") if k != "dQ" else ("er_ + 64 * rt", "ec_ + 64 * it")
        assert f"((({j}) <= ({i})) || (({j}) < (sz_Prefix)))" in src, k


def test_skip_masked_on_dq_is_refused_by_name(tmp_path):
    """dQ's key tiles end at max(diagonal, prefix): MASK has no extent for it, so the schedule leaves
    skip_masked out; asking for it is refused by name, not mis-derived."""
    text = EXAMPLE.read_text()
    at = "        - {rule: tile, def: dQ, index: j, size: 64}\n"
    assert at in text
    spec = tmp_path / EXAMPLE.name
    spec.write_text(text.replace(at, at + "        - {rule: skip_masked, def: dQ, index: jo}\n"))
    proc = _build(spec, tmp_path / "out")
    assert proc.returncode != 0
    assert "skip_masked" in proc.stderr and "only through a disjunction" in proc.stderr, proc.stderr[-1000:]


def _bound(src: str, name: str) -> str:
    return next(x for x in src.splitlines() if f"const int {name} =" in x)


def test_tile_ranges_are_the_union_of_the_disjuncts_ranges():
    """dQ: the key tiles end at max(diagonal's end, prefix's end); dK / dV: the query tiles start at
    min(diagonal's start, 0 where the key tile meets the prefix, none where it does not)."""
    from codegen.mappings.cexpr import NO_TILE
    from codegen.mappings.score_sum import render

    ks = _lowered("attention_prefix_lm_grad.yaml")
    end = _bound(render(ks["dQ"]).variants[0].source.source, "it_end")
    assert "max(" in end and "sz_Prefix" in end and "rt" in end, end
    for name in ("dV",):  # dK beside it (FUSE-SUMS)
        src = render(ks[name]).variants[0].source.source
        begin = _bound(src, "it_begin")
        assert "min(" in begin and f"(((sz_Prefix - 0 - 64 * rt) <= 0) ? {NO_TILE} : 0LL)" in begin, (name, begin)
        assert "sz_Prefix" not in _bound(src, "it_end"), name


def _prefix_backward(q, k, v, do, prefix: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """float64: O and dQ, dK, dV of sum(O * dO) under j <= i || j < prefix (no row is empty)."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    d, n = q.shape[-1], q.shape[-2]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = (j <= i) | (j < prefix)
    s = np.where(keep, q @ np.swapaxes(k, -1, -2) / np.sqrt(d), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return p @ v, {"Q": ds @ k / np.sqrt(d), "K": np.swapaxes(ds, -1, -2) @ q / np.sqrt(d),
                   "V": np.swapaxes(p, -1, -2) @ do}


@pytest.mark.xdist_group("example-attention_prefix_lm_grad")  # with the build it reads
@pytest.mark.parametrize("n,prefix", [(130, 100), (77, 200)], ids=["crossing-the-diagonal", "beyond-N"])
def test_emulated_backward_matches_float64(built, n: int, prefix: int):
    """Prefix = 100 at N = 130 crosses the diagonal in the second 64-row tile (key tile 1 reaches
    query tile 0); Prefix = 200 > N = 77: every row sees every key."""
    import derivc

    t = derivc.load_training(built, device="emu")
    rng = np.random.default_rng(11)
    q, k, v, do = (rng.standard_normal((1, 2, n, 128)).astype(np.float16) for _ in range(4))
    o, saved = t.forward_with_saved(Q=q, K=k, V=v, Prefix=prefix)
    grads = t.backward(saved, do, Prefix=prefix)
    o_ref, g_ref = _prefix_backward(q, k, v, do, prefix)
    assert np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref) < 5e-3
    for x in ("Q", "K", "V"):
        assert np.all(np.isfinite(grads[x])), x
        err = np.linalg.norm(grads[x].astype(np.float64) - g_ref[x]) / np.linalg.norm(g_ref[x])
        assert err < 5e-3, (x, err)


# -- mutations of the backward's printer (the forward is untouched): each fails at dV / dK / dQ's kernel step

SCORE_SUM = "codegen/mappings/score_sum.py"
ONE_PART = "tuple(c.parts[0] if isinstance(c, Or) else c for c in guards)"
MUTATIONS = (
    Mutation("prefix_guard_drops_a_disjunct", EXAMPLE.name, SCORE_SUM,
             'return f"({conds_c(e.conds, names)} ? {val(e.then)} : {val(e.other)})"',
             'return f"({conds_c(tuple(c.parts[0] if isinstance(c, Or) else c for c in e.conds), names)} '
             '? {val(e.then)} : {val(e.other)})"'),
    Mutation("prefix_range_start_one_disjunct", EXAMPLE.name, SCORE_SUM,
             "begin = first_tile_c(guards, m.loop.var, box, blk)", f"begin = first_tile_c({ONE_PART}, m.loop.var, box, blk)"),
    Mutation("prefix_range_end_one_disjunct", EXAMPLE.name, SCORE_SUM,
             "upper = end_tile_c(guards, m.loop.var, box, blk)", f"upper = end_tile_c({ONE_PART}, m.loop.var, box, blk)"),
    Mutation("prefix_warp_empty_one_disjunct", EXAMPLE.name, SCORE_SUM,
             "box_extremes(c, unit_box, wnames)[1] for c in guards)",
             f"box_extremes(c, unit_box, wnames)[1] for c in {ONE_PART})"),
)


@pytest.mark.parametrize("m", mutation_params(MUTATIONS))
def test_mutation_fails_at_a_backward_kernel_step(m: Mutation, tmp_path: Path) -> None:
    failure = assert_caught_at_the_kernel_step(m, tmp_path)
    assert re.match(r"d[QKV]: kernel: ", failure) and re.search(r": d[QKV]: relative error", failure), \
        f"{m.name}: not dV / dK / dQ's kernel step: {failure[-600:]}"
