"""FUSE-SUMS and the fused dK / dV kernel (issue 17: FlashAttention-2's split of the backward).

The rule: two sums over the same tiles in the same nest become one fold of two accumulators,
the second sum a further output of the definition (both values checked in float64, refusals by
name).  The kernel: flash_attention_grad_mma_d128's dV kernel writes dK too; score_sum
prints both sums over one set of score tiles, and its text, run on the CPU through the emulation
(codegen/emu), matches the kernel's program in float64 — and fails to when the printer drops the
dV accumulation, swaps the two outputs, or forgets dS's D subtraction."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rulekit import apply, check_fails, eval_sizes, program_of

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "flash_attention_grad_mma_d128.yaml"  # the wgmma examples print it with score_sum wgmma

TWO_SUMS = """
name: two_sums
sizes: {M: dynamic, K: dynamic, N: 8}
inputs:
  A: {shape: [M, K], dtype: f32}
  B: {shape: [K, N], dtype: f32}
  C: {shape: [K, N], dtype: f32}
  W: {shape: [M, K], dtype: f32}
statements:
  - "Y[i, n] = sum(k: A[i, k] * B[k, n])"
  - "Z[i, n] = sum(k: A[i, k] * C[k, n])"
  - "U[i, n] = sum(k: W[i, k] * C[k, n])"
output: {tensor: Y, dtype: f32, also: [{tensor: Z, dtype: f32}, {tensor: U, dtype: f32}]}
"""


def _outputs(prog, sizes, seed=0):
    from compiler.interp import random_inputs, run_program

    sizes = eval_sizes(prog, sizes)
    inputs = random_inputs(prog, sizes, np.random.default_rng(seed))
    out = run_program(prog, sizes, inputs)
    return {n: out[n] for n in (prog.output, *prog.also_outputs())}


def _tiled():
    prog = program_of(TWO_SUMS)
    for d in ("Y", "Z"):
        prog = apply(prog, "tile", **{"def": d, "index": "k", "size": 4})
    return prog


def _fused():
    return apply(_tiled(), "fuse_sums", **{"def": "Y", "with": "Z"})


def test_fuse_sums_keeps_both_values():
    spec, fused = program_of(TWO_SUMS), _fused()
    assert [d.name for d in fused.defs] == ["Y", "U"] and [a.name for a in fused.def_named("Y").also] == ["Z"]
    for k in (1, 7, 10):
        want, got = _outputs(spec, {"M": 5, "K": k}), _outputs(fused, {"M": 5, "K": k})
        for n in ("Y", "Z", "U"):
            assert np.max(np.abs(got[n] - want[n])) <= 1e-12 * max(1.0, np.max(np.abs(want[n]))), n


def test_fuse_sums_with_its_outputs_swapped_is_caught(monkeypatch):
    """The mutation `the fold stores its accumulators in each other's outputs` changes both values."""
    from compiler.ir import Read
    from compiler.rules.fuse_sums import FuseSums

    orig = FuseSums.rewrite

    def swapped(self, prog, p, facts):
        out = orig(self, prog, p, facts)
        d = out.def_named(p.def_)
        fold = d.body
        return out.with_def(replace(d, body=replace(fold, result=fold.also[0], also=(fold.result,))))

    monkeypatch.setattr(FuseSums, "rewrite", swapped)
    fused = _fused()
    want, got = _outputs(program_of(TWO_SUMS), {"M": 5, "K": 7}), _outputs(fused, {"M": 5, "K": 7})
    assert not np.allclose(got["Y"], want["Y"]) and not np.allclose(got["Z"], want["Z"])
    assert isinstance(fused.def_named("Y").body.result, Read)


@pytest.mark.parametrize("why, params, fragment", [
    ("untiled against tiled", {"def": "Y", "with": "U"}, "sums"),
    ("itself", {"def": "Y", "with": "Y"}, "itself"),
])
def test_fuse_sums_refuses_by_name(why, params, fragment):
    exc = check_fails(_tiled(), "fuse_sums", **params)
    assert fragment in str(exc), (why, str(exc))


def test_fuse_sums_refuses_a_tensor_another_definition_reads():
    text = TWO_SUMS.replace('  - "U[i, n] = sum(k: W[i, k] * C[k, n])"', '  - "U[i, n] = Z[i, n] * 2"')
    prog = program_of(text)
    for d in ("Y", "Z"):
        prog = apply(prog, "tile", **{"def": d, "index": "k", "size": 4})
    assert "read by U" in str(check_fails(prog, "fuse_sums", **{"def": "Y", "with": "Z"}))


def test_fuse_sums_refuses_a_tensor_that_is_no_output():
    text = TWO_SUMS.replace(", {tensor: U, dtype: f32}]", "]").replace("{tensor: Z, dtype: f32}", "{tensor: U, dtype: f32}")
    prog = program_of(text)
    for d in ("Y", "Z"):
        prog = apply(prog, "tile", **{"def": d, "index": "k", "size": 4})
    assert "not an output" in str(check_fails(prog, "fuse_sums", **{"def": "Y", "with": "Z"}))


# -- sums under a shared outer sum (GQA's dV / dK under the sum over the query heads g) ----------

GROUPED = """
name: grouped_sums
sizes: {M: dynamic, G: dynamic, K: dynamic, N: 8}
inputs:
  A: {shape: [M, G, K], dtype: f32}
  B: {shape: [G, K, N], dtype: f32}
  C: {shape: [G, K, N], dtype: f32}
