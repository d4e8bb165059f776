"""The backward-pass theorems (issue 16): RECOMPUTE (softmax from the saved LSE), FlashAttention-2's
row term D (SOFTMAX_BWD_ROWTERM) and the softmax VJP (dual numbers), and the algebra fields they
add (KAlg.gt, KAlg.exp_nonneg, class KAlgLog).  coqc must accept the theorems and their
instances, and reject wrong statements: a mutated statement in the library no longer compiles
against its proof, and each mutation is refuted outright (its negation is a theorem)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proofs_ci import coqlib
from proofs_ci import theorems as th

ROOT = Path(__file__).resolve().parents[1]
COQ = ROOT / "proofs_ci" / "coq"

pytestmark = pytest.mark.skipif(not coqlib.coqc_available(), reason="coqc not installed")

HEADER = ("From Coq Require Import Arith Lia Ring.\nRequire Import Derivc.All.\n"
          "Section G.\nContext {R : Type} {KA : KAlg R} {KL : KAlgLog R}.\n"
          "Add Ring derivc_ring : (@kalg_ring R KA).\n")


@pytest.fixture(scope="module")
def built_lib(tmp_path_factory) -> Path:
    return coqlib.build_library(COQ, tmp_path_factory.mktemp("coqlib_bwd") / "coq", examples=True)


def _goal(tmp: Path, lib: Path, name: str, body: str) -> tuple[bool, str]:
    v = tmp / f"{name}.v"
    v.write_text(HEADER + body + "\nEnd G.\n")
    r = coqlib.check_obligation(v, lib)
    return r.returncode == 0, r.stdout + r.stderr


# --------------------------------------------------------------------------- registration


def test_backward_theorems_are_registered_in_both_libraries():
    assert th.RULE_THEOREMS["RECOMPUTE"] == ("softmax_recompute", "softmax_recompute_max")
    assert th.RULE_THEOREMS["SOFTMAX_BWD_ROWTERM"] == ("softmax_bwd_rowterm",)
    assert th.RULE_THEOREMS["SOFTMAX_VJP"] == ("softmax_vjp_row",)
    assert th.check_same(th.lean_theorems(ROOT), th.coq_theorems(ROOT)) == []
    assert th.rule_file_errors(ROOT) == []


def test_log_is_an_extension_class_and_gt_a_field():
    algebra = th.strip_coq_comments((COQ / "Algebra.v").read_text())
    kalg = algebra[algebra.index("Class KAlg "):algebra.index("}.")]
    for field in ("gt : R -> R -> R", "gt_true", "gt_false", "exp_nonneg"):
        assert field in kalg, field
    assert "log" not in kalg  # the rational model has no log: it is not a KAlg field
    klog = algebra[algebra.index("Class KAlgLog"):]
    klog = klog[:klog.index("}.")]
    for field in ("log : R -> R", "exp_log", "log_exp"):
        assert field in klog, field
    lean = (ROOT / "lean/Derivc/Algebra.lean").read_text()
    for field in ("gt : R → R → R", "gt_true", "gt_false", "exp_nonneg", "class KAlgLog",
                  "exp_log", "log_exp"):
        assert field in lean, field


def test_models_instantiate_the_extended_algebra(built_lib):
    """Both models still instantiate KAlg (gt, exp_nonneg); the reals also KAlgLog (ln), the
    rationals provably cannot."""
    assert (built_lib / "models" / "ModelReals.vo").exists()
    assert (built_lib / "models" / "ModelRat.vo").exists()
    reals = (COQ / "models" / "ModelReals.v").read_text()
    assert "Instance reals_kalg_log : KAlgLog R" in reals and "log := ln" in reals
    rat = (COQ / "models" / "ModelRat.v").read_text()
    assert "Lemma qc_no_KAlgLog" in rat and "gt := qc_gt" in rat


# --------------------------------------------------------------------------- instances


RECOMPUTE_CAUSAL = """
Theorem recompute_causal_row : forall (i n : nat) (S : nat -> nat -> R) (j : nat), j < n ->
  softmaxAtG (fun k => Nat.leb k i) n (fun k => S i k) j
  = sel (Nat.leb j i)
      (expd (Fin (S i j))
        (eadd (maxTo n (fun k => sel (Nat.leb k i) (Fin (S i k)) ninf))
          (log (sumTo n (fun k => sel (Nat.leb k i)
                   (expd (Fin (S i k)) (maxTo n (fun k2 => sel (Nat.leb k2 i) (Fin (S i k2)) ninf)))
                   zero)))))
      zero.
Proof.
  intros i n S j Hj. exact (softmax_recompute_max (fun k => Nat.leb k i) n (fun k => S i k) j Hj).
