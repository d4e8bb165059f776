"""Row kernels on the CPU: softmax (two-pass and one streaming fold), LayerNorm, RMSNorm.

- the four examples build through NVRTC / SASS on the rowwise mapping with no spills;
- generated row specs (other reductions and element-wise functions, fixed and dynamic row
  lengths, tails, with and without the thread mapping) are printed by the rowwise mapping or
  refused by it by name (and printed by SIMT), and every build passes its lowering check;
- the rules fuse_let, cache_row and ONLINE-AGG's softmax-element form: what they produce,
  negative cases, mutations the numeric check catches, and the Coq obligations (coqc) of
  correct and mutated steps;
- the rowwise printer refuses hand-mutated kernel IRs by name (what a wrong rule would give).
"""
from __future__ import annotations

import json
import random
import shutil
import types
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from rulekit import apply, apply_steps, check_fails, numeric_error, program_of

from codegen.cuda import nvrtc
from codegen.kir.ir import Compute, Kernel, Stage
from codegen.kir.lower import UnsupportedMapping, lower
from codegen.mappings import rowwise
from compiler.derive import derive
from compiler.ir import Aff, Bin, Const, Fold, Let, Read, Reduce
from compiler.rules import RULES
from compiler.spec import load_spec_file, parse_spec_text

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["softmax_two_pass", "softmax_online", "layernorm", "rmsnorm"]
needs_nvrtc = pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="NVRTC not available")


def _build(spec: dict, tmp: Path, codegen: bool = True):
    from compiler.cli import build_to

    path = tmp / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp / spec["name"]
    build_to(path, out, proofs=False, seed=1, codegen=codegen)
    return out


# --------------------------------------------------------------------------- the examples


@needs_nvrtc
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_builds_on_rowwise_without_spills(tmp_path, name):
    spec = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    out = _build(spec, tmp_path)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["mapping"] == "rowwise"
    assert plan["plan"]["rows_cached"] == ["X_row"]
    sass = json.loads((out / "sass.json").read_text())
    assert sass["violations"] == [] and sass["local_memory_ops"] == 0
    kir = (out / "kir.txt").read_text()
    assert "stage X_row[r0 < 8192] @{register; copies X}" in kir
    if name == "softmax_online":
        assert "for co < ceil(C/4096) carrying (m = -inf, l = 0)" in kir
        assert "l := l * rescale(m, m_new)" in kir


# --------------------------------------------------------------------------- generated row specs

REDUCE_BODIES = ["X[r, k]", "X[r, k] * X[r, k]", "exp(X[r, k])", "tanh(X[r, k]) + 1", "log(X[r, k] * X[r, k] + 1)"]
# gt(S, X) ties at the row's maximum when S = max(k: X[r, k])
OUTPUTS = ["X[r, c] * S[r]", "(X[r, c] - S[r]) * W[c]", "exp(X[r, c] - S[r])", "X[r, c] / (S[r] + C)",
           "rsqrt(S[r] * S[r] + 1) * X[r, c] + W[c]", "X[r, c] * gt(S[r], X[r, c]) + log(S[r] * S[r] + 1)"]