statements:
  - "Y[i, n] = sum(g: sum(k: A[i, g, k] * B[g, k, n]))"
  - "Z[i, n] = sum(g: sum(k: A[i, g, k] * C[g, k, n]))"
output: {tensor: Y, dtype: f32, also: [{tensor: Z, dtype: f32}]}
"""


def _grouped_tiled(z_size: int = 4):
    prog = program_of(GROUPED)
    prog = apply(prog, "tile", **{"def": "Y", "index": "k", "size": 4})
    return apply(prog, "tile", **{"def": "Z", "index": "k", "size": z_size})


def test_fuse_sums_inner_shares_the_tile_index_and_keeps_both_values():
    from compiler.ir import Fold, Reduce

    spec = program_of(GROUPED)
    fused = apply(_grouped_tiled(), "fuse_sums", **{"def": "Y", "with": "Z", "inner": "ko"})
    fold = fused.def_named("Y").body
    assert isinstance(fold, Fold) and fold.var == "g"
    # both accumulators add a sum over the one index ko (one tile loop once lowered)
    assert [u.b.var for u in fold.update] == ["ko", "ko"] and all(isinstance(u.b, Reduce) for u in fold.update)
    for g, k in ((1, 1), (3, 7), (2, 10)):
        want, got = _outputs(spec, {"M": 5, "G": g, "K": k}), _outputs(fused, {"M": 5, "G": g, "K": k})
        for n in ("Y", "Z"):
            assert np.max(np.abs(got[n] - want[n])) <= 1e-12 * max(1.0, np.max(np.abs(want[n]))), n


@pytest.mark.parametrize("why, z_size, inner, fragment", [
    ("inner sums over other tiles", 2, "ko", "inner sums differ"),
    ("no sum directly inside", 4, "ki", "does not hold a sum over ki directly"),
])
def test_fuse_sums_inner_refuses_by_name(why, z_size, inner, fragment):
    exc = check_fails(_grouped_tiled(z_size), "fuse_sums", **{"def": "Y", "with": "Z", "inner": inner})
    assert fragment in str(exc), (why, str(exc))


def test_fuse_sums_inner_without_its_extent_check_is_caught(monkeypatch):
    """The mutation `inner sums of any extent share the index` is accepted where the refusal test
    wants a refusal.  (The values stay right: renaming a bound index is alpha-conversion, each sum
    keeping its own extent; the check guards the claim the step makes, one tile loop for both.)"""
    from compiler.ir import Fold
    from compiler.rules import fuse_sums

    monkeypatch.setattr(fuse_sums, "shared_inner", lambda a, b, inner: None)
    prog = _grouped_tiled(2)
    with pytest.raises(AssertionError, match="accepted"):
        test_fuse_sums_inner_refuses_by_name("inner sums over other tiles", 2, "ko", "inner sums differ")
    fold = apply(prog, "fuse_sums", **{"def": "Y", "with": "Z", "inner": "ko"}).def_named("Y").body
    assert isinstance(fold, Fold) and fold.update[0].b.ext != fold.update[1].b.ext


# -- the fused dK / dV kernel ----------------------------------------------------------------

@pytest.fixture(scope="module")
def fused_kernel():
    """(derivation, kernel IR) of the example's dV kernel (which writes dK too)."""
    from codegen.kir.lower import lower
    from compiler.derive_grad import derive_gradient
    from compiler.spec import load_spec_file

    spec = load_spec_file(EXAMPLE)
    g = derive_gradient(spec, str(EXAMPLE), seed=1, check=False)
    kd = next(k for k in g.kernels if k.grad_kernel == "dV")
    return kd, lower(kd.final, "dV"), {**spec.check_sizes, "D": 128}