Qed.
"""

ROWTERM_ATTENTION = """
Theorem rowterm_attention : forall (n D : nat) (P : nat -> nat -> R) (dO : nat -> nat -> R)
    (V : nat -> nat -> R) (i : nat),
  sumTo n (fun j => mul (P i j) (sumTo D (fun d => mul (dO i d) (V j d))))
  = sumTo D (fun d => mul (dO i d) (sumTo n (fun j => mul (P i j) (V j d)))).
Proof. intros. apply softmax_bwd_rowterm. Qed.
"""


@pytest.mark.parametrize("name,body,wrong", [
    # the mask of the recomputed side is the strict one: j = i differs
    ("Recompute", RECOMPUTE_CAUSAL, ("sel (Nat.leb j i)", "sel (Nat.ltb j i)")),
    # the shift of the sum differs from the shift of the numerator (a stale max)
    ("RecomputeShift", RECOMPUTE_CAUSAL, ("(expd (Fin (S i k)) (maxTo n", "(expd (Fin (S i k)) (maxTo i")),
    # V transposed on the rewritten side
    ("Rowterm", ROWTERM_ATTENTION, ("mul (P i j) (V j d)))).", "mul (P i j) (V d j)))).")),
])
def test_instance_checks_and_a_wrong_site_fails(built_lib, tmp_path, name, body, wrong):
    ok, out = _goal(tmp_path, built_lib, name, body)
    assert ok, out
    bad = body.replace(*wrong)
    assert bad != body
    ok, _ = _goal(tmp_path, built_lib, name + "Bad", bad)
    assert not ok, f"{name}: the wrong site {wrong[1]!r} was accepted"


def test_masked_rows_are_zero_on_both_sides(built_lib, tmp_path):
    """A fully masked row: the statement holds without any fact about LSE there."""
    ok, out = _goal(tmp_path, built_lib, "MaskedRow", """
Goal forall (n : nat) (s : nat -> R) (M : ext R) (j : nat), j < n ->
  softmaxAtG (fun _ => false) n s j = zero.
Proof.
  intros n s M j Hj. rewrite (softmax_recompute (fun _ => false) n s M j Hj) by reflexivity.
  reflexivity.
Qed.""")
    assert ok, out


MASKED_MAX_SAFETY = """
Goal forall (i n j : nat) (S : nat -> R), j < n -> j <= i ->
  let M := maxTo n (fun k => sel (Nat.leb k i) (Fin (S k)) ninf) in expd_safe (Fin (S j)) M.
