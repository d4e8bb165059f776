"""Mutations that only a sound model of −∞ (and an obligation covering the frame) catch:
each corrupted rewrite must make coqc FAIL on exactly the corrupted step's obligation, while
the other steps keep passing.

- ONLINE-AGG whose running max is never updated (m stays −∞: exp(s − (−∞)) is not a value);
- ONLINE-AGG with the l rescale dropped;
- ONLINE-AGG rescaling l and acc against the stale max (rescale(m, m) instead of
  rescale(m, m_new)).
"""
from __future__ import annotations

import json
import shutil
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from compiler import obligations
from compiler.derive import derive
from compiler.ir import Bin, Fold, Read
from compiler.rules import RULES
from compiler.spec import load_spec_file

pytestmark = pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")

ROOT = Path(__file__).resolve().parents[1]
FLASH = ROOT / "examples" / "flash_attention.yaml"
ONLINE_STEP = 6  # flash_attention.yaml: step 6 is online_agg


@pytest.fixture(scope="module")
def coq_lib(tmp_path_factory):
    from proofs_ci import coqlib

    return coqlib.build_library(out_dir=tmp_path_factory.mktemp("coqlib") / "coq")


def _check_steps(d, tmp: Path, lib: Path, steps: set[int]) -> dict[int, bool]:
    from proofs_ci import coqlib

    obligations.write_obligations(d, tmp / "proofs")
    index = {e["step"]: e for e in json.loads((tmp / "proofs" / "index.json").read_text())["steps"]}
    for s in steps:
        assert index[s]["status"] != "not generated", index[s]
    paths = {s: tmp / "proofs" / index[s]["files"]["coq"] for s in steps}
    with ThreadPoolExecutor(2) as pool:
        ok = dict(zip(paths, pool.map(lambda p: coqlib.check_obligation(p, lib).returncode == 0,
                                      paths.values())))
    return ok


def _mutate_fold(monkeypatch, change) -> None:
    oa = RULES["online_agg"]
    orig = type(oa).rewrite

    def bad(self, prog, p, facts):
        new = orig(self, prog, p, facts)
        dd = new.def_named(p.def_)
        f: Fold = dd.body
        assert isinstance(f, Fold) and len(f.state) == 3
        return new.with_def(replace(dd, body=change(f, facts)))

    monkeypatch.setattr(oa, "rewrite", types.MethodType(bad, oa))


def _derive_flash():
    return derive(load_spec_file(FLASH), str(FLASH), check=False, upto=ONLINE_STEP)


def test_online_agg_correct_passes(tmp_path, coq_lib):
    ok = _check_steps(_derive_flash(), tmp_path, coq_lib, {ONLINE_STEP})
    assert ok[ONLINE_STEP]


def test_online_agg_never_updated_max_fails(monkeypatch, tmp_path, coq_lib):
    """m_new := m: the running max stays −∞, every weight is exp(s − (−∞)).  The float64
    check sees NaN; the old ring model of −∞ proved it."""
    def never(f: Fold, facts) -> Fold:
        m = f.state[0]
        binds = tuple(replace(b, value=Read(m, ())) if b.name == facts["m_new"] else b
                      for b in f.binds)
        return replace(f, binds=binds)

    _mutate_fold(monkeypatch, never)
    ok = _check_steps(_derive_flash(), tmp_path, coq_lib, {ONLINE_STEP - 1, ONLINE_STEP})
    assert ok[ONLINE_STEP - 1], "the step before is correct and must pass"
    assert not ok[ONLINE_STEP], "a running max that is never updated must not be provable"


def test_online_agg_l_rescale_dropped_fails(monkeypatch, tmp_path, coq_lib):
    """l := l + sum(P_t): the denominator is not rescaled when the max grows."""
    def drop(f: Fold, facts) -> Fold:
        l_upd = f.update[1]
        assert isinstance(l_upd, Bin) and isinstance(l_upd.a, Bin) and l_upd.a.op == "*"
        return replace(f, update=(f.update[0], Bin("+", l_upd.a.a, l_upd.b), f.update[2]))

    _mutate_fold(monkeypatch, drop)
    ok = _check_steps(_derive_flash(), tmp_path, coq_lib, {ONLINE_STEP})
    assert not ok[ONLINE_STEP]


