(* A second model of the algebra, without any axiom: the canonical rationals Qc (Leibniz
   equality), exp := 1, max := the larger, / 0 = 0, in two variants that differ only in
   `undef`.  (The field with two elements, the model before the order was added, is not an
   ordered ring: no total order on it is compatible with +.)  It shows that the algebra's
   hypotheses are consistent without any axiom, and that the undefined operations on
   -infinity are not provable facts: exp (-inf - -inf) = 1 fails in one model, and so does
   every other statement about `undef` that is not a ring law.  exp (-inf - m) = 0 holds by
   definition (never <> 0).  It has the step function gt but no logarithm (qc_has_no_log):
   the class KAlgLog, which RECOMPUTE assumes, has only the reals as a model here. *)
From Coq Require Import QArith Qcanon.
Require Import Derivc.All.

Lemma qc_le_dec : forall a b : Qc, {(a <= b)%Qc} + {~ (a <= b)%Qc}.
Proof.
  intros a b. destruct (Qle_bool a b) eqn:E; [left | right]; unfold Qcle.
  - apply Qle_bool_iff. exact E.
  - intros F. apply Qle_bool_iff in F. rewrite F in E. discriminate E.
Defined.

Definition qc_max (a b : Qc) : Qc := if qc_le_dec a b then b else a.

Lemma qc_le_total : forall a b : Qc, (a <= b \/ b <= a)%Qc.
Proof. intros a b. destruct (qc_le_dec a b) as [E | E]; [left; exact E | right; apply Qclt_le_weak, Qcnot_le_lt, E]. Qed.

Lemma qc_le_add_r : forall a b c : Qc, (a <= b -> a + c <= b + c)%Qc.
Proof. intros a b c E. apply Qcplus_le_compat; [exact E | apply Qcle_refl]. Qed.

Lemma qc_max_l : forall a b : Qc, (b <= a)%Qc -> qc_max a b = a.
Proof. intros a b E. unfold qc_max. destruct (qc_le_dec a b) as [F | F]; [apply Qcle_antisym; assumption | reflexivity]. Qed.

Lemma qc_max_r : forall a b : Qc, (a <= b)%Qc -> qc_max a b = b.
Proof. intros a b E. unfold qc_max. destruct (qc_le_dec a b) as [F | F]; [reflexivity | contradiction]. Qed.

Lemma qc_one_ne_zero : (1 : Qc) <> Q2Qc 0.
Proof. intros E. discriminate E. Qed.

Lemma qc_zero_le_one : (Q2Qc 0 <= 1)%Qc.
Proof. unfold Qcle. apply Qle_bool_iff. reflexivity. Qed.

(* the 0/1 step of the order *)
Definition qc_gt (a b : Qc) : Qc := if qc_le_dec a b then Q2Qc 0 else 1.

Lemma qc_gt_true : forall a b : Qc, ~ (a <= b)%Qc -> qc_gt a b = 1.
Proof. intros a b E. unfold qc_gt. destruct (qc_le_dec a b) as [F | F]; [contradiction | reflexivity]. Qed.

Lemma qc_gt_false : forall a b : Qc, (a <= b)%Qc -> qc_gt a b = Q2Qc 0.
Proof. intros a b E. unfold qc_gt. destruct (qc_le_dec a b) as [F | F]; [reflexivity | contradiction]. Qed.

Definition qc (u : Qc) : KAlg Qc := {|
  zero := Q2Qc 0; one := 1; add := Qcplus; mul := Qcmult; neg := Qcopp; inv := Qcinv;
  exp := fun _ => 1; rmax := qc_max; undef := u;
  add_assoc := fun a b c => eq_sym (Qcplus_assoc a b c); add_comm := Qcplus_comm;
  add_zero := Qcplus_0_r; add_neg := Qcplus_opp_r;
  mul_assoc := fun a b c => eq_sym (Qcmult_assoc a b c); mul_comm := Qcmult_comm;
  mul_one := Qcmult_1_r; mul_add := Qcmult_plus_distr_r; one_ne_zero := qc_one_ne_zero;
  mul_inv := Qcmult_inv_r; inv_mul_distrib := Qcinv_mult_distr;
  exp_add := fun _ _ => eq_sym (Qcmult_1_r 1); exp_zero := eq_refl;
  le := Qcle; le_total := qc_le_total; le_antisym := Qcle_antisym; le_trans := Qcle_trans;
  le_add_r := qc_le_add_r; rmax_l := qc_max_l; rmax_r := qc_max_r;
  exp_mono := fun _ _ _ => Qcle_refl 1; exp_nonneg := fun _ => qc_zero_le_one;
  gt := qc_gt; gt_true := qc_gt_true; gt_false := qc_gt_false
|}.

(* no logarithm: log (exp a) = a would give log 1 = 0 and log 1 = 1.  So the theorems that use
   log (KAlgLog: RECOMPUTE) have only the reals as a model here. *)
Lemma qc_has_no_log : forall (u : Qc) (lg : Qc -> Qc),
  ~ (forall a : Qc, lg (@exp Qc (qc u) a) = a).
Proof.
  intros u lg H. pose proof (H (Q2Qc 0)) as H0. pose proof (H 1) as H1. simpl in H0, H1.
  rewrite H0 in H1. discriminate H1.
Qed.

Lemma qc_no_KAlgLog : forall u : Qc, KAlgLog Qc (KA := qc u) -> False.
Proof. intros u [lg _ Hl]. exact (qc_has_no_log u lg Hl). Qed.

(* -inf - -inf is not 0: exp (-inf - -inf) = 1 is false when undef = 0 *)
Lemma ninf_minus_ninf_not_provable :
  ~ (forall (A : Type) (K : KAlg A), expd (R := A) ninf ninf = one).
Proof. intros H. specialize (H Qc (qc (Q2Qc 0))). discriminate H. Qed.

(* exp (x - (-inf)) (a never-updated running max) is not a value either *)
Lemma exp_minus_ninf_not_provable :
  ~ (forall (A : Type) (K : KAlg A) (x : A), expd (Fin x) ninf = exp x).
Proof. intros H. specialize (H Qc (qc (Q2Qc 0)) 1). discriminate H. Qed.

(* exp (-inf - m) = 0 in every model, so exp (-inf - m) <> 0 is refutable *)
Lemma exp_ninf_minus_is_zero : forall (A : Type) (K : KAlg A) (m : A), expd ninf (Fin m) = zero.
Proof. reflexivity. Qed.

(* the rescale convention rescale(-inf, -inf) = 1 is what masked tiles use *)
Lemma rescale_ninf_ninf : forall (A : Type) (K : KAlg A), rescale (R := A) ninf ninf = one.
Proof. reflexivity. Qed.

(* a constant running max (0) is not safe: exp (1 - 0) has argument 1 > 0 *)
Lemma constant_running_max_not_safe :
  ~ (forall (A : Type) (K : KAlg A) (x : A), expd_safe (Fin x) (Fin zero)).
Proof.
  intros H. specialize (H Qc (qc (Q2Qc 0)) 1). simpl in H. unfold sub in H. simpl in H.
  apply H. reflexivity.
Qed.
