"""MASK-DATA (compiler/rules/skip_data_span.py): the key tiles of document-masked attention bounded by
a span derived from the document ids themselves.

- the span (compiler.ir_index.DataSpan) as both interpreters evaluate it, against its definition
  written out in loops, on generated document layouts (random lengths, length 1, unsorted ids);
- the rule preserves every value (float64 interpreter, before / after, and the kernel IR's
  interpreter), fully masked rows included (`j < i`: a document's first token sees nothing);
- the span is narrow where documents are short (the skip is real), and covers everything when
  ids are interleaved;
- refusals, one line each; mutations of the rule (a half row box, a doubled tile) caught by the
  interpreter, of the printed prologue (span start / end off by one tile) by the CPU emulation of
  both fold mappings at tails; the printed kernels against float64 at N = 300 (three key tiles);
- coqc on the rule's obligation (span_cover_at), a later step's obligation carrying the span and
  the final program's safety obligation (exp sites under the span).
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from codegen.kir.interp import run_kernel
from codegen.kir.lower import lower
from compiler.derive import derive
from compiler.errors import DerivationError
from compiler.interp import _Env, run_program
from compiler.ir import DataSpan, Fold, walk
from compiler.spec import parse_spec_text
from compiler.rules import RULES

from tests.test_int_tensors import (
    ATTENTION, EXAMPLES, _attention_reference, _attn_reference, _attn_run, _mutated, _printed, _qkv, _spec_text, MASKS,
)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.xdist_group("document_mask")
ROOT = Path(__file__).resolve().parents[1]
T = 4  # the tiles of the small derivation
MASK = "j < i && Doc[b, i] == Doc[b, j]"  # a document's first token sees nothing (fully masked row)
STEPS = ("{rule: split_softmax, def: P}", "{rule: fuse, producer: P}", "{rule: assoc, def: O, index: j}",
         f"{{rule: tile, def: O, index: j, size: {T}}}",
         f"{{rule: tile, def: L, index: j_, size: {T}, outer: jo_l, inner: ji_l}}",
         "{rule: online_agg, def: O, index: jo}", f"{{rule: tile, def: O, index: i, size: {T}}}",
         "{rule: skip_data_span, def: O, index: jo}",
         "{rule: parallel, def: O, index: b, to: grid.y}", "{rule: parallel, def: O, index: io, to: grid.x}")
RULE_STEP = STEPS.index("{rule: skip_data_span, def: O, index: jo}")


def _text(mask: str = MASK, steps: tuple[str, ...] = STEPS) -> str:
    return _spec_text(ATTENTION, MASK=mask) + "check_sizes: {B: 2, N: 19}\nschedule:\n" + "".join(
        f"  - {s}\n" for s in steps)


@pytest.fixture(scope="module")
def derivation():
    return derive(parse_spec_text(_text(), "<doc>"), "<doc>", seed=1)


def _span_of(prog) -> DataSpan:
    return next(c for x in walk(prog.def_named("O").body) if hasattr(x, "conds")
                for c in x.conds if isinstance(c, DataSpan))


def _layout(lengths: list[int], shuffle: bool, seed: int) -> np.ndarray:
    ids = np.repeat(np.arange(len(lengths)), lengths).astype(np.float64)
    if shuffle:  # interleaved documents: ids in any order
        ids = np.random.default_rng(seed).permutation(ids)
    return ids[None, :]


def _span_by_definition(doc: np.ndarray, io: int, jo: int) -> bool:
    n = doc.shape[-1]
    rows = doc[0, io * T:min(n, io * T + T)]
    hits = [p for p in range(n) if rows.min() <= doc[0, p] <= rows.max()]
    return bool(hits) and hits[0] // T <= jo < hits[-1] // T + 1


layouts = st.tuples(st.lists(st.integers(1, 6), min_size=1, max_size=10), st.booleans(), st.integers(0, 99))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layouts)
def test_the_span_is_its_definition(derivation, layout):
    doc = _layout(*layout)
    n = doc.shape[-1]
    span = _span_of(derivation.programs[RULE_STEP + 1])
    env = _Env({"B": 1, "N": n}, {"Doc": doc})
    tiles = -(-n // T)
    for name, count in (("b", 1), ("io", tiles), ("jo", tiles)):
        env.push(name, count)
    got = np.broadcast_to(env.span(span), (1, tiles, tiles))
    want = np.array([[[_span_by_definition(doc, io, jo) for jo in range(tiles)] for io in range(tiles)]])
    assert (got == want).all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layouts)
def test_the_rule_keeps_every_value(derivation, layout):
    """Before / after the rule and the final kernel IR agree with the formula, fully masked rows (0)
    and documents of length 1 included."""
    doc = _layout(*layout)
    n = doc.shape[-1]
    rng = np.random.default_rng(n)
    S, V = rng.standard_normal((1, n, n)) * 3, rng.standard_normal((1, n))
    want = _attention_reference(S, V, doc, lambda i, j, di, dj: (j < i) & (di == dj))
    tensors, sizes = {"S": S, "V": V, "Doc": doc}, {"B": 1, "N": n}
    for prog in (derivation.programs[RULE_STEP], derivation.programs[RULE_STEP + 1]):
        assert np.abs(run_program(prog, sizes, tensors)["O"] - want).max() <= 1e-12
    kernel = run_kernel(lower(derivation.programs[-1], "doc"), sizes, tensors)
    assert np.abs(kernel - want).max() <= 1e-12


def test_the_span_is_narrow_for_short_documents(derivation):
    """Sorted ids of documents of at most 4 tokens (one tile): each query tile reaches at most the
    previous, its own and the next tile (the skip is real; causality, MASK's part, cuts the next);
    interleaved ids: every tile is reachable."""
    span = _span_of(derivation.programs[RULE_STEP + 1])
    n, tiles = 40, 10
    for doc, most in ((_layout([3, 1, 4, 1, 2] * 4 + [2] * 2, False, 0), 3), (_layout([10] * 4, True, 1), tiles)):
        env = _Env({"B": 1, "N": n}, {"Doc": doc})
        for name, count in (("b", 1), ("io", tiles), ("jo", tiles)):
            env.push(name, count)
        reach = np.broadcast_to(env.span(span), (1, tiles, tiles)).sum(axis=-1)
        assert reach.max() == most


def _refusal(text: str) -> str:
    with pytest.raises(DerivationError) as info:
        derive(parse_spec_text(text, "<doc>"), "<doc>", seed=1)
    line = str(info.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize("mask, steps, reason", [
    ("j < i", STEPS[:RULE_STEP + 1], "no data comparison guards every contribution"),
    ("j < i && Doc[b, i] < Doc[b, j]", STEPS[:RULE_STEP + 1], "is not an equality of two reads"),
    (MASK, STEPS[:RULE_STEP + 1] + STEPS[RULE_STEP:RULE_STEP + 1], "already bounded by a data span"),
    (MASK, STEPS[:RULE_STEP - 1] + STEPS[RULE_STEP:RULE_STEP + 1], "uses no fixed-extent row loop"),
    (MASK, STEPS[:5] + ("{rule: skip_data_span, def: O, index: jo}",), "is not an online-aggregation fold"),
])
def test_refusals_are_one_clear_line(mask, steps, reason):
    assert reason in _refusal(_text(mask, steps))


@pytest.mark.parametrize("mutation", ["half_rows", "double_tile"])
def test_a_wrong_span_is_caught_by_the_interpreter(derivation, monkeypatch, mutation):
    """A span over half the query rows (sound only for sorted ids) or over tiles twice too large
    changes the values: the interpreter sees it on interleaved ids."""
    rule = RULES["skip_data_span"]
    check = type(rule).check

    def bad_check(self, prog, p):
        facts = check(self, prog, p)
        sp = facts["span"]
        sp = replace(sp, rows=tuple((v, n // 2) for v, n in sp.rows)) if mutation == "half_rows" else \
            replace(sp, size=sp.size * 2)
        return {**facts, "span": sp}

    monkeypatch.setattr(type(rule), "check", bad_check)
    bad = derive(parse_spec_text(_text(steps=STEPS[:RULE_STEP + 1]), "<doc>"), "<doc>", check=False).programs[-1]
    n = 24
    doc = np.random.default_rng(7).integers(0, 3, (1, n)).astype(np.float64)
    rng = np.random.default_rng(8)
    S, V = rng.standard_normal((1, n, n)), rng.standard_normal((1, n))
    got = run_program(bad, {"B": 1, "N": n}, {"S": S, "V": V, "Doc": doc})["O"]
    want = _attention_reference(S, V, doc, lambda i, j, di, dj: (j < i) & (di == dj))
    assert np.abs(got - want).max() > 1e-3


# --------------------------------------------------------------------------- the printed kernels


@pytest.fixture(scope="module")
def kernels():
    return {instr: _printed(EXAMPLES / "pending" / name) for instr, name in
            (("wgmma", "attention_document_mask.yaml"), ("mma_sync", "attention_document_mask_mma.yaml"))}


def _docs(layout: str, n: int, rng) -> np.ndarray:
    if layout == "long":  # documents of 1 to 150 tokens: spans of one to three key tiles
        return _layout(list(rng.integers(1, 150, n)), False, 0)[:, :n]
    if layout == "interleaved":
        return rng.integers(0, 5, (1, n)).astype(np.float64)
    return _layout([1] * n if layout == "length_1" else [n], False, 0)


@pytest.mark.parametrize("instr", ["wgmma", "mma_sync"])
@pytest.mark.parametrize("layout", ["long", "length_1", "one_document", "interleaved"])
def test_the_kernels_skip_and_match_float64(kernels, instr, layout):
    printed = kernels[instr]
    assert "span_lo_" in printed.variants[-1].source.source
    rng = np.random.default_rng(len(layout))
    n = 300  # three key tiles, the last partial
    Q, K, V = _qkv(rng, 1, 1, n, 128 if instr == "wgmma" else 64)
    doc = _docs(layout, n, rng)
    assert np.abs(_attn_run(printed, Q, K, V, doc) - _attn_reference(Q, K, V, doc)).max() <= 2e-2


@pytest.mark.parametrize("instr", ["wgmma", "mma_sync"])
@pytest.mark.parametrize("old, new", [("span_lo_ = f_ / BN;", "span_lo_ = f_ / BN + 1;"), ("l_ / BN + 1;", "l_ / BN;")])
def test_a_span_off_by_one_tile_in_the_printer_is_caught(kernels, instr, old, new):
    bn = str(kernels[instr].plan.block_n)
    bad = _mutated(kernels[instr], old.replace("BN", bn), new.replace("BN", bn))
    rng = np.random.default_rng(11)
    n = 300
    Q, K, V = _qkv(rng, 1, 1, n, 128 if instr == "wgmma" else 64)
    doc = _docs("long", n, rng)
    assert np.abs(_attn_run(bad, Q, K, V, doc) - _attn_reference(Q, K, V, doc)).max() > 5e-2


# --------------------------------------------------------------------------- proofs


@pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")
def test_coqc_checks_the_rule_a_later_step_and_the_safety(derivation, tmp_path):
    from compiler.obligations import obligation_for
    from compiler.obligations_base import coq_text
    from proofs_ci.coqlib import build_library

    from compiler.obligations_safety import safety_obligation

    lib = build_library()
    obs = {k: obligation_for(derivation.steps[k], derivation.programs[k], derivation.programs[k + 1])
           for k in (RULE_STEP, len(STEPS) - 1)}
    obs["safety"] = safety_obligation(len(STEPS), derivation.programs[-1])  # exp sites under the span
    for k, ob in obs.items():
        text = coq_text(ob)
        assert "spanLo" in text and "spanHi" in text
        path = tmp_path / f"Step{k}.v"
        path.write_text(text)
        run = subprocess.run(["coqc", "-R", str(lib), "Derivc", path.name], cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
    assert obligation_for(derivation.steps[RULE_STEP], derivation.programs[RULE_STEP],
                          derivation.programs[RULE_STEP + 1]).theorem == "span_cover"