def test_online_agg_stale_rescale_fails(monkeypatch, tmp_path, coq_lib):
    """l and acc rescaled by rescale(m, m) (the stale max) instead of rescale(m, m_new)."""
    def stale(f: Fold, facts) -> Fold:
        m = f.state[0]
        stale_alpha = Bin("rescale", Read(m, ()), Read(m, ()))
        upd = [f.update[0]]
        for u in f.update[1:]:
            assert isinstance(u, Bin) and isinstance(u.a, Bin) and u.a.b.op == "rescale"
            upd.append(Bin("+", Bin("*", u.a.a, stale_alpha), u.b))
        return replace(f, update=tuple(upd))

    _mutate_fold(monkeypatch, stale)
    ok = _check_steps(_derive_flash(), tmp_path, coq_lib, {ONLINE_STEP})
    assert not ok[ONLINE_STEP]


# --------------------------------------------------------------------------- the frame

GEMM = ROOT / "examples" / "gemm.yaml"
GEMM_MMA_STEP = 12  # gemm.yaml: the last step maps the k-sum to mma.sync


def test_map_mma_dropping_the_store_guard_fails(monkeypatch, tmp_path, coq_lib):
    """MAP-MMA that also drops the definition's store guard: its site is still correct, so only
    the frame theorem (guard, store, context) can catch it."""
    mma = RULES["map_mma"]
    orig = type(mma).rewrite

    def bad(self, prog, p, facts):
        new = orig(self, prog, p, facts)
        dd = new.def_named(p.def_)
        assert dd.guard, "gemm's tiled store must be guarded"
        return new.with_def(replace(dd, guard=()))

    monkeypatch.setattr(mma, "rewrite", types.MethodType(bad, mma))
    d = derive(load_spec_file(GEMM), str(GEMM), check=False, upto=GEMM_MMA_STEP)
    assert d.steps[-1].kind == "MAP-MMA"
    ok = _check_steps(d, tmp_path, coq_lib, {GEMM_MMA_STEP})
    assert not ok[GEMM_MMA_STEP]


def test_tile_editing_another_definition_fails(monkeypatch, tmp_path, coq_lib):
    """TILE of L (flash_attention step 5) that also changes M's mask: only the theorem that
    every other definition is unchanged (`_others`) can catch it."""
    tile = RULES["tile"]
    orig = type(tile).rewrite

    def bad(self, prog, p, facts):
        new = orig(self, prog, p, facts)
        if p.def_ != "L":
            return new
        m = new.def_named("M")
        red = m.body
        assert red.op == "max"
        return new.with_def(replace(m, body=replace(red, body=red.body.then)))

    monkeypatch.setattr(tile, "rewrite", types.MethodType(bad, tile))
    d = derive(load_spec_file(FLASH), str(FLASH), check=False, upto=5)
    ok = _check_steps(d, tmp_path, coq_lib, {5})
    assert not ok[5]


def test_step_changing_the_output_fails(monkeypatch, tmp_path, coq_lib):
    """A CACHE step that also renames the program's output: the frame refuses to export it and
    the step's .v fails coqc on purpose."""
    cache = RULES["cache"]
    orig = type(cache).rewrite

    def bad(self, prog, p, facts):
        new = orig(self, prog, p, facts)
        return replace(new, output=next(d.name for d in new.defs if d.name != new.output)
                       if len(new.defs) > 1 else new.inputs[0][0])

    monkeypatch.setattr(cache, "rewrite", types.MethodType(bad, cache))
    d = derive(load_spec_file(GEMM), str(GEMM), check=False, upto=5)
    assert d.steps[-1].kind == "CACHE"
    obligations.write_obligations(d, tmp_path / "proofs")
    index = json.loads((tmp_path / "proofs" / "index.json").read_text())["steps"]
    assert index[-1]["status"] == "not generated" and "output" in index[-1]["error"]
    from proofs_ci import coqlib

    assert coqlib.check_obligation(tmp_path / "proofs" / index[-1]["files"]["coq"], coq_lib).returncode != 0


# --------------------------------------------------------------------------- SPLIT-KV's merge

