"""Direct proofs of equality obligations (compiler/obligations_direct.py): the printed congruence
descent is emitted for the rule kinds it covers, it checks in coqc, and a mutated obligation
(a wrong argument in the statement, a wrong path in the script) fails coqc: the printer never
falls back to search for a statement it was given."""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from compiler import obligations
from compiler.derive import derive
from compiler.obligations_base import coq_text
from compiler.obligations_direct import PROOF_SEARCH, direct_script, normalize, prove_directly
from compiler.obligations_terms import A, N, V
from compiler.spec import load_spec_file

ROOT = Path(__file__).resolve().parents[1]
GEMM = ROOT / "examples" / "gemm.yaml"
FLASH = ROOT / "examples" / "flash_attention.yaml"
needs_coq = pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc not installed")


# --------------------------------------------------------------------------- the printer


def test_normalize_inlines_lets_and_beta_reduces_their_uses():
    f = ("lam", ["x"], ("nop", "+", V("x"), N(1)))
    t = ("let", "b", f, A("t_A", A("b", V("i")), A("b", N(2))))
    n = normalize(t)
    assert n == A("t_A", ("nop", "+", V("i"), N(1)), ("nop", "+", N(2), N(1)))


def test_normalize_does_not_capture():
    # let y := i in sumTo 4 (fun i => t i y): the let's i is the free one, not the binder
    t = ("let", "y", V("i"), A("sumTo", N(4), ("lam", ["i"], A("t", V("i"), V("y")))))
    lam = normalize(t)[2][1]
    (bound,) = lam[1]
    assert lam[2] == A("t", V(bound), V("i")) and bound != "i"


def test_descent_goes_through_binders_and_guards_to_the_difference():
    body = lambda read: A("sel", A("ltb", V("k"), V("n")), A("mul", read, A("zero")), A("zero"))
    b = A("sumTo", N(8), ("lam", ["k"], body(A("t_A", V("k")))))
    a = ("let", "b_A", ("lam", ["r"], A("t_A", V("r"))),
         A("sumTo", N(8), ("lam", ["k"], body(A("b_A", V("k"))))))
    same = direct_script(b, b)
    assert same is not None and same.leaves == 0 and "reflexivity" in same.script
    p = direct_script(b, A("sumTo", N(8), ("lam", ["k"], body(A("t_A", ("nop", "+", V("k"), N(0)))))))
    assert p is not None and p.leaves == 1
    assert "sumTo_ext_eq" in p.script and "sel_congr" in p.script and "f_equal2" in p.script
    assert direct_script(b, a).leaves == 0  # the let's use is the same read after beta
    assert direct_script(b, A("maxTo", N(8), ("lam", ["k"], A("zero")))) is None  # differs at the root


# --------------------------------------------------------------------------- the examples


def _steps(spec: Path):
    d = derive(load_spec_file(spec), str(spec), check=False)
    return [(rec, obligations.obligation_for(rec, b, a)) for rec, b, a in zip(d.steps, d.programs, d.programs[1:])]


@pytest.mark.parametrize("spec,kinds", [(GEMM, {"CACHE"}), (FLASH, {"CACHE", "FUSE"})], ids=["gemm", "flash"])
def test_examples_prove_their_search_only_equalities_directly(spec, kinds):
    seen = set()
    for rec, ob in _steps(spec):
        assert all(t.proof != PROOF_SEARCH for t in ob.thms if t.concl[0] == "eq" and ob.proof_modes.get(t.name) == "direct")
        if rec.kind in kinds:
            eqs = [t for t in ob.thms if t.concl[0] == "eq"]
            assert eqs and all(ob.proof_modes[t.name] == "direct" for t in eqs), (rec.kind, ob.proof_modes)
            assert all(t.proof.startswith("intros. cbv beta zeta.") for t in eqs)
            seen.add(rec.kind)
    assert seen == kinds


# --------------------------------------------------------------------------- coqc


@pytest.fixture(scope="module")
def coq_lib(tmp_path_factory):
    from compiler.verify import coq_library

    return coq_library(tmp_path_factory.mktemp("coqlib"))


