"""The kernel IR: total lowering, translation validation in every build, printers that read the
kernel IR (never names or flags), and the probes that used to build into wrong kernels."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from codegen.kir import interp as kir_interp
from codegen.kir.ir import Compute, TileLoop
from codegen.kir.lower import LoweringError, lower
from codegen.mappings import print_kernel
from codegen.mappings.ctx_common import DEFAULT_OPTIONS
from compiler.derive import derive
from compiler.ir import Bin, Const, Read, Select
from compiler.spec import load_spec_file
from derivc_testing import build_spec as build
from specgen import simt_nocache

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"


def example(name: str, **edits) -> dict:
    spec = yaml.safe_load((EX / f"{name}.yaml").read_text())
    spec["name"] = spec["name"] + "_" + "_".join(sorted(edits)) if edits else spec["name"]
    for k, v in edits.items():
        spec[k] = v
    return spec


_DERIVED: dict[str, tuple] = {}


def final_program(spec: dict, tmp_path: Path):
    """The derivation of a spec (cached per spec text: several tests read the same program)."""
    text = yaml.safe_dump(spec, sort_keys=False)
    if text not in _DERIVED:
        path = tmp_path / f"{spec['name']}.yaml"
        path.write_text(text)
        s = load_spec_file(path)
        _DERIVED[text] = (derive(s, str(path), seed=5), s.name)
    return _DERIVED[text]


# --------------------------------------------------------------------------- validation step


def test_every_build_records_the_lowering_step(tmp_path):
    code, err, out = build(tmp_path, EX / "gemm.yaml")
    assert code == 0, err
    trace = json.loads((out / "derivation.json").read_text())
    # the lowering step, then the kernel step (the printed kernel run through the emulation)
    low, kern = trace["steps"][-2:]
    assert low["rule"] == "lowering" and low["numeric"]["passed"]
    assert low["numeric"]["rel_error"] <= 1e-12
    assert kern["rule"] == "kernel" and kern["numeric"]["passed"]
    assert "lowering" in (out / "report.md").read_text()
    assert (out / "kir.txt").read_text().startswith("kernel derivc_gemm")


def test_kernel_ir_interpreter_catches_a_dropped_guard(tmp_path):
    d, name = final_program(example("flash_attention"), tmp_path)
    k = lower(d.final, name)
    sizes = dict(d.check_sizes)
    assert kir_interp.validate(k, d.final, sizes, 1)["rel_error"] <= 1e-12
    # the lowering forgets the score mask (of S and of P): masked keys contribute
    loop = next(s for s in k.body if isinstance(s, TileLoop))
    body = tuple(replace(s, value=s.value.then) if isinstance(s, Compute) and isinstance(s.value, Select) else s
                 for s in loop.body)
    bad = replace(k, body=tuple(replace(s, body=body) if s is loop else s for s in k.body))
    assert kir_interp.validate(bad, d.final, sizes, 1)["rel_error"] > 1e-12
    # ... or stops the key sweep one tile early
    from compiler.ir import Aff, Ext
    short = replace(loop, ext=Ext(((Aff.build({"io": 128}), 64),)))
    bad1 = replace(k, body=tuple(short if s is loop else s for s in k.body))
    assert kir_interp.validate(bad1, d.final, sizes, 1)["rel_error"] > 1e-12
    # ... or the store guard: rows past N are written out of bounds
    bad2 = replace(k, store=replace(k.store, guard=()))
    with pytest.raises(kir_interp.KirError, match="outside"):
        kir_interp.validate(bad2, d.final, sizes, 1)


def test_lowering_refuses_what_it_cannot_translate(tmp_path):
    spec = example("attention_naive")
    code, err, out = build(tmp_path, spec)
    assert code == 3 and "definitions" in err and "FUSE" in err and not out.exists()
    d, name = final_program(example("flash_attention", schedule=example("flash_attention")["schedule"][:3]), tmp_path)
    with pytest.raises(LoweringError):
        lower(d.final, name)


def test_a_wrong_lowering_stops_the_build(tmp_path, monkeypatch):
    """A lowering that drops a condition is caught by the translation validation (exit 3)."""
    import codegen.kir.lower as low

    orig = low._Lowering.expr

    def drop_conditions(self, e, inside_dims=False):
        if isinstance(e, Select) and (e.other == Const(float("-inf")) or getattr(e.then, "op", "") == "exp"):
            e = e.then
        return orig(self, e, inside_dims)

    monkeypatch.setattr(low._Lowering, "expr", drop_conditions)
    code, err, out = build(tmp_path, EX / "flash_attention.yaml")
    assert code == 3 and "lowering" in err and "kernel IR disagrees" in err and not out.exists()


# --------------------------------------------------------------------------- the probes


def attention_spec(mask: str, schedule_from: str = "flash_attention") -> dict:
    spec = example(schedule_from)
    spec["statements"][1] = f"P[b, h, i, j] = softmax(j | {mask}: S[b, h, i, j])"
    spec["name"] = spec["name"] + "_" + mask.replace(" ", "").replace("<=", "le").replace("<", "lt")
    return spec


@pytest.mark.parametrize("source", [pytest.param(s, marks=pytest.mark.xdist_group(f"example-{s}"))  # wgmma: tests/gpu
                                    for s in ("flash_attention", "flash_attention_small_tiles")])
def test_strict_causal_mask_reaches_the_kernel(tmp_path, source, example_build):
    spec = attention_spec("j < i", source)
    code, err, out = build(tmp_path, spec)
    assert code == 0, err
    kir = (out / "kir.txt").read_text()
    assert "+ 64*jo < ii" in kir or "+ 128*jo < ii" in kir, kir
    strict = (out / "kernel.cu").read_text()
    causal = example_build(EX / f"{source}.yaml")  # the same spec with j <= i: the run's shared build
    assert causal.rc == 0, causal.stderr
    same_names = strict.replace(spec["name"], example(source)["name"])
    assert same_names != (causal.out / "kernel.cu").read_text(), "the strict mask must change the kernel"
    assert ") < ((row - q0)" in strict  # the printed condition, not a flag


def test_masked_contraction_on_tensor_cores_is_refused_by_name(tmp_path):
    spec = example("gemm")
    spec["statements"] = ["C[i, j] = sum(k | k <= i: A[i, k] * B[k, j])"]
    spec["name"] = "gemm_masked"
    code, err, out = build(tmp_path, spec)
    assert code == 3 and not out.exists()
    assert "ki + 64*ko <= ii + 128*io" in err and "not implied" in err


def test_masked_contraction_on_simt_prints_the_condition(tmp_path):
    spec = example("gemm_f32_simt")
    spec["statements"] = ["C[i, j] = sum(k | k <= i: A[i, k] * B[k, j])"]
    spec["name"] = "gemm_masked_simt"
    code, err, out = build(tmp_path, spec)
    assert code == 0, err
    assert "(v_ki + 16 * v_ko) <= (v_ii + 64 * v_io)" in (out / "kernel.cu").read_text()


def test_transposed_operand_changes_the_kernel(tmp_path):
    code, err, out_t = build(tmp_path, simt_nocache("C[i, j] = sum(k: A[k, i] * B[k, j])", "at_b"))
    assert code == 0, err
    code, err, out = build(tmp_path, simt_nocache("C[i, j] = sum(k: A[i, k] * B[k, j])", "a_b"))
    assert code == 0, err
    src_t, src = (out_t / "kernel.cu").read_text(), (out / "kernel.cu").read_text()
    assert src_t.replace("at_b", "a_b") != src
    # A[k, i]: the row index of A is the k expression
    assert "p_A[(long long)(v_ki + 16 * v_ko) * 1LL * (long long)(sz_N)" in src_t


# --------------------------------------------------------------------------- printers read the kernel IR


def _fold_kernel(tmp_path, source="flash_attention"):
    d, name = final_program(example(source), tmp_path)
    return d, lower(d.final, name)


def _map_fold(k, f):
    loop = next(s for s in k.body if isinstance(s, TileLoop))
    new = replace(loop, state=tuple(replace(st, update=f(st.name, st.update)) for st in loop.state))
    return replace(k, body=tuple(new if s is loop else s for s in k.body))


@pytest.mark.parametrize("source,mutation", [("flash_attention", m) for m in
                                             ("no_l_rescale", "no_acc_rescale", "max_zero", "stale_max")]
                         + [("flash_attention_wgmma", "no_l_rescale")])
def test_fold_printer_refuses_an_update_it_does_not_implement(tmp_path, source, mutation):
    """Even if a wrong fold reached the kernel IR, the tensor-core printer prints no kernel."""
    d, k = _fold_kernel(tmp_path, source)
    print_kernel(k, DEFAULT_OPTIONS)  # control

    def mutate(name, upd):
        if mutation == "no_l_rescale" and name == "l":
            return Bin("+", Read("l", ()), upd.b)
        if mutation == "no_acc_rescale" and name == "acc":
            return Bin("+", Read("acc", ()), upd.b)
        if mutation == "max_zero" and name == "m":
            return Const(0.0)
        if mutation == "stale_max" and name == "m":
            return Read("m", ())
        return upd

    from codegen.kir.lower import UnsupportedMapping

    with pytest.raises(UnsupportedMapping, match="update"):
        print_kernel(_map_fold(k, mutate), DEFAULT_OPTIONS)


def test_a_redundant_conjunct_does_not_change_the_kernel(tmp_path):
    """Dropping `j < N` from the P·V guard (P is already 0 there) is a correct rewrite: the
    kernel keeps the K / V tail zero fill, because that comes from the staged copies."""
    d, k = _fold_kernel(tmp_path)
    loop = next(s for s in k.body if isinstance(s, TileLoop))
    acc = next(st for st in loop.state if st.name == "acc")
    pv = acc.update.b
    sel = pv.body
    assert isinstance(sel, Select) and len(sel.conds) == 2
    fewer = replace(pv, body=Select(sel.conds[1:], sel.then, sel.other))
    k2 = _map_fold(k, lambda name, u: Bin("+", u.a, fewer) if name == "acc" else u)
    assert kir_interp.validate(k2, d.final, dict(d.check_sizes), 2)["rel_error"] <= 1e-12
    a = print_kernel(k, DEFAULT_OPTIONS).variants[0].source.source
    b = print_kernel(k2, DEFAULT_OPTIONS).variants[0].source.source
    assert a == b


def test_score_mask_must_match_between_s_and_p(tmp_path):
    d, k = _fold_kernel(tmp_path)
    loop = next(s for s in k.body if isinstance(s, TileLoop))
    p_stmt = [s for s in loop.body if isinstance(s, Compute)][2]
    sel = p_stmt.value
    changed = replace(p_stmt, value=Select(sel.conds[:1], sel.then, sel.other))
    k2 = replace(k, body=tuple(replace(s, body=tuple(changed if t is p_stmt else t for t in s.body))
                               if s is loop else s for s in k.body))
    from codegen.kir.lower import UnsupportedMapping

    with pytest.raises(UnsupportedMapping, match="mask"):
        print_kernel(k2, DEFAULT_OPTIONS)


def test_negative_scale_takes_the_general_score_path(tmp_path):
    """A negative scale cannot be folded into exp2's log2(e) factor as the fast path does (the
    max would flip); the fold mapping prints the score per element instead, and the build's
    kernel check (the text run on the CPU against the program) passes."""
    spec = example("flash_attention")
    spec["params"] = {"scale": -0.125}
    spec["name"] = "fa_negative_scale"
    code, err, out = build(tmp_path, spec)
    assert code == 0, err
    assert "(the kernel text on the CPU)" in (out / "report.md").read_text()


# --------------------------------------------------------------------------- rule mutations end to end


def _mutated(monkeypatch, rule: str, f):
    from compiler.rules import RULES

    r = RULES[rule]
    orig = r.rewrite
    monkeypatch.setattr(r, "rewrite", lambda prog, p, facts: f(orig(prog, p, facts), facts))


def _map_exprs(prog, f):
    from compiler.ir import map_children

    def go(e):
        return f(map_children(e, go))

    return prog.with_def(replace(prog.defs[-1], body=go(prog.defs[-1].body)))


ONLINE = {
    "no_l_rescale": lambda e: Bin("+", e.a.a, e.b) if isinstance(e, Bin) and e.op == "+" and isinstance(e.a, Bin)
    and e.a.op == "*" and e.a.a == Read("l", ()) else e,
    "no_acc_rescale": lambda e: Bin("+", e.a.a, e.b) if isinstance(e, Bin) and e.op == "+" and isinstance(e.a, Bin)
    and e.a.op == "*" and e.a.a == Read("acc", ()) else e,
    "max_zero": lambda e: Const(0.0) if e == Read("m_new", ()) else e,
}


@pytest.mark.parametrize("mutation", sorted(ONLINE))
@pytest.mark.parametrize("step_check", [True, False])
def test_mutated_online_agg_never_yields_a_kernel(tmp_path, monkeypatch, mutation, step_check):
    _mutated(monkeypatch, "online_agg", lambda prog, facts: _map_exprs(prog, ONLINE[mutation]))
    if not step_check:  # even without the per-step check, the build must not produce a kernel
        import compiler.derive as der
        monkeypatch.setattr(der, "numeric_check", lambda *a, **k: [])
    code, err, out = build(tmp_path, EX / "flash_attention.yaml")
    assert code == 3, err
    assert not out.exists()


MUTATIONS = {
    # TILE drops the tail guard of a loop tile
    ("tile", "guard"): lambda prog, facts: prog.with_def(replace(prog.defs[-1], guard=())),
    # swapped operand indices
    ("tile", "swap"): lambda prog, facts: _map_exprs(prog, lambda e: Read(e.tensor, tuple(reversed(e.idx)))
                                                      if isinstance(e, Read) and e.tensor == "B" and len(e.idx) == 2 else e),
    # MASK drops a conjunct of the causal mask
    ("skip_masked", "conjunct"): lambda prog, facts: _map_exprs(
        prog, lambda e: Select(e.conds[:1], e.then, e.other) if isinstance(e, Select) and len(e.conds) == 2 else e),
}


@pytest.mark.parametrize("key", sorted(MUTATIONS))
def test_mutated_rules_never_yield_a_kernel(tmp_path, monkeypatch, key):
    rule, _ = key
    _mutated(monkeypatch, rule, MUTATIONS[key])
    source = EX / ("gemm.yaml" if rule == "tile" else "flash_attention.yaml")
    code, err, out = build(tmp_path, source)
    assert code == 3, err
    assert not out.exists()


def test_fold_printer_refuses_a_partial_head_sum(tmp_path):
    """A score that sums only part of the head dimension is not what the templates compute."""
    from compiler.ir import Ext
    from codegen.kir.lower import UnsupportedMapping

    d, k = _fold_kernel(tmp_path)
    loop = next(s for s in k.body if isinstance(s, TileLoop))
    s_stmt = [s for s in loop.body if isinstance(s, Compute)][0]
    sel = s_stmt.value
    red = sel.then.b
    half = replace(s_stmt, value=Select(sel.conds, Bin("*", sel.then.a, replace(red, ext=Ext.of(64))), sel.other))
    k2 = replace(k, body=tuple(replace(s, body=tuple(half if t is s_stmt else t for t in s.body))
                               if s is loop else s for s in k.body))
    with pytest.raises(UnsupportedMapping, match="head dimension"):
        print_kernel(k2, DEFAULT_OPTIONS)
