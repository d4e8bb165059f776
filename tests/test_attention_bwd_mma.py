"""The attention backward on mma.sync (codegen.mappings.score_sum): the example builds with dV, dK,
dQ printed on tensor cores and checked by the kernel step; the whole backward run through the
emulation agrees with float64; the mapping refuses what it does not implement by name; the rule
extensions it needs (CACHE of one tile read at two index variables, MAP-MMA of a computed-times-
read product) hold numerically and refuse the rest; and semantic mutations of the printer and
template fail the build at the kernel step."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from derivc_testing import run_cli  # noqa: E402
from rulekit import apply, check_fails, numeric_error, program_of, spec_text  # noqa: E402
from test_kernel_mutations import Mutation, assert_caught_at_the_kernel_step, mutation_params  # noqa: E402

EXAMPLE = ROOT / "examples" / "flash_attention_grad_mma.yaml"
BACKWARD = ("dV", "dK", "dQ")
T = "codegen/mappings/templates/"


def _build(example: Path, out: Path) -> subprocess.CompletedProcess:
    """`derivc build EXAMPLE -o OUT --no-proofs --seed 7`, in-process."""
    args = ["build", str(example), "-o", str(out), "--no-proofs", "--seed", "7"]
    return subprocess.CompletedProcess(args, *run_cli(args))


@pytest.fixture(scope="module")
def built(example_build) -> Path:
    """The example's build (the run's shared one, conftest.example_build)."""
    b = example_build(EXAMPLE)
    assert b.rc == 0, b.stderr[-2000:]
    return b.out


@pytest.mark.xdist_group("example-flash_attention_grad_mma")  # with the build it reads
def test_backward_kernels_are_printed_on_mma_sync(built):
    manifest = json.loads((built / "grad.json").read_text())
    assert [k["name"] for k in manifest["kernels"]] == ["Dsum", "dV", "dK", "dQ"]
    assert sorted(manifest["saved"]) == ["LSE", "O"]  # the forward writes LSE beside O (FOLD-STAT)
    for k in BACKWARD:
        d = built / "grad" / k
        plan = json.loads((d / "plan.json").read_text())
        assert plan["mapping"] == "score_sum_mma_sync", k
        scores = plan["plan"]["scores"]
        assert len(scores) == (1 if k == "dV" else 2), k
        sass = json.loads((d / "sass.json").read_text())
        assert sass["hmma"] and sass["ldsm"] and sass["ldgsts"], k
        assert sass["violations"] == [] and sass["local_memory_ops"] == 0, k
        steps = json.loads((d / "derivation.json").read_text())["steps"]
        kernel = next(s for s in steps if s["rule"] == "kernel")
        assert kernel["numeric"]["draws"] and all(x["passed"] for x in kernel["numeric"]["draws"]), k
        # the wide draw reaches several tiles with a tail (tiles of 64): the ring, the skip and the tail
        assert any(x["sizes"]["N"] > 128 and x["sizes"]["N"] % 64 for x in kernel["numeric"]["draws"]), k
        src = (d / "kernel.cu").read_text()
        assert "asm" not in src.split("derivc generated")[1].split("offT")[1], "inline PTX outside the wrapper layer"


def _attention_backward(q, k, v, do, causal=True, mask=None):
    """float64 reference: O, and dQ, dK, dV of sum(O * dO); mask "strict" (j < i): row 0 empty, 0."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    d = q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
    n = s.shape[-1]
    keep = np.tril(np.ones((n, n), bool), -1 if mask == "strict" else 0) if causal or mask else np.ones((n, n), bool)
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
    p /= np.where(p.sum(-1, keepdims=True) > 0, p.sum(-1, keepdims=True), 1)
    o = p @ v
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = ds @ k / np.sqrt(d)
    dk = np.swapaxes(ds, -1, -2) @ q / np.sqrt(d)
    return o, {"Q": dq, "K": dk, "V": dv}


@pytest.mark.xdist_group("example-flash_attention_grad_mma")  # with the build it reads
def test_emulated_backward_matches_float64(built):
    import derivc

    t = derivc.load_training(built, device="emu")
    rng = np.random.default_rng(3)
    n = 77  # two key / query tiles of 64, the second a tail
    q, k, v, do = (rng.standard_normal((1, 1, n, 64)).astype(np.float16) for _ in range(4))
    o, saved = t.forward_with_saved(Q=q, K=k, V=v)
    grads = t.backward(saved, do)
    o_ref, g_ref = _attention_backward(q, k, v, do)
    assert np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref) < 5e-3
    for x in ("Q", "K", "V"):
        err = np.linalg.norm(grads[x].astype(np.float64) - g_ref[x]) / np.linalg.norm(g_ref[x])
        assert err < 5e-3, (x, err)