def _coqc(ob, tmp: Path, lib: Path, name: str) -> bool:
    from proofs_ci import coqlib

    v = tmp / f"{name}.v"
    v.write_text(coq_text(ob))
    return coqlib.check_obligation(v, lib).returncode == 0


def _shift_first_read(t, tensor: str):
    """t with the first read of `tensor` one element off in its last index."""
    done = []

    def go(x):
        if done or not isinstance(x, tuple):
            return x
        if x[0] == "app" and x[1] == tensor and x[2]:
            done.append(1)
            return ("app", x[1], x[2][:-1] + [("nop", "+", x[2][-1], N(1))])
        if x[0] == "app":
            return ("app", x[1], [go(y) for y in x[2]])
        if x[0] == "lam":
            return ("lam", x[1], go(x[2]))
        if x[0] == "let":
            return ("let", x[1], go(x[2]), go(x[3]))
        return x

    out = go(t)
    assert done, f"no read of {tensor}"
    return out


@needs_coq
@pytest.mark.parametrize("spec,step,tensor", [(GEMM, 5, "t_A"), (FLASH, 7, "t_V"), (FLASH, 10, "t_K")],
                         ids=["gemm-cache", "flash-fuse", "flash-cache"])
def test_direct_proof_checks_and_mutations_fail(spec, step, tensor, tmp_path, coq_lib):
    rec, ob = next((r, o) for r, o in _steps(spec) if r.index == step)
    main = next(t for t in ob.thms if t.concl[0] == "eq")
    assert ob.proof_modes[main.name] == "direct"
    one = replace(ob, thms=[main])
    assert _coqc(one, tmp_path, coq_lib, "Good"), main.proof

    # a wrong argument: the after-side reads one element off; the printer still prints a direct
    # proof (no fallback to search) and coqc rejects it
    concl = ("eq", main.concl[1], _shift_first_read(main.concl[2], tensor))
    bad = replace(main, concl=concl, proof=PROOF_SEARCH)
    assert prove_directly([bad]) == {bad.name: "direct"}
    assert not _coqc(replace(ob, thms=[bad]), tmp_path, coq_lib, "BadArg")

    # a wrong path: the first differing subterm claimed equal as it stands
    wrong = main.proof.replace("derivc_leaf", "reflexivity", 1)
    assert wrong != main.proof
    assert not _coqc(replace(ob, thms=[replace(main, proof=wrong)]), tmp_path, coq_lib, "BadPath")


def test_mask_and_the_online_fold_half_are_direct():
    steps = dict((rec.kind + str(rec.index), ob) for rec, ob in _steps(FLASH))
    mask = steps["MASK9"]
    (eq,) = [t for t in mask.thms if t.concl[0] == "eq"]
    assert mask.proof_modes[eq.name] == "direct" and "foldN_trunc_eq" in eq.proof
    assert "pose proof (ceilDiv_ge" in eq.proof  # the obligation's facts are kept
    agg = steps["ONLINE-AGG6"].thms[0].proof
    assert "rewrite onlineFoldG_foldN.\n    cbv beta zeta." in agg and "foldN_ext" in agg


@needs_coq
def test_mask_direct_proof_rejects_a_fold_cut_too_short(tmp_path, coq_lib):
    ob = dict((rec.index, o) for rec, o in _steps(FLASH))[9]
    (eq,) = [t for t in ob.thms if t.concl[0] == "eq"]
    after = eq.concl[2]
    assert after[0] == "let" and after[2][1] == "foldN"
    short = ("let", after[1], ("app", "foldN", after[2][2][:2] + [N(1)]), after[3])
    facts = eq.proof[len("intros."):eq.proof.index(" cbv beta zeta.")]  # the search proof it replaced
    bad = replace(eq, concl=("eq", eq.concl[1], short), proof=f"intros.{facts}\n  derivc_congr.")
    assert prove_directly([bad]) == {bad.name: "direct"} and "foldN_trunc_eq" in bad.proof
    assert not _coqc(replace(ob, thms=[bad]), tmp_path, coq_lib, "ShortFold")