def _row_case(rnd: random.Random, k: int) -> tuple[dict, str]:
    """(spec, expected mapping or the refusal's words)."""
    op = rnd.choice(["sum", "max"])
    body = rnd.choice(REDUCE_BODIES)
    out = rnd.choice(OUTPUTS)
    dynamic = rnd.random() < 0.25
    C = rnd.choice([24, 40, 96, 100, 1000, 1001, 1004])
    threads = rnd.choice([d for d in range(1, 1025) if C % d == 0 and d >= min(C, 32) // 4] or [1])
    mapped = rnd.random() < 0.8
    cached = rnd.random() < 0.7
    stmts = [f"S[r] = {op}(k: {body})", f"Y[r, c] = {out}"]
    inputs = {"X": {"shape": ["R", "C"], "dtype": rnd.choice(["f16", "bf16", "f32"])}}
    if "W[c]" in out:
        inputs["W"] = {"shape": ["C"], "dtype": "f16"}
    schedule = [{"rule": "fuse_let", "producer": "S", "def": "Y"}]
    if cached and not dynamic:
        schedule.append({"rule": "cache_row", "def": "Y", "tensor": "X"})
    schedule.append({"rule": "parallel", "def": "Y", "index": "r", "to": "grid.x"})
    if dynamic:
        schedule += [{"rule": "tile", "def": "Y", "index": "c", "size": 32},
                     {"rule": "parallel", "def": "Y", "index": "co", "to": "grid.y"},
                     {"rule": "parallel", "def": "Y", "index": "ci", "to": "thread", "count": 32}]
        expect = "spans neither the row"
    elif mapped:
        schedule.append({"rule": "parallel", "def": "Y", "index": "c", "to": "thread", "count": threads})
        expect = "rowwise"
    else:
        expect = "not mapped to threads"
    spec = {"name": f"row{k}", "sizes": {"R": "dynamic", "C": "dynamic" if dynamic else C}, "inputs": inputs,
            "statements": stmts, "output": {"tensor": "Y", "dtype": rnd.choice(["f16", "f32"])},
            "check_sizes": {"R": 3, **({"C": 45} if dynamic else {})}, "schedule": schedule}
    return spec, expect


@pytest.mark.parametrize("k", range(16))
def test_generated_row_specs_printed_or_refused_by_name(tmp_path, k):
    rnd = random.Random(1000 + k)
    spec, expect = _row_case(rnd, k)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    d = derive(load_spec_file(path), str(path), seed=k)  # every step checked numerically
    kernel = lower(d.programs[-1], spec["name"])
    from codegen.kir.interp import validate

    sizes = {"R": 3, "C": spec["sizes"]["C"] if spec["sizes"]["C"] != "dynamic" else 45}
    assert validate(kernel, d.programs[-1], sizes, seed=k)["rel_error"] <= 1e-12
    if expect == "rowwise":
        ks, launch, plan = rowwise.render(kernel, ())
        assert plan.threads * plan.vec * plan.sweeps >= sizes["C"] and launch.threads % 32 == 0
        if nvrtc.nvrtc_available() and k % 4 == 0:
            out = _build(spec, tmp_path)
            assert json.loads((out / "plan.json").read_text())["mapping"] == "rowwise"
            assert json.loads((out / "sass.json").read_text())["local_memory_ops"] == 0
    else:
        with pytest.raises(UnsupportedMapping, match=f"rowwise mapping: .*{expect}"):
            rowwise.render(kernel, ())
        from codegen.mappings import print_kernel

        assert print_kernel(kernel, ()).mapping == "simt"


# --------------------------------------------------------------------------- the rules


def _spec(stmts, C=12, extra=None):
    doc = {"name": "t", "sizes": {"R": "dynamic", "C": C},
           "inputs": {"X": {"shape": ["R", "C"], "dtype": "f32"}, **(extra or {})},
           "statements": stmts, "output": {"tensor": "Y", "dtype": "f32"}}
    return program_of(yaml.safe_dump(doc, sort_keys=False))


LN = ["mean[r] = sum(k: X[r, k]) / C", "var[r] = sum(k: (X[r, k] - mean[r]) * (X[r, k] - mean[r])) / C",
      "Y[r, c] = (X[r, c] - mean[r]) * rsqrt(var[r] + 1) * W[c]"]
W = {"W": {"shape": ["C"], "dtype": "f32"}}


def test_fuse_let_binds_once_per_row_and_is_exact():
    p0 = _spec(LN, extra=W)
    p = apply_steps(p0, [{"rule": "fuse_let", "producer": "var", "def": "Y"},
                         {"rule": "fuse_let", "producer": "mean", "def": "Y"}])
    assert [d.name for d in p.defs] == ["Y"]
    body = p.defs[0].body
    assert isinstance(body, Let) and body.bind.name == "mean_v" and body.bind.dims == ()
    assert isinstance(body.body, Let) and body.body.bind.name == "var_v"
    assert numeric_error(p0, p, {"R": 4}) <= 1e-12


def test_cache_row_reads_every_use_through_the_row():
    p0 = _spec(LN, extra=W)
    p = apply_steps(p0, [{"rule": "fuse_let", "producer": "var", "def": "Y"},
                         {"rule": "fuse_let", "producer": "mean", "def": "Y"},
                         {"rule": "cache_row", "def": "Y", "tensor": "X"}])
    body = p.defs[0].body
    assert isinstance(body, Let) and body.bind.source == "X" and body.bind.level == "register"
    from compiler.ir import walk

    assert not [x for x in walk(body.body) if isinstance(x, Read) and x.tensor == "X"]
    assert numeric_error(p0, p, {"R": 4}) <= 1e-12


@pytest.mark.parametrize("steps,rule,params,words", [
    ([], "fuse_let", {"producer": "Y", "def": "Y"}, "output"),
    ([], "fuse_let", {"producer": "mean", "def": "var"}, None),  # accepted: checked below
    ([{"rule": "tile", "def": "mean", "index": "r", "size": 4}], "fuse_let", {"producer": "mean", "def": "Y"},
     "mismatched tilings"),
    ([], "cache_row", {"def": "mean", "tensor": "X"}, "read 1 time"),
    ([], "cache_row", {"def": "Y", "tensor": "W"}, "read 1 time"),
])
def test_row_rules_refuse_by_name(steps, rule, params, words):
    p = apply_steps(_spec(LN, extra=W), steps)
    if words is None:
        apply(p, rule, **params)
        return
    assert words in str(check_fails(p, rule, **params))


def test_fuse_let_refuses_two_read_indices_and_cache_row_an_out_of_range_column():
    p = _spec(["S[r] = sum(k: X[r, k])", "Y[r, c] = X[r, c] * S[r] + S[0]"])
    assert "different indices" in str(check_fails(p, "fuse_let", producer="S", **{"def": "Y"}))
    q = _spec(["Y[r, c] = X[r, c] * X[r, C - 1 - c] + X[r, c + 1]"], C=12)
    assert "not provably in" in str(check_fails(q, "cache_row", tensor="X", **{"def": "Y"}))
    dyn = _spec(["S[r] = sum(k: X[r, k])", "Y[r, c] = X[r, c] * S[r]"], C="dynamic")
    dyn = apply(dyn, "fuse_let", producer="S", **{"def": "Y"})
    assert "dynamic" in str(check_fails(dyn, "cache_row", tensor="X", **{"def": "Y"}))


SOFTMAX = ["Y[r, c] = softmax(c: X[r, c])"]
ONLINE = [{"rule": "split_softmax", "def": "Y"},
          {"rule": "tile", "def": "L", "index": "c_", "size": 4, "outer": "co", "inner": "ci"}]


@pytest.mark.parametrize("C", [12, 13])
def test_online_agg_softmax_element_is_an_m_l_fold(C):
    p0 = _spec(SOFTMAX, C=C)
    p = apply(apply_steps(p0, ONLINE), "online_agg", index="co", **{"def": "Y"})
    assert [d.name for d in p.defs] == ["Y"]
    f = p.defs[0].body
    assert isinstance(f, Fold) and f.state == ("m", "l") and f.init[1] == Const(0.0)
    assert numeric_error(p0, p, {"R": 5}) <= 1e-12


def test_online_agg_softmax_element_refuses_by_name():
    p = apply_steps(_spec(SOFTMAX), ONLINE[:1])
    assert "not a tiled sum" in str(check_fails(p, "online_agg", index="c", **{"def": "Y"}))
    p = apply_steps(_spec(SOFTMAX), ONLINE)
    assert "not the outer tile index" in str(check_fails(p, "online_agg", index="ci", **{"def": "Y"}))


def _mutated(monkeypatch, rule: str, change) -> None:
    r = RULES[rule]
    orig = type(r).rewrite

    def bad(self, prog, p, facts):
        new = orig(self, prog, p, facts)
        d = new.def_named(p.def_)
        return new.with_def(replace(d, body=change(d.body, facts)))

    monkeypatch.setattr(r, "rewrite", types.MethodType(bad, r))


def test_mutations_of_the_row_rules_fail_the_numeric_check(monkeypatch):
    p0 = _spec(LN, extra=W)
    # fuse_let binding the producer at the wrong row (row 0 for every row)
    def wrong_row(body, facts):
        from compiler.ir import subst_index

        return Let(replace(body.bind, value=subst_index(body.bind.value, "r", Aff.lit(0))), body.body)

    with monkeypatch.context() as m:
        _mutated(m, "fuse_let", wrong_row)
        p = apply(p0, "fuse_let", producer="var", **{"def": "Y"})
        assert numeric_error(p0, p, {"R": 4}) > 1e-3
    # cache_row copying the neighbouring column
    def shifted(body, facts):
        b = body.bind
        read = b.value
        return Let(replace(b, value=Read(read.tensor, read.idx[:-1] + (read.idx[-1] + 1,))), body.body)

    with monkeypatch.context() as m:
        _mutated(m, "cache_row", shifted)
        p = apply_steps(p0, [{"rule": "fuse_let", "producer": "var", "def": "Y"},
                             {"rule": "fuse_let", "producer": "mean", "def": "Y"}])
        assert numeric_error(p0, apply(p, "cache_row", tensor="X", **{"def": "Y"}), {"R": 4}) > 1e-3
    # the softmax-element fold without the l rescale
    s0 = _spec(SOFTMAX, C=12)

    def no_rescale(f, facts):
        l_upd = f.update[1]
        return replace(f, update=(f.update[0], Bin("+", l_upd.a.a, l_upd.b)))

    with monkeypatch.context() as m:
        _mutated(m, "online_agg", no_rescale)
        p = apply(apply_steps(s0, ONLINE), "online_agg", index="co", **{"def": "Y"})
        assert numeric_error(s0, p, {"R": 5}) > 1e-3


# --------------------------------------------------------------------------- the printer refuses


def _kernel(name: str = "rmsnorm", C: int = 64, threads: int = 32) -> Kernel:
    spec = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    spec["sizes"]["C"] = C
    for st in spec["schedule"]:
        if st.get("to") == "thread":
            st["count"] = threads
    d = derive(parse_spec_text(yaml.safe_dump(spec, sort_keys=False)), "t", check=False)
    return lower(d.programs[-1], "t")


def test_rowwise_prints_the_kernel_ir_it_is_given():
    ks, _, plan = rowwise.render(_kernel(), ())
    assert plan.vec == 8 and plan.sweeps == 1 and plan.reductions == ("sum over k",)
    assert "block_sum<1>" in ks.source and "rsqrtf" in ks.source


@pytest.mark.parametrize("mutation,words", [
    ("store reads the next column", "not at the column c"),
    ("reduction over half the row", "spans neither the row"),
    ("store guarded", "the store is guarded"),
    ("row staged in shared memory", "at level shared"),
    ("scalar with a column dimension", "neither a per-row scalar"),
])
def test_rowwise_refuses_mutated_kernel_irs_by_name(mutation, words):
    k = _kernel()
    body = list(k.body)
    stage = next(s for s in body if isinstance(s, Stage))
    comp = next(s for s in body if isinstance(s, Compute))
    if mutation == "store reads the next column":
        from compiler.ir import replace_reads

        v = replace_reads(k.store.value, stage.buf.name, lambda r: Read(r.tensor, (r.idx[0] + 1,)))
        k = replace(k, store=replace(k.store, value=v))
    elif mutation == "reduction over half the row":
        from compiler.ir import Ext, walk

        red = next(x for x in walk(comp.value) if isinstance(x, Reduce))
        from compiler.rules.base import replace_node

        half = replace(red, ext=Ext.of(32))
        body[body.index(comp)] = replace(comp, value=replace_node(comp.value, red, half))
        k = replace(k, body=tuple(body))
    elif mutation == "store guarded":
        from compiler.ir import Cond

        k = replace(k, store=replace(k.store, guard=(Cond(Aff.of("c"), "<", Aff.lit(63)),)))
    elif mutation == "row staged in shared memory":
        body[body.index(stage)] = replace(stage, buf=replace(stage.buf, level="shared"))
        k = replace(k, body=tuple(body))
    else:
        body[body.index(comp)] = replace(comp, buf=replace(comp.buf, dims=(("c9", 64),)))
        k = replace(k, body=tuple(body))
    with pytest.raises(UnsupportedMapping, match=words):
        rowwise.render(k, ())


# --------------------------------------------------------------------------- obligations (coqc)

needs_coqc = pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")


@pytest.fixture(scope="module")
def coq_lib(tmp_path_factory):
    from proofs_ci import coqlib

    return coqlib.build_library(out_dir=tmp_path_factory.mktemp("coqlib") / "coq")


def _small(name: str) -> Path:
    return ROOT / "examples" / f"{name}.yaml"


def _obligations(d, tmp: Path, lib: Path, every: bool = False) -> dict[int, bool]:
    from compiler import obligations
    from proofs_ci import coqlib

    obligations.write_obligations(d, tmp / "proofs")
    index = json.loads((tmp / "proofs" / "index.json").read_text())["steps"]
    return {e["step"]: (e["status"] != "not generated"
                        and coqlib.check_obligation(tmp / "proofs" / e["files"]["coq"], lib).returncode == 0)
            for e in index if every or e["rule"] in ("fuse_let", "cache_row", "online_agg")}


def _small_spec(name: str, tmp: Path) -> Path:
    spec = yaml.safe_load(_small(name).read_text())
    spec["sizes"]["C"] = 64
    for st in spec["schedule"]:
        if st.get("to") == "thread":
            st["count"] = 32
        if st.get("rule") == "tile":
            st["size"] = 16
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@needs_coqc
@pytest.mark.parametrize("name", ["softmax_two_pass", "softmax_online"])
def test_softmax_schedules_pass_coqc_at_a_small_row(tmp_path, coq_lib, name):
    """Every obligation of the softmax schedules at C = 64 as well (tests/test_obligations.py
    checks the examples' own 8192)."""
    path = _small_spec(name, tmp_path)
    ok = _obligations(derive(load_spec_file(path), str(path), seed=1), tmp_path, coq_lib, every=True)
    assert len(ok) >= 5 and all(ok.values()), ok


@needs_coqc
def test_online_softmax_obligation_fails_without_the_l_rescale(monkeypatch, tmp_path, coq_lib):
    def no_rescale(f, facts):
        l_upd = f.update[1]
        return replace(f, update=(f.update[0], Bin("+", l_upd.a.a, l_upd.b)))

    _mutated(monkeypatch, "online_agg", no_rescale)
    path = _small_spec("softmax_online", tmp_path)
    d = derive(load_spec_file(path), str(path), check=False, upto=3)
    ok = _obligations(d, tmp_path, coq_lib)
    assert ok == {3: False}


@needs_coqc
def test_fuse_let_obligation_fails_at_the_wrong_row(monkeypatch, tmp_path, coq_lib):
    def wrong_row(body, facts):
        from compiler.ir import subst_index

        return Let(replace(body.bind, value=subst_index(body.bind.value, "r", Aff.lit(0))), body.body)

    _mutated(monkeypatch, "fuse_let", wrong_row)
    path = _small_spec("rmsnorm", tmp_path)
    d = derive(load_spec_file(path), str(path), check=False, upto=1)
    assert _obligations(d, tmp_path, coq_lib) == {1: False}


def test_large_nat_literals_reach_coq_in_small_numerals():
    """From 5000 on Coq reads a numeral as an opaque Nat.of_num_uint term lia cannot use; the
    exporter writes 8192 as 2 * 4096 (value kept, every literal small)."""
    from compiler.obligations_terms import N, render

    for n in (0, 64, 4999, 5000, 8192, 8200, 4096 * 4096 + 7):
        text = render(N(n), "coq")
        assert eval(text) == n and all(int(t) < 5000 for t in text.replace("(", " ").replace(")", " ").split()
                                       if t.isdigit())
        assert render(N(n), "lean") == str(n)