TANH_SPEC = """\
name: tanh_score_sum
sizes: {N: dynamic, D: 64}
inputs:
  Q: {shape: [N, D], dtype: f16}
  K: {shape: [N, D], dtype: f16}
  G: {shape: [N, D], dtype: f16}
params: {scale: 1/sqrt(D)}
statements:
  - "Y[j, e] = sum(i: tanh(scale * sum(e5: Q[i, e5] * K[j, e5])) * sum(d: G[i, d] * K[j, d]) * Q[i, e])"
output: {tensor: Y, dtype: f16}
check_sizes: {N: 77}
schedule:
  - {rule: tile, def: Y, index: j, size: 64}
  - {rule: tile, def: Y, index: i, size: 64}
  - {rule: cache, def: Y, tensor: K, over: [ji, e5, d], level: register}
  - {rule: cache, def: Y, tensor: Q, at: io, over: [ii, e5, e], level: shared, stages: 2}
  - {rule: cache, def: Y, tensor: G, at: io, over: [ii, d], level: shared, stages: 2}
  - {rule: parallel, def: Y, index: jo, to: grid.x}
  - {rule: parallel, def: Y, index: ji, to: warp, count: 4}
  - {rule: map_mma, def: Y, index: e5, instr: mma_sync}
  - {rule: map_mma, def: Y, index: d, instr: mma_sync}
  - {rule: map_mma, def: Y, index: ii, instr: mma_sync, m: ji}
"""


