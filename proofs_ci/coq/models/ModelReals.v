(* The intended model of the algebra: Coq's real numbers, the real exponential, the real
   max (whose unit -infinity is ext's NInf), the total inverse (/ 0 = 0 in Coq >= 8.16, the
   interpreter's x / 0 = 0), the real step gt (Rle_dec) and the real logarithm ln (KAlgLog).  `undef` (the value of +inf / NaN results) is set to 0 here;
   nothing in the library depends on it.  This file uses the axioms of Coq's standard
   real numbers; the library itself does not (it is only an instance). *)
From Coq Require Import Reals.
Require Import Derivc.All.

Lemma reals_le_total : forall a b : R, (a <= b \/ b <= a)%R.
Proof. intros a b. destruct (Rle_or_lt a b) as [E | E]; [left | right]; [exact E | left; exact E]. Qed.

Lemma reals_exp_mono : forall a b : R, (a <= b)%R -> (Rtrigo_def.exp a <= Rtrigo_def.exp b)%R.
Proof.
  intros a b [E | E]; [left; apply exp_increasing; exact E | right; subst; reflexivity].
Qed.

Definition reals_gt (a b : R) : R := if Rle_dec a b then 0%R else 1%R.

Lemma reals_gt_true : forall a b : R, ~ (a <= b)%R -> reals_gt a b = 1%R.
Proof. intros a b E. unfold reals_gt. destruct (Rle_dec a b) as [F | F]; [contradiction | reflexivity]. Qed.

Lemma reals_gt_false : forall a b : R, (a <= b)%R -> reals_gt a b = 0%R.
Proof. intros a b E. unfold reals_gt. destruct (Rle_dec a b) as [F | F]; [reflexivity | contradiction]. Qed.

Lemma reals_exp_nonneg : forall a : R, (0 <= Rtrigo_def.exp a)%R.
Proof. intros a. left. apply Exp_prop.exp_pos. Qed.

#[local] Instance reals_kalg : KAlg R := {|
  zero := 0%R; one := 1%R; add := Rplus; mul := Rmult; neg := Ropp; inv := Rinv;
  exp := Rtrigo_def.exp; rmax := Rmax; undef := 0%R;
  add_assoc := Rplus_assoc; add_comm := Rplus_comm; add_zero := Rplus_0_r;
  add_neg := Rplus_opp_r; mul_assoc := Rmult_assoc; mul_comm := Rmult_comm;
  mul_one := Rmult_1_r; mul_add := Rmult_plus_distr_l; one_ne_zero := R1_neq_R0;
  mul_inv := Rinv_r; inv_mul_distrib := Rinv_mult; exp_add := exp_plus; exp_zero := exp_0;
  le := Rle; le_total := reals_le_total; le_antisym := Rle_antisym; le_trans := Rle_trans;
  le_add_r := fun a b c E => Rplus_le_compat_r c a b E;
  rmax_l := fun a b E => Rmax_left a b E; rmax_r := Rmax_right; exp_mono := reals_exp_mono;
  exp_nonneg := reals_exp_nonneg; gt := reals_gt; gt_true := reals_gt_true;
  gt_false := reals_gt_false
|}.

(* the logarithm: the real ln (exp (ln x) = x for x > 0, ln (exp x) = x) *)
Lemma reals_exp_log : forall a : R, rlt zero a -> Rtrigo_def.exp (ln a) = a.
Proof.
  intros a [[E | E] N]; [apply exp_ln; exact E |]. exfalso. apply N. exact E.
Qed.

#[local] Instance reals_kalg_log : KAlgLog R := {|
  log := ln; exp_log := reals_exp_log; log_exp := ln_exp
|}.

(* in this model -inf is max's unit and exp (-inf) = 0 *)
Example reals_max_unit : forall x : R, max ninf (Fin x) = Fin x.
Proof. reflexivity. Qed.

Example reals_exp_ninf : eexp (R := R) ninf = 0%R.
Proof. reflexivity. Qed.

(* the online aggregation theorem holds in the intended model *)
Example reals_online_agg := @online_agg_guard R reals_kalg.