Proof. derivc_safe. Qed.
"""


@pytest.mark.parametrize("wrong", [None, ("Nat.leb k i", "Nat.ltb k i"), ("j <= i ->", "j <= i + 1 ->")],
                         ids=["live-key", "max-over-fewer-keys", "exp-outside-the-mask"])
def test_masked_max_safety(built_lib, tmp_path, wrong):
    """exp(s_j - M) <= 1 for M the masked max (RECOMPUTE's M, the LSE kernel): derivc_safe finds j
    among the live keys; when j may be a key the max does not see, it must fail."""
    body = MASKED_MAX_SAFETY if wrong is None else MASKED_MAX_SAFETY.replace(*wrong)
    ok, out = _goal(tmp_path, built_lib, "MaskedMaxSafety", body)
    assert ok == (wrong is None), out


# --------------------------------------------------------------------------- wrong statements


REFUTATIONS = {
    "recompute_without_mask": """
Goal ~ (forall (g : nat -> bool) (n : nat) (s : nat -> R) (M : ext R) (j : nat),
  j < n -> (forall k, k < n -> M = NInf -> g k = false) ->
  softmaxAtG g n s j
  = expd (Fin (s j)) (eadd M (log (sumTo n (fun k => if g k then expd (Fin (s k)) M else zero))))).
Proof.
  intros H. specialize (H (fun _ => false) 1 (fun _ => zero) (Fin zero) 0 ltac:(lia)
                          ltac:(intros; discriminate)).
  cbv [softmaxAtG expd eadd] in H. apply (exp_ne_zero _ (eq_sym H)).
Qed.""",
    "lse_without_log": """
Lemma inv_one' : inv one = one.
Proof. symmetry. apply inv_of_mul_one; [exact one_ne_zero | apply mul_one]. Qed.
Goal ~ (forall (g : nat -> bool) (n : nat) (s : nat -> R) (M : ext R) (j : nat),
  j < n -> (forall k, k < n -> M = NInf -> g k = false) ->
  softmaxAtG g n s j
  = if g j then expd (Fin (s j)) (eadd M (sumTo n (fun k => if g k then expd (Fin (s k)) M else zero)))
    else zero).
Proof.
  intros H. specialize (H (fun _ => true) 1 (fun _ => zero) (Fin zero) 0 ltac:(lia)
                          ltac:(intros; discriminate)).
  cbv [softmaxAtG expd eadd sumTo div] in H.
  rewrite !sub_diag, exp_zero, !add_0_l, inv_one', mul_one in H.
  assert (E : log (exp (sub zero one)) = log (exp zero)) by (rewrite <- H, exp_zero; reflexivity).
  rewrite !log_exp in E. unfold sub in E. rewrite add_0_l in E.
  apply one_ne_zero. rewrite <- (add_neg one), E, add_zero. reflexivity.
Qed.""",
    "rowterm_sum_over_d_dropped": """
Goal ~ (forall (n m : nat) (P g : nat -> R) (V : nat -> nat -> R),
  sumTo n (fun j => mul (P j) (sumTo m (fun d => mul (g d) (V j d))))
  = mul (g 0) (sumTo n (fun j => mul (P j) (V j 0)))).
Proof.
  intros H. specialize (H 1 2 (fun _ => one) (fun _ => one) (fun _ _ => one)).
  cbv [sumTo] in H. rewrite !mul_one, !mul_1_l, !add_0_l in H.
  apply one_ne_zero. apply (add_cancel_l one). rewrite add_zero. exact H.
Qed.""",
    "vjp_without_the_mean_term": """
Lemma inv_one' : inv one = one.
Proof. symmetry. apply inv_of_mul_one; [exact one_ne_zero | apply mul_one]. Qed.
Goal ~ (forall (g : nat -> bool) (n : nat) (s t c : nat -> R),
  sumTo n (fun j => mul (c j) (eps (dsoftmaxG g n (dual_row s t) j)))
  = sumTo n (fun j => mul (t j) (mul (softmaxAtG g n s j) (c j)))).
Proof.
  intros H. specialize (H (fun _ => true) 1 (fun _ => zero) (fun _ => one) (fun _ => one)).
  rewrite softmax_vjp_row in H.
  assert (P1 : softmaxAtG (fun _ => true) 1 (fun _ => zero) 0 = one).
  { cbv [softmaxAtG sumTo div]. rewrite exp_zero, add_0_l, inv_one'. apply mul_one. }
  cbv [sumTo] in H. rewrite P1, !mul_one, !add_0_l, sub_diag, !mul_0_r in H.
  apply one_ne_zero. symmetry. exact H.
Qed.""",
}


@pytest.mark.parametrize("name", sorted(REFUTATIONS))
def test_mutated_statement_is_refuted(built_lib, tmp_path, name):
    """The negation of each wrong statement is a theorem of the algebra (so no proof of it
    exists in any model: the reals are one)."""
    ok, out = _goal(tmp_path, built_lib, "Refute_" + name, REFUTATIONS[name])
    assert ok, out


LIBRARY_MUTATIONS = [
    # the mask guard of the recomputed side dropped
    ("Rules/Recompute.v",
     "  = if g j\n    then expd (Fin (s j)) (eadd M (log (sumTo n (fun k => if g k then expd (Fin (s k)) M "
     "else zero))))\n    else zero.",
     "  = expd (Fin (s j)) (eadd M (log (sumTo n (fun k => if g k then expd (Fin (s k)) M "
     "else zero)))).", "recompute without the mask"),
    # LSE = M + L without log
    ("Rules/Recompute.v", "(eadd M (log (sumTo n", "(eadd M ((sumTo n", "LSE without log"),
    # L summed over the masked keys too
    ("Rules/Recompute.v", "(log (sumTo n (fun k => if g k then expd (Fin (s k)) M else zero))))",
     "(log (sumTo n (fun k => expd (Fin (s k)) M))))", "L over masked keys"),
    # the sum over d dropped on the rewritten side of the row term
    ("Rules/SoftmaxBwd.v",
     "  = sumTo m (fun d => mul (g d) (sumTo n (fun j => mul (P j) (V j d)))).",
     "  = mul (g 0) (sumTo n (fun j => mul (P j) (V j 0))).", "rowterm without the sum over d"),
    # the VJP without the - Σ_k P_k c_k term
    ("Rules/SoftmaxVjp.v",
     "(sub (c j) (sumTo n (fun k => mul (softmaxAtG g n s k) (c k)))))).",
     "(c j))).", "vjp without the mean term"),
]


@pytest.mark.parametrize("rel,old,new,what", LIBRARY_MUTATIONS, ids=[m[3] for m in LIBRARY_MUTATIONS])
def test_mutated_library_statement_fails_coqc(built_lib, tmp_path, rel, old, new, what):
    lib = tmp_path / "coq"
    shutil.copytree(built_lib, lib)
    p = lib / rel
    text = p.read_text()
    assert text.count(old) >= 1, (rel, old)
    p.write_text(text.replace(old, new, 1))
    r = coqlib.check_obligation(p, lib)  # coqc -R lib Derivc <file>, the rest already compiled
    assert r.returncode != 0, f"{what}: the mutated statement in {rel} was accepted"
    p.write_text(text)
    assert coqlib.check_obligation(p, lib).returncode == 0, f"{rel} unmutated must compile"