def test_the_kernel_ir_has_two_sums_over_one_tile_loop(fused_kernel):
    from codegen.kir.ir import TileLoop
    from codegen.mappings.score_sum import match

    _, k, _ = fused_kernel
    assert [st.tensor for st in k.stores] == ["dV", "dK"]
    loop = k.body[-1]
    assert isinstance(loop, TileLoop) and len(loop.state) == 2
    plan = match(k).plan
    # S = K Q^T and dP = V dO^T once each, read by both sums; dV accumulates dO, dK accumulates Q
    assert len(plan.scores) == 2 and len(plan.acc_tiles) == 2
    assert [plan.col_tiles[t].op.name for t in plan.acc_tiles] == ["dO", "Q"]
    assert [o.name for o in plan.outs] == ["dV", "dK"]


def _check(kd, k, sizes, printed=None):
    from codegen.build import largest_tiles, print_checked
    from codegen.kernel_check import check_kernel_text

    printed = printed or print_checked(k)
    return check_kernel_text(printed, kd.final, sizes, 7, largest_tiles(kd))


def test_the_fused_kernel_text_matches_its_program_on_the_cpu(fused_kernel):
    kd, k, sizes = fused_kernel
    assert _check(kd, k, sizes)["passed"]


def _value_patch(monkeypatch, change):
    """score_sum's element values printed through `change(index of the sum, value)`."""
    from codegen.mappings import score_sum

    orig, calls = score_sum.element_value_c, []

    def patched(k, value, names, score_of):
        calls.append(value)
        return orig(k, change(len(calls) - 1, value), names, score_of)

    monkeypatch.setattr(score_sum, "element_value_c", patched)


def _drop_dv(monkeypatch):
    from compiler.ir import Const

    _value_patch(monkeypatch, lambda i, v: Const(0.0) if i == 0 else v)


def _no_d_subtraction(monkeypatch):
    from compiler.ir import Const, replace_reads

    _value_patch(monkeypatch, lambda i, v: replace_reads(v, "Dsum", lambda r: Const(0.0)))


def _swap_outputs(monkeypatch):
    from codegen.mappings import score_sum

    orig = score_sum.match
    monkeypatch.setattr(score_sum, "match", lambda k: (lambda m: replace(m, plan=replace(m.plan, outs=m.plan.outs[::-1])))(orig(k)))


@pytest.mark.parametrize("mutate", [_drop_dv, _swap_outputs, _no_d_subtraction],
                         ids=["drops_the_dV_accumulation", "swaps_the_two_outputs", "dS_without_D"])
def test_a_mutated_printer_fails_the_cpu_check(fused_kernel, monkeypatch, mutate):
    from codegen.kernel_check import KernelCheckError
    from codegen.mappings.score_sum import render

    kd, k, sizes = fused_kernel
    mutate(monkeypatch)
    printed = render(k)
    with pytest.raises(KernelCheckError):
        _check(kd, k, sizes, printed)


