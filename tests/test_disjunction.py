"""Masks with `||` (prefix-LM: j <= i || j < Prefix) without a GPU: the parser, the IR's Or, both
interpreters, the Coq / Lean export, the MASK rule's refusal, both fold mappings on the CPU
emulation, and bad input (exit 2, one line).  The key-tile range of a disjunction is checked by
brute force in tests/test_attention_variants.py (test_a_disjunction_*)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from compiler.interp import run_program
from compiler.ir import Aff, Cond, Or, Select, walk
from compiler.lower_spec import lower_spec
from compiler.obligations_terms import Exporter, render
from compiler.parse import ParseError, POr, parse_statement
from compiler.spec import parse_spec_text
from derivc_testing import assert_fails

EX = Path(__file__).resolve().parents[1] / "examples"
PREFIX_LM = (EX / "attention_prefix_lm.yaml").read_text()


def test_the_parser_reads_a_disjunction():
    st = parse_statement("P[i, j] = softmax(j | j <= i || j < Prefix: S[i, j])")
    (g,) = st.body.guard
    assert isinstance(g, POr) and len(g.parts) == 2
    st = parse_statement("X[i, j] = where(j > i || i == 3 || j < 2, 1, 0)")
    assert isinstance(st.body.conds[0], POr) and len(st.body.conds[0].parts) == 3
    with pytest.raises(ParseError, match="both && and \\|\\|"):
        parse_statement("P[i, j] = softmax(j | j <= i || j < 4 && j > 1: S[i, j])")


def test_the_ir_holds_one_or_conjunct():
    prog = lower_spec(parse_spec_text(PREFIX_LM))
    ors = [c for x in walk(prog.defs[1].body) for c in getattr(x, "mask", ()) if isinstance(c, Or)]
    assert ors and str(ors[0]) == "(j_ <= i || j_ < Prefix)"
    with pytest.raises(ValueError):
        Or((Cond(Aff.of("j"), "<", Aff.of("i")),))


def _attention(q, k, v, keep):
    s = np.einsum("bhie,bhje->bhij", q, k) / np.sqrt(q.shape[-1])
    s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def test_the_interpreter_evaluates_the_disjunction():
    prog = lower_spec(parse_spec_text(PREFIX_LM))
    rng = np.random.default_rng(0)
    n, prefix = 23, 7
    xs = {t: rng.standard_normal((1, 2, n, 128)) for t in ("Q", "K", "V")}
    got = run_program(prog, {"B": 1, "H": 2, "N": n, "D": 128, "Prefix": prefix}, xs)["O"]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    ref = _attention(xs["Q"], xs["K"], xs["V"], (j <= i) | (j < prefix))
    assert np.abs(got - ref).max() < 1e-12
    causal = _attention(xs["Q"], xs["K"], xs["V"], j <= i)
    assert np.abs(got - causal).max() > 1e-3  # the prefix is seen: a dropped disjunct is caught


def test_the_export_writes_orb_and_disjunction():
    c = Or((Cond(Aff.of("j"), "<=", Aff.of("i")), Cond(Aff.of("j"), "<", Aff.of("Prefix"))))
    ex = Exporter(lower_spec(parse_spec_text(PREFIX_LM)))
    b = ex.conds_bool((Cond(Aff.of("j"), "<", Aff.of("N")), c), {})
    assert render(b, "coq") == "andb (Nat.ltb i_j n_N) (orb (Nat.leb i_j i_i) (Nat.ltb i_j n_Prefix))", render(b, "coq")
    assert render(b, "lean") == "and (Nat.blt i_j n_N) (or (Nat.ble i_j i_i) (Nat.blt i_j n_Prefix))", render(b, "lean")
    assert render(ex.cond_prop(c, {}), "coq") == "((i_j <= i_i) \\/ (i_j < n_Prefix))"
    assert render(ex.cond_prop(c, {}), "lean") == "((i_j ≤ i_i) ∨ (i_j < n_Prefix))"


def test_the_mask_rule_refuses_a_disjunction_by_name():
    spec = yaml.safe_load(PREFIX_LM)
    at = next(n for n, s in enumerate(spec["schedule"]) if s == {"rule": "tile", "def": "O", "index": "i", "size": 128})
    spec["schedule"].insert(at + 1, {"rule": "skip_masked", "def": "O", "index": "jo"})
    assert_fails(yaml.safe_dump(spec, sort_keys=False), 3, "skip_masked", "only through a disjunction",
                 "not implemented")


@pytest.mark.parametrize("text,fragments", [
    ("softmax(j | j <= i || Doc[b, j] < 3: S[b, h, i, j])", ("Doc[…]", "f32 input", "only integer inputs")),
    ("softmax(j | j <= i || j == Prefix: S[b, h, i, j])", ("==", "disjunction")),
    ("softmax(j | j <= i || j < 3 && j > 1: S[b, h, i, j])", ("both && and ||",)),
])
def test_bad_masks_are_exit_2_with_one_line(text, fragments):
    spec = yaml.safe_load(PREFIX_LM)
    spec["statements"][1] = f"P[b, h, i, j] = {text}"
    spec["inputs"]["Doc"] = {"shape": ["B", "N"], "dtype": "f32"}
    assert_fails(yaml.safe_dump(spec, sort_keys=False), 2, *fragments)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
@pytest.mark.parametrize("mapping", ["wgmma", "mma_sync"])
def test_prefix_lm_builds_on_both_mappings(tmp_path, mapping):
    """Derived, lowered (the kernel IR interpreter checks the Or), printed and run on the CPU
    emulation (a `masked`-style draw: Prefix = 37 cuts the first key tile)."""
    from compiler.cli import build_to

    spec = yaml.safe_load(PREFIX_LM)
    if mapping == "mma_sync":
        fa = yaml.safe_load((EX / "flash_attention.yaml").read_text())["schedule"]
        spec["schedule"] = [s for s in fa if s["rule"] != "skip_masked"]
    path = tmp_path / "plm.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    build_to(path, tmp_path / "out", seed=4, proofs=False)
    src = (tmp_path / "out" / "kernel.cu").read_text()
    assert "< (sz_Prefix)))" in src and " || " in src
    # wgmma starts the key loop at the first tile the disjunction's range reaches; mma.sync's ring
    # starts at 0 (its n_start is MASK-DATA's span start, and this schedule has no span)
    assert "n_start" in src and (mapping == "wgmma") == ("const int n_start = 0;" not in src)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
def test_a_dropped_disjunct_in_the_printer_is_caught(tmp_path, monkeypatch):
    """Print an Or as its first part only: the kernel check on the emulation catches it."""
    from codegen.mappings import cexpr
    from compiler.cli import BuildError, build_to

    real = cexpr.cond_c
    monkeypatch.setattr(cexpr, "cond_c", lambda c, names: real(c.parts[0] if isinstance(c, Or) else c, names))
    with pytest.raises(BuildError, match="kernel"):
        build_to(EX / "attention_prefix_lm.yaml", tmp_path / "out", seed=4, proofs=False)
