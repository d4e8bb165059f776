"""dBias on mma.sync (codegen.mappings.score_store, score_sum's store form): the attention-bias
example's dBias kernel is printed by the store form and checked by the kernel step; the mapping
refuses by name what it does not implement; mutations of its printer (a store at the transposed
position, the column tail guard dropped) fail the build at the kernel step."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_attention_bwd_mma import _swap  # noqa: E402
from test_kernel_mutations import Mutation, assert_caught_at_the_kernel_step, mutation_params  # noqa: E402

EXAMPLE = ROOT / "examples" / "attention_bias_grad.yaml"
T = "codegen/mappings/templates/"


@pytest.fixture(scope="module")
def built(example_build) -> Path:
    """The example's build (the run's shared one, conftest.example_build)."""
    b = example_build(EXAMPLE)
    assert b.rc == 0, b.stderr[-2000:]
    return b.out


@pytest.mark.xdist_group("example-attention_bias_grad")  # with the build it reads
def test_dbias_is_printed_by_the_store_form(built):
    d = built / "grad" / "dBias"
    plan = json.loads((d / "plan.json").read_text())
    assert plan["mapping"] == "score_store_mma_sync"
    assert plan["plan"]["form"] == "store" and len(plan["plan"]["scores"]) == 2  # Q.K^T and dO.V^T
    assert (plan["plan"]["block_m"], plan["plan"]["block_n"], plan["plan"]["warps"]) == (64, 64, 4)
    sass = json.loads((d / "sass.json").read_text())
    assert sass["hmma"] and sass["ldsm"] and sass["ldgsts"]
    assert sass["violations"] == [] and sass["local_memory_ops"] == 0
    steps = json.loads((d / "derivation.json").read_text())["steps"]
    kernel = next(s for s in steps if s["rule"] == "kernel")
    draws = kernel["numeric"]["draws"]
    assert draws and all(x["passed"] for x in draws)
    # several row and column tiles with a tail in both (tiles of 64)
    assert any(x["sizes"]["N"] > 128 and x["sizes"]["N"] % 64 for x in draws)
    for k in ("dV", "dQ"):  # the tile sums stay on score_sum (wgmma; dK beside dV)
        assert json.loads((built / "grad" / k / "plan.json").read_text())["mapping"] == "score_sum_wgmma", k


# -- refusals --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kernels():
    from derivc_testing import grad_kernel_irs

    return grad_kernel_irs(EXAMPLE)


def _refused(k, *fragments):
    from codegen.kir.lower import UnsupportedMapping
    from codegen.mappings.score_store import render

    with pytest.raises(UnsupportedMapping) as exc:
        render(k)
    assert "score_store mma_sync" in str(exc.value)
    for f in fragments:
        assert f in str(exc.value), str(exc.value)


def test_prints_dbias_and_leaves_the_tile_sums_to_score_sum(kernels):
    from codegen.kir.lower import UnsupportedMapping
    from codegen.mappings import score_sum, score_store

    assert score_store.render(kernels["dBias"]).mapping == "score_store_mma_sync"
    _refused(kernels["dV"], "a score tile store")
    with pytest.raises(UnsupportedMapping, match="a tile sum"):
        score_sum.render(kernels["dBias"])


def test_refuses_a_transposed_score(kernels):
    """A score whose column tile is read at the row lane has no register form."""
    from compiler.ir import Aff, Read, walk

    k = kernels["dBias"]
    row = k.lanes[0].var
    ks = [x for x in walk(k.store.value) if isinstance(x, Read) and x.tensor == "K_s"]
    assert ks and ks[0].idx[0] == Aff.of(k.lanes[1].var)
    swapped = replace(ks[0], idx=(Aff.of(row),) + ks[0].idx[1:])
    _refused(replace(k, store=replace(k.store, value=_swap(k.store.value, ks[0], swapped))), "transposed score")


def test_refuses_register_tiles(kernels):
    k = kernels["dBias"]
    st = k.body[0]
    _refused(replace(k, body=(replace(st, buf=replace(st.buf, level="register")),) + k.body[1:]), "register-level")


def test_refuses_rows_per_warp_below_one_mma_tile(kernels):
    """64 rows over 8 warps: 8 rows per warp, less than mma.sync's 16."""
    k = kernels["dBias"]
    lane = k.lanes[0]
    eight = replace(lane, mapping=replace(lane.mapping, count=8))
    _refused(replace(k, lanes=(eight,) + k.lanes[1:]), "multiples of 16")


def test_refuses_a_store_condition_other_than_the_tail_bounds(kernels):
    from compiler.ir import Aff, Cond

    k = kernels["dBias"]
    diag = Cond(Aff.of(k.lanes[1].var), "<", Aff.of(k.lanes[0].var))
    _refused(replace(k, store=replace(k.store, guard=k.store.guard + (diag,))), "tail bound")


# -- mutations: each must fail the build at the kernel step ---------------------------------

MUTATIONS = (
    Mutation("store_at_transposed_position", "attention_bias_grad.yaml", T + "score_store.cu.j2",
             "{{ mm.store_pair('gO', out_ld, 'rr', 'cc',", "{{ mm.store_pair('gO', out_ld, 'cc', 'rr',"),
    Mutation("store_drops_column_tail_guard", "attention_bias_grad.yaml", T + "score_store.cu.j2",
             "row_lim=out_row_lim, col_lim=out_col_lim,", "row_lim=out_row_lim,"),
)


@pytest.mark.parametrize("m", mutation_params(MUTATIONS))
def test_mutation_fails_at_the_kernel_step(m: Mutation, tmp_path: Path) -> None:
    assert_caught_at_the_kernel_step(m, tmp_path)
