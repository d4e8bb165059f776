"""SPLIT-KV (flash-decoding): the fold's key tiles over S splits, partial (m, l, acc), a combine.

Property: the split program equals float64 attention for split factors that leave empty splits
(more splits than tiles), fully masked splits (a window that only the last tile reaches), a row
with no live key, Nk = 1 and partial last tiles.  Negative: the preconditions refuse by name.
Mutation: a combine or a partial fold that is wrong fails the step's numeric check (the coqc
mutations of the merge and of the combine are in test_obligations_mutation.py).
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from compiler.derive import derive
from compiler.errors import DerivationError, StepInputError
from compiler.interp import run_program
from compiler.ir import Bin, Fold, Read, tail_fold
from compiler.rules import RULES
from compiler.spec import load_spec_file, parse_spec_text

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "examples" / "decode_splitkv.yaml"
SPLIT_STEP = 7  # decode_splitkv.yaml: step 7 is split_kv


def decode_text(splits: int = 8, mask: str = "", sizes: str = "") -> str:
    """The example with `splits` splits and key tiles of 64 (the cases below count tiles of 64)."""
    text = DECODE.read_text()
    text = re.sub(r"splits: \d+}", f"splits: {splits}}}", text)
    text = re.sub(r"(index: j_?, size: )\d+", r"\g<1>64", text)
    if mask:
        text = text.replace('softmax(j: S[b, h, i, j])', f'softmax(j | {mask}: S[b, h, i, j])')
    if sizes:
        text = re.sub(r"^sizes: .*$", f"sizes: {sizes}", text, count=1, flags=re.M)
    return text


def attention(q, k, v, live) -> np.ndarray:
    s = np.einsum("bhie,bhje->bhij", q, k) / np.sqrt(q.shape[-1])
    s = np.where(live[None, None, None, :], s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    p = np.exp(s - top)
    den = p.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", p, v) / np.where(den > 0, den, 1.0)


def run_split(text: str, sizes: dict[str, int], seed: int = 0):
    prog = derive(parse_spec_text(text), check=False, upto=SPLIT_STEP).final
    rng = np.random.default_rng(seed)
    B, H, Nq, Nk, D = (sizes[n] for n in ("B", "H", "Nq", "Nk", "D"))
    ins = {"Q": rng.standard_normal((B, H, Nq, D)), "K": 3 * rng.standard_normal((B, H, Nk, D)),
           "V": rng.standard_normal((B, H, Nk, D))}
    return prog, ins, run_program(prog, sizes, ins)


@pytest.mark.parametrize("splits", [2, 3, 8, 16])
@pytest.mark.parametrize("nk", [1, 63, 64, 65, 300])
def test_split_program_is_attention(splits, nk):
    """Every split factor, tails, Nk = 1, more splits than tiles (empty splits: (-inf, 0, 0))."""
    sizes = {"B": 2, "H": 1, "Nq": 1, "Nk": nk, "D": 128}
    prog, ins, out = run_split(decode_text(splits), sizes)
    want = attention(ins["Q"], ins["K"], ins["V"], np.ones(nk, bool))
    assert np.allclose(out["O"], want, rtol=1e-12, atol=1e-12)
    tiles = -(-nk // 64)
    m = out["O_part_m"]
    assert m.shape == (2, 1, 1, splits)
    assert np.all(np.isneginf(m[..., tiles:])) and np.all(out["O_part_l"][..., tiles:] == 0)
    assert np.all(np.isfinite(m[..., :tiles]))


def test_fully_masked_splits_and_a_row_with_no_live_key():
    """A window over the last W keys: every split but the one holding the last tile is fully
    masked (m = -inf, l = 0); W = 0 masks the whole row (the fold's 0 / 0 = 0)."""
    text = decode_text(4, mask="j + W >= Nk", sizes="{B: dynamic, H: dynamic, Nq: dynamic, Nk: dynamic, D: 128, W: dynamic}")
    for w, live_split in ((10, 4 % 4), (70, None), (0, None)):
        sizes = {"B": 1, "H": 2, "Nq": 1, "Nk": 300, "D": 128, "W": w}
        _, ins, out = run_split(text, sizes)
        live = np.arange(300) + w >= 300
        assert np.allclose(out["O"], attention(ins["Q"], ins["K"], ins["V"], live), rtol=1e-12, atol=1e-12)
        m = out["O_part_m"]
        if w == 10:  # keys 290..299: tile 4, split 0 of 4
            assert np.all(np.isfinite(m[..., live_split])) and np.all(np.isneginf(np.delete(m, live_split, -1)))
        if w == 0:
            assert np.all(out["O"] == 0) and np.all(np.isneginf(m))


def test_the_example_derives_and_checks_every_step():
    d = derive(load_spec_file(DECODE), str(DECODE), seed=5)
    split = d.steps[SPLIT_STEP - 1]
    assert split.rule == "split_kv" and split.numeric["passed"]
    assert [x.name for x in d.final.defs] == ["O_part", "O"]
    part = d.final.def_named("O_part")
    assert [a.name for a in part.also] == ["O_part_m", "O_part_l"]
    grid = [(lp.var, lp.mapping.axis) for lp in part.loops if lp.mapping and lp.mapping.level == "grid"]
    assert grid == [("b", "z"), ("h", "y"), ("ks", "x"), ("io", "x")]  # splits and query tiles share grid.x


def test_the_combine_is_a_program_with_one_max():
    prog = derive(parse_spec_text(decode_text(3)), check=False, upto=SPLIT_STEP).final
    from compiler.printer import show_def

    text = show_def(prog.def_named("O"))
    assert "max(ks_max < 3: O_part_m[b, h, i, ks_max])" in text
    assert "rescale(O_part_m[b, h, i, ks_acc], mx)" in text and "rescale(O_part_m[b, h, i, ks_sum], mx)" in text
    fold = tail_fold(prog.def_named("O_part").body)
    assert str(fold.ext) == "ceil((Nk - 64*ks)/192)"


# --------------------------------------------------------------------------- preconditions

def _upto(step: int, text: str | None = None):
    return derive(parse_spec_text(text or decode_text()), check=False, upto=step).final


def _check(prog, **params):
    r = RULES["split_kv"]
    return r.check(prog, r.parse_params(params))


def test_refused_before_online_agg():
    with pytest.raises(DerivationError, match="not a fold over jo"):
        _check(_upto(5), **{"def": "O", "index": "jo", "splits": 4})


def test_refused_with_one_split():
    with pytest.raises(DerivationError, match="at least 2"):
        _check(_upto(6), **{"def": "O", "index": "jo", "splits": 1})


def test_refused_on_a_tiled_or_mapped_definition():
    prog = _upto(6)
    from tests.rulekit import apply

    tiled = apply(prog, "tile", **{"def": "O", "index": "i", "size": 16})
    with pytest.raises(DerivationError, match="not a plain statement"):
        _check(tiled, **{"def": "O", "index": "jo", "splits": 4})


def test_refused_after_fold_stat_and_on_another_fold_index():
    prog = _upto(6)
    fold = tail_fold(prog.def_named("O").body)
    with pytest.raises(DerivationError, match="not a fold over ji"):
        _check(prog, **{"def": "O", "index": "ji", "splits": 4})
    d = prog.def_named("O")
    with_stat = prog.with_def(replace(d, body=replace(fold, also=(Read("m", ()),))))
    with pytest.raises(DerivationError, match="result is not acc / l alone"):
        _check(with_stat, **{"def": "O", "index": "jo", "splits": 4})


def test_a_used_name_is_an_input_error():
    with pytest.raises(StepInputError, match="already used"):
        _check(_upto(6), **{"def": "O", "index": "jo", "splits": 4, "split_index": "b"})
    with pytest.raises(StepInputError, match="already used"):
        _check(_upto(6), **{"def": "O", "index": "jo", "splits": 4, "name": "K"})
    with pytest.raises(DerivationError, match="reserved"):
        _check(_upto(6), **{"def": "O", "index": "jo", "splits": 4, "name": "class"})


# --------------------------------------------------------------------------- mutations

def _mutate(monkeypatch, change) -> None:
    rule = RULES["split_kv"]
    orig = type(rule).rewrite

    def bad(self, prog, p, facts):
        return change(orig(self, prog, p, facts), p)

    monkeypatch.setattr(type(rule), "rewrite", bad)


def _derive_split(text: str | None = None):
    return derive(parse_spec_text(text or decode_text()), check=True, upto=SPLIT_STEP, seed=11)


def test_mutation_combine_without_rescale_fails(monkeypatch):
    """The denominator's l_k added without e^(m_k - m)."""
    def drop(prog, p):
        d = prog.def_named(p.def_)
        num, den = d.body.body.a, d.body.body.b
        den = replace(den, body=den.body.a)
        return prog.with_def(replace(d, body=replace(d.body, body=Bin("/", num, den))))

    _mutate(monkeypatch, drop)
    with pytest.raises(DerivationError, match="numeric check failed"):
        _derive_split()


def test_mutation_partial_fold_forgetting_the_split_offset_fails(monkeypatch):
    """Every split folds tiles S*jo (the + ks forgotten): the other tiles are never read."""
    from compiler.ir import Aff, subst_index

    def no_offset(prog, p):
        d = prog.def_named(f"{p.def_}_part")
        return prog.with_def(replace(d, body=subst_index(d.body, p.split_index, Aff.lit(0))))

    _mutate(monkeypatch, no_offset)
    with pytest.raises(DerivationError, match="numeric check failed"):
        _derive_split()


def test_mutation_partial_state_not_rescaled_fails(monkeypatch):
    """The partial acc written without its fold's rescale (acc := acc + …): caught with 2 splits
    (3 tiles in split 0); with 8 splits over 5 tiles no split folds two tiles and the rescale
    is never exercised."""
    def no_rescale(prog, p):
        d = prog.def_named(f"{p.def_}_part")
        fold: Fold = tail_fold(d.body)
        acc = fold.update[2]
        new = replace(fold, update=(*fold.update[:2], Bin("+", acc.a.a, acc.b)))
        return prog.with_def(replace(d, body=new if d.body is fold else d.body))

    _mutate(monkeypatch, no_rescale)
    with pytest.raises(DerivationError, match="numeric check failed"):
        _derive_split(decode_text(2))


def test_gqa_decode_reads_the_shared_kv_head():
    """32 query heads over 8 K / V heads: the grid is (split and query tile, K / V head, batch),
    no query head on it; the G query heads of a K / V head are packed with the query rows into
    the mma tile's rows (g, ii), so one block reads each K / V tile once for the whole group."""
    path = ROOT / "examples" / "decode_splitkv_gqa.yaml"
    d = derive(load_spec_file(path), str(path), seed=2)
    assert all(s.numeric["passed"] for s in d.steps)
    part = d.final.def_named("O_part")
    grid = [lp.var for lp in part.loops if lp.mapping and lp.mapping.level == "grid"]
    assert grid == ["b", "hk", "ks", "io"]
    assert [lp.var for lp in part.loops if lp.mapping and lp.mapping.level == "warp"] == ["g", "ii"]
    assert [s.facts.get("rows") for s in d.steps if s.rule == "map_mma"] == [["g", "ii"], ["g", "ii"]]
    prog = derive(load_spec_file(path), str(path), check=False, upto=SPLIT_STEP).final
    sizes = {"B": 1, "HK": 2, "G": 4, "Nq": 1, "Nk": 200, "D": 128}
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 2, 4, 1, 128))
    k, v = rng.standard_normal((1, 2, 200, 128)), rng.standard_normal((1, 2, 200, 128))
    out = run_program(prog, sizes, {"Q": q, "K": k, "V": v})["O"]
    for g in range(4):
        want = attention(q[:, :, g], k, v, np.ones(200, bool))
        assert np.allclose(out[:, :, g], want, rtol=1e-12, atol=1e-12)