MERGE_L = """    (add (mul (st_l a) (rescale (st_m a) (max (st_m a) (st_m b))))
         (mul (st_l b) (rescale (st_m b) (max (st_m a) (st_m b)))))"""


SKEY = "Definition skey (S t k j : nat) : nat := (S * (j / t) + k) * t + j mod t."


@pytest.mark.parametrize("name,old,new", [
    # the second range's l is not rescaled to the merged max
    ("l2_not_rescaled", MERGE_L, """    (add (mul (st_l a) (rescale (st_m a) (max (st_m a) (st_m b))))
         (st_l b))"""),
    # the first range's l is not rescaled
    ("l1_not_rescaled", MERGE_L, """    (add (st_l a)
         (mul (st_l b) (rescale (st_m b) (max (st_m a) (st_m b)))))"""),
    # rescaled against the range's own max instead of the merged one
    ("stale_max", MERGE_L, """    (add (mul (st_l a) (rescale (st_m a) (st_m a)))
         (mul (st_l b) (rescale (st_m b) (st_m b))))"""),
    # the strided assignment without the split's offset: every split folds the same tiles
    ("split_offset_dropped", SKEY, SKEY.replace(" + k) * t", ") * t")),
])
def test_split_kv_merge_dropping_a_rescale_fails(tmp_path, name, old, new):
    """SPLIT-KV's merge of partial (m, l, acc) states with a rescale dropped (or the tiles
    assigned wrongly): the merge theorems no longer compile."""
    from proofs_ci import coqlib

    lib = coqlib.copy_sources(ROOT / "proofs_ci" / "coq", tmp_path / "coq")
    merge = lib / "Rules" / "OnlineMerge.v"
    text = merge.read_text()
    assert old in text, "the mutated definition moved: update the mutation"
    merge.write_text(text.replace(old, new, 1))
    with pytest.raises(coqlib.CoqError) as ei:
        coqlib.build_library(lib)
    assert "OnlineMerge.v" in str(ei.value)


DECODE = ROOT / "examples" / "decode_splitkv.yaml"
SPLIT_KV_STEP = 7  # decode_splitkv.yaml: step 7 is split_kv


def _derive_decode():
    return derive(load_spec_file(DECODE), str(DECODE), check=False, upto=SPLIT_KV_STEP)


def test_split_kv_combine_passes(tmp_path, coq_lib):
    ok = _check_steps(_derive_decode(), tmp_path, coq_lib, {SPLIT_KV_STEP})
    assert ok[SPLIT_KV_STEP]


@pytest.mark.parametrize("mutation", ["den_not_rescaled", "num_not_rescaled", "wrong_split"])
def test_split_kv_combine_mutations_fail(monkeypatch, tmp_path, coq_lib, mutation):
    """The combine with the denominator's or the numerator's rescale dropped, or reading the
    partial accumulator of split 0 for every split: the step's obligation (the combine equals
    the merge of the partial states, online_merge_global) fails coqc."""
    from compiler.ir import Aff, subst_index

    rule = RULES["split_kv"]
    orig = type(rule).rewrite

    def bad(self, prog, p, facts):
        new = orig(self, prog, p, facts)
        d = new.def_named(p.def_)
        num, den = d.body.body.a, d.body.body.b
        if mutation == "den_not_rescaled":
            den = replace(den, body=den.body.a)
        elif mutation == "num_not_rescaled":
            num = replace(num, body=num.body.a)
        else:
            num = replace(num, body=Bin("*", subst_index(num.body.a, num.var, Aff.lit(0)), num.body.b))
        return new.with_def(replace(d, body=replace(d.body, body=Bin("/", num, den))))

    # on the class: an instance attribute would outlive monkeypatch's undo (it restores the bound
    # method as an attribute of the instance, which then shadows later patches of the class)
    monkeypatch.setattr(type(rule), "rewrite", bad)
    ok = _check_steps(_derive_decode(), tmp_path, coq_lib, {SPLIT_KV_STEP - 1, SPLIT_KV_STEP})
    assert ok[SPLIT_KV_STEP - 1], "the step before is correct and must pass"
    assert not ok[SPLIT_KV_STEP]