def test_group_loops_around_two_sums_are_planned(fused_kernel):
    """A group loop (GQA's sum over query heads) around dV and dK fused: group state k totals sum k."""
    from codegen.kir.ir import State, TileLoop
    from codegen.mappings.score_sum import match
    from compiler.ir import Bin, Const, Read
    from compiler.ir_index import Ext

    _, k, _ = fused_kernel
    loop = k.body[-1]
    tot = tuple(State(f"tot{i}", Const(0.0), Bin("+", Read(f"tot{i}", ()), Read(st.name, ())))
                for i, st in enumerate(loop.state))
    stores = (replace(k.store, value=Read("tot0", ())),)
    also = tuple(replace(st, value=Read(f"tot{i + 1}", ())) for i, st in enumerate(k.also))
    plan = match(replace(k, body=k.body[:-1] + (TileLoop("g", Ext.of(2), tot, (loop,)),), store=stores[0], also=also)).plan
    assert plan.groups == ("g",) and [o.name for o in plan.outs] == ["dV", "dK"]


# -- the step's obligation -------------------------------------------------------------------

def test_the_fuse_sums_obligation_is_proved_by_coqc_and_a_wrong_one_is_not(fused_kernel, tmp_path):
    """The example's FUSE-SUMS step (dV = fst of the pair fold, dK = snd) and a MAP-MMA step on the
    fused fold check with coqc; the obligation with its two components swapped does not."""
    import json

    from compiler.obligations import write_obligations
    from proofs_ci import coqlib

    if not coqlib.coqc_available():
        pytest.skip("coqc not installed")
    kd, _, _ = fused_kernel
    write_obligations(kd, tmp_path / "proofs")
    index = {s["rule"] + str(s["step"]): s for s in json.loads((tmp_path / "proofs" / "index.json").read_text())["steps"]}
    step = next(s for s in index.values() if s["rule"] == "fuse_sums")
    assert step["status"] == "partial" and step["theorem"] == "fold_pair_sum"
    assert all(s["status"] in ("full", "partial") for s in index.values())
    lib = coqlib.build_library(out_dir=tmp_path / "coq")
    fuse = tmp_path / "proofs" / step["files"]["coq"]
    last_mma = tmp_path / "proofs" / max((s for s in index.values() if s["rule"] == "map_mma"),
                                        key=lambda s: s["step"])["files"]["coq"]
    for f in (fuse, last_mma):
        r = coqlib.check_obligation(f, lib)
        assert r.returncode == 0, (f.name, r.stdout[-800:], r.stderr[-800:])
    text = fuse.read_text()
    wrong = tmp_path / "Wrong.v"
    wrong.write_text(text.replace("in v_acc_dV)).", "in v_acc_dK)).", 1))
    assert wrong.read_text() != text
    assert coqlib.check_obligation(wrong, lib).returncode != 0


def test_the_gqa_fuse_sums_obligation_is_proved_by_coqc(tmp_path):
    """GQA's dV / dK (FUSE-SUMS inner: io, under the sum over the query heads g): the same theorem,
    its f and g the query-tile sums as functions of g, checks with coqc; swapped components do not."""
    import json

    from compiler.derive_grad import derive_gradient
    from compiler.obligations import write_obligations
    from compiler.spec import load_spec_file
    from proofs_ci import coqlib

    if not coqlib.coqc_available():
        pytest.skip("coqc not installed")
    path = ROOT / "examples" / "attention_gqa_grad.yaml"
    kd = next(k for k in derive_gradient(load_spec_file(path), str(path), seed=1, check=False).kernels
              if k.grad_kernel == "dV")
    write_obligations(kd, tmp_path / "proofs")
    step = next(s for s in json.loads((tmp_path / "proofs" / "index.json").read_text())["steps"]
                if s["rule"] == "fuse_sums")
    assert step["status"] == "partial" and step["theorem"] == "fold_pair_sum"
    lib = coqlib.build_library(out_dir=tmp_path / "coq")
    fuse = tmp_path / "proofs" / step["files"]["coq"]
    text = fuse.read_text()
    assert "(fun i_g => sumTo (ceilDiv n_N 64) (fun i_io =>" in text  # f, g: functions of the group index
    r = coqlib.check_obligation(fuse, lib)
    assert r.returncode == 0, (r.stdout[-800:], r.stderr[-800:])
    wrong = tmp_path / "Wrong.v"
    wrong.write_text(text.replace("in v_acc_dV)).", "in v_acc_dK)).", 1))
    assert wrong.read_text() != text
    assert coqlib.check_obligation(wrong, lib).returncode != 0