def test_the_mapping_prints_any_score_sum_not_only_attention(tmp_path):
    """Two scores of one row tile (K against Q and G), tanh for the softmax, no mask, no vectors:
    printed by the same mapping, checked by the kernel step."""
    spec = tmp_path / "tanh_score_sum.yaml"
    spec.write_text(TANH_SPEC)
    proc = _build(spec, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["mapping"] == "score_sum_mma_sync" and len(plan["plan"]["scores"]) == 2


# -- refusals --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kernels():
    from derivc_testing import grad_kernel_irs

    return grad_kernel_irs(EXAMPLE)


def _refused(k, *fragments):
    from codegen.kir.lower import UnsupportedMapping
    from codegen.mappings.score_sum import render

    with pytest.raises(UnsupportedMapping) as exc:
        render(k)
    for f in fragments:
        assert f in str(exc.value), str(exc.value)


def test_prints_each_backward_kernel(kernels):
    from codegen.mappings.score_sum import render

    for name in BACKWARD:
        assert render(kernels[name]).mapping == "score_sum_mma_sync"


def test_refuses_a_stored_value_other_than_the_sum(kernels):
    from compiler.ir import Bin, Const

    k = kernels["dV"]
    _refused(replace(k, store=replace(k.store, value=Bin("*", Const(2.0), k.store.value))), "stored value")


def test_refuses_a_transposed_score(kernels):
    """A score read at [column, row] has no register form (the tile would be transposed)."""
    from compiler.ir import Aff, Read, walk

    from codegen.kir.ir import TileLoop

    k = kernels["dV"]
    loop = k.body[-1]
    assert isinstance(loop, TileLoop)
    row = k.lanes[0].var
    acc = loop.state[0].update.b
    reads = [x for x in walk(acc.body) if isinstance(x, Read) and x.tensor == "K_r"]
    assert reads and reads[0].idx[0] == Aff.of(row)
    col = acc.var
    swapped = _swap(loop.state[0].update, reads[0], replace(reads[0], idx=(Aff.of(col),) + reads[0].idx[1:]))
    bad = replace(k, body=k.body[:-1] + (replace(loop, state=(replace(loop.state[0], update=swapped),)),))
    _refused(bad, "transposed score")


def test_refuses_a_value_depending_on_the_output_column(kernels):
    from compiler.ir import Aff, Bin, IndexValue, Reduce, Select

    k = kernels["dK"]
    loop = k.body[-1]
    upd = loop.state[0].update
    acc: Reduce = upd.b
    n = k.lanes[1].var
    sel = acc.body
    assert isinstance(sel, Select)
    prod = sel.then  # A * Q_s[ii, e]: make A depend on the output column e
    body = Bin("*", Bin("*", prod.a, IndexValue(Aff.of(n))), prod.b)
    bad_upd = replace(upd, b=replace(acc, body=replace(sel, then=body)))
    bad = replace(k, body=k.body[:-1] + (replace(loop, state=(replace(loop.state[0], update=bad_upd),)),))
    _refused(bad, "output column")


# -- the d128 variants: windows, group loops ------------------------------------------------

def on_mma_sync(text: str) -> str:
    """An example's text with its backward kernels' products on mma.sync (the variant examples map
    them to wgmma; this file tests the mma.sync printer on the same derivations)."""
    head, grad = text.split("\ngrad:", 1)
    return head + "\ngrad:" + grad.replace("instr: wgmma", "instr: mma_sync")


def _derived(example: str) -> dict:
    """{kernel: (its derivation, its kernel IR)} of the example's backward, products on mma.sync."""
    from codegen.kir.lower import lower
    from compiler.derive_grad import derive_gradient
    from compiler.spec import parse_spec_text

    path = ROOT / "examples" / example
    g = derive_gradient(parse_spec_text(on_mma_sync(path.read_text()), str(path)), str(path), seed=1, check=False)
    return {k.grad_kernel: (k, lower(k.final, k.grad_kernel)) for k in g.kernels}


def _lowered(example: str) -> dict:
    return {name: k for name, (_, k) in _derived(example).items()}


@pytest.fixture(scope="module")
def gqa_kernels():
    return _lowered("attention_gqa_grad.yaml")


def test_group_loop_sums_dk_dv_over_the_query_heads(gqa_kernels):
    """GQA's dV (dK beside it): a loop over g around the query-tile sums, one accumulator each; dQ has none."""
    from codegen.mappings.score_sum import render

    for name, groups in (("dV", ("g",)), ("dQ", ())):
        printed = render(gqa_kernels[name])
        assert printed.plan.groups == groups, name
        src = printed.variants[0].source.source
        assert ("for (long long bi_g = 0;" in src) == bool(groups), name
        if groups:  # the column tiles are addressed at the step's g, the row tile once before the loop
            loop_at = src.index("for (long long bi_g = 0;")
            assert "bi_g * (long long)sz_N" in src[loop_at:] and "bi_g" not in src[:loop_at].split("gR0 =")[1].split(";")[0]


def test_refuses_a_group_loop_that_is_not_a_plain_sum(gqa_kernels):
    from compiler.ir import Bin, Const, Read

    k = gqa_kernels["dV"]
    outer = k.body[-1]
    st = outer.state[0]
    inner = outer.body[0].state[0].name
    scaled = replace(st, update=Bin("+", Read(st.name, ()), Bin("*", Const(2.0), Read(inner, ()))))
    _refused(replace(k, body=k.body[:-1] + (replace(outer, state=(scaled,)),)), "tensor-core tile sum")


def test_refuses_a_row_tile_read_at_the_group_index(gqa_kernels):
    """The row tile is staged once, before the group loops: reading it at g has no place."""
    from compiler.ir import Aff, Read

    k = gqa_kernels["dV"]
    at = next(i for i, s in enumerate(k.body) if getattr(s, "buf", None) is not None and s.buf.source == "K")
    stage = k.body[at]
    read = next(x for x in walk_reads(stage.value) if x.tensor == "K")
    moved = replace(read, idx=read.idx[:1] + (Aff.of("g"),) + read.idx[2:])
    bad = replace(k, body=k.body[:at] + (replace(stage, value=_swap(stage.value, read, moved)),) + k.body[at + 1:])
    _refused(bad, "nor a block index")


def walk_reads(e):
    from compiler.ir import Read, walk

    return [x for x in walk(e) if isinstance(x, Read)]


def test_sliding_window_narrows_both_ends_of_the_tile_range():
    """j <= i && i - j < W: dQ's key tiles start where the window reaches (sz_W in it_begin) and end
    at the diagonal; dV's (and dK's, fused with it) query tiles start at the diagonal and end where
    the window stops."""
    from codegen.mappings.score_sum import render

    ks = _lowered("attention_sliding_window_grad.yaml")
    assert "dK" not in ks and [st.tensor for st in ks["dV"].stores] == ["dV", "dK"]
    for name, bound in (("dQ", "it_begin"), ("dV", "it_end")):
        src = render(ks[name]).variants[0].source.source
        line = next(x for x in src.splitlines() if f"const int {bound} =" in x)
        assert "sz_W" in line, (name, line)


@pytest.mark.xdist_group("example-attention_strict_causal_grad")
def test_strict_causal_row_zero_has_zero_gradients(example_build):
    """j < i: query 0 sees no key (LSE = -inf): the emulated backward gives exact zeros in its dQ
    row and in O, no NaN anywhere, and matches float64 elsewhere."""
    import derivc

    b = example_build(ROOT / "examples" / "attention_strict_causal_grad.yaml")
    assert b.rc == 0, b.stderr[-2000:]
    out = b.out
    assert json.loads((out / "grad" / "dQ" / "plan.json").read_text())["mapping"] == "score_sum_wgmma"
    t = derivc.load_training(out, device="emu")
    rng = np.random.default_rng(5)
    n = 70
    q, k, v, do = (rng.standard_normal((1, 1, n, 128)).astype(np.float16) for _ in range(4))
    o, saved = t.forward_with_saved(Q=q, K=k, V=v)
    grads = t.backward(saved, do)
    assert np.isneginf(saved["LSE"][0, 0, 0]) and np.all(o[0, 0, 0] == 0)
    assert np.all(grads["Q"][0, 0, 0] == 0)
    _, g_ref = _attention_backward(q, k, v, do, mask="strict")
    for x in ("Q", "K", "V"):
        assert np.all(np.isfinite(grads[x])), x
        err = np.linalg.norm(grads[x].astype(np.float64) - g_ref[x]) / np.linalg.norm(g_ref[x])
        assert err < 5e-3, (x, err)


def _swap(e, old, new):
    from compiler.ir import map_children

    if e == old:
        return new
    return map_children(e, lambda x: _swap(x, old, new))


# -- rule extensions -------------------------------------------------------------------------

def _two_reads() -> str:
    return spec_text(["Y[i, e] = sum(j: sum(d: Q[i, d] * K[j, d]) * K[j, e])"],
                     {"Q": (["N", "D"], "f16"), "K": (["N", "D"], "f16")}, {"N": 8, "D": 4}, "Y")


def test_cache_stages_one_tile_read_at_two_index_variables():
    prog = program_of(_two_reads())
    tiled = apply(prog, "tile", **{"def": "Y", "index": "j", "size": 4})
    cached = apply(tiled, "cache", **{"def": "Y", "tensor": "K", "at": "jo", "over": ["ji", "d", "e"]})
    assert numeric_error(prog, cached, {"N": 8, "D": 4}, 5) <= 1e-12
    text = str(cached.defs[0].body)
    assert "K_s" in text


def test_cache_refuses_reads_of_different_tiles():
    # with e tiled, the product reads K[j, 2*eo + ei]: another tile than the score's K[j, d]
    prog = program_of(_two_reads())
    prog = apply(prog, "tile", **{"def": "Y", "index": "j", "size": 4})
    prog = apply(prog, "tile", **{"def": "Y", "index": "e", "size": 2})
    exc = check_fails(prog, "cache", **{"def": "Y", "tensor": "K", "at": "jo", "over": ["ji", "d", "ei"]})
    assert "different tiles" in str(exc)


def _tiled_causal_sum():
    prog = program_of(spec_text(["Y[i, e] = sum(j | j <= i: exp(sum(d: Q[i, d] * K[j, d])) * K[j, e])"],
                                {"Q": (["N", "D"], "f16"), "K": (["N", "D"], "f16")}, {"N": "dynamic", "D": 4}, "Y"))
    prog = apply(prog, "tile", **{"def": "Y", "index": "i", "size": 4})
    return prog, apply(prog, "tile", **{"def": "Y", "index": "j", "size": 4})


def test_skip_masked_truncates_a_tiled_sum_at_the_diagonal():
    """MASK on sum(jo: sum(ji < 4: [4*jo + ji <= 4*io + ii] ? … : 0)): the key tiles past the query
    tile's diagonal go (dQ's causal skip), the value unchanged."""
    spec, prog = _tiled_causal_sum()
    out = apply(prog, "skip_masked", **{"def": "Y", "index": "jo"})
    from compiler.ir import Aff

    assert out.defs[0].body.var == "jo" and out.defs[0].body.ext.parts[-1] == (Aff.build({"io": 4}, 4), 4)
    for n in (5, 9, 13):
        assert numeric_error(spec, out, {"N": n, "D": 4}, n) <= 1e-12


def test_skip_masked_refuses_a_tiled_sum_without_guards():
    spec = program_of(_two_reads())
    prog = apply(spec, "tile", **{"def": "Y", "index": "j", "size": 4})
    exc = check_fails(prog, "skip_masked", **{"def": "Y", "index": "jo"})
    assert "guarded" in str(exc) or "nothing can be skipped" in str(exc)


# -- mutations: each must fail the build at the kernel step ---------------------------------

MUTATIONS = (
    Mutation("bwd_value_drops_subtrahend", "flash_attention_grad_mma.yaml", "codegen/mappings/score_sum.py",
             'return f"({a} {_BINARY_C[e.op]} {b})"', 'return a if e.op == "-" else f"({a} {_BINARY_C[e.op]} {b})"'),
    Mutation("bwd_value_drops_guards", "flash_attention_grad_mma.yaml", "codegen/mappings/score_sum.py",
             'return f"({conds_c(e.conds, names)} ? {val(e.then)} : {val(e.other)})"', "return val(e.then)"),
    Mutation("bwd_tile_range_starts_late", "flash_attention_grad_mma.yaml", "codegen/mappings/score_sum.py",
             "begin = first_tile_c(guards, m.loop.var, box, blk)",
             'begin = "(" + first_tile_c(guards, m.loop.var, box, blk) + " + 1)"'),
    Mutation("bwd_tile_range_ends_early", "flash_attention_grad_mma.yaml", "codegen/mappings/cexpr.py",
             "return f\"(({num} >= 0 ? {num} / {u} : -((-{num} + {u - 1}) / {u})) + 1)\"",
             "return f\"({num} >= 0 ? {num} / {u} : -((-{num} + {u - 1}) / {u}))\""),
    Mutation("bwd_accumulation_b_not_transposed", "flash_attention_grad_mma.yaml", T + "score_sum.cu.j2",
             "{{ mm.ldsm_b_kn('xb'", "{{ mm.ldsm_b_nk('xb'"),
    Mutation("bwd_group_sum_drops_last_step", "attention_gqa_grad.yaml", "codegen/mappings/score_sum.py",
             'ext=f"(long long)({ext_c(g.ext, {**blk, **group})})"', 'ext=f"((long long)({ext_c(g.ext, {**blk, **group})}) - 1)"'),
    Mutation("bwd_value_drops_index_values", "attention_alibi_grad.yaml", "codegen/mappings/score_sum.py",
             "return index_value_c(e.aff, names)", 'return "0.0f"'),
    Mutation("bwd_ring_wait_one_short", "flash_attention_grad_mma.yaml", T + "score_sum.cu.j2",
             "cp_async_wait<{{ stages - 2 }}>();", "cp_async_wait<{{ stages - 1 }}>();"),
)


@pytest.mark.parametrize("m", mutation_params(MUTATIONS))
def test_mutation_fails_at_the_kernel_step(m: Mutation, tmp_path: Path) -> None:
    assert_caught_at_the_kernel_step(m, tmp_path)


def test_a_group_step_resetting_the_accumulator_fails_the_cpu_check(monkeypatch) -> None:
    """GQA's dV / dK on mma.sync (the example maps it to wgmma): each group step zeroing the
    accumulators keeps only the last query head's sums, which the kernel text's CPU run shows."""
    import jinja2

    from codegen.build import largest_tiles
    from codegen.kernel_check import KernelCheckError, check_kernel_text
    from codegen.mappings import templates_env
    from codegen.mappings.score_sum import render
    from codegen.mappings.templates_env import TEMPLATE_DIR

    kd, k = _derived("attention_gqa_grad.yaml")["dV"]
    sizes = {"B": 1, "HK": 1, "G": 3, "N": 77, "D": 128}
    assert check_kernel_text(render(k), kd.final, sizes, 7, largest_tiles(kd))["passed"]
    text = (TEMPLATE_DIR / "score_sum.cu.j2").read_text()
    old = "    __syncthreads();  // every warp is done with the column ring of the previous group step"
    assert text.count(old) == 1
    env = templates_env._env
    loader = jinja2.ChoiceLoader([jinja2.DictLoader({"score_sum.cu.j2": text.replace(old, old + "\n{{ acc_init() }}")}),
                                  env.loader])
    monkeypatch.setattr(templates_env, "_env", env.overlay(loader=loader))
    with pytest.raises(KernelCheckError):
        check_kernel_text(render(k), kd.final, sizes, 7, largest_tiles(kd))
