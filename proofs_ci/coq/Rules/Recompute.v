(* Rule RECOMPUTE (the backward pass's softmax from the saved row statistic LSE): the masked
   softmax P_j = exp (s_j) / Σ_{k | mask} exp (s_k)  (0 at masked j, softmaxAtG) equals
   exp (s_j - LSE) at unmasked j, with LSE = M + log L, L = Σ_{k | mask} exp (s_k - M).
   As for SPLIT-SOFTMAX, the shift M need not be the max: any DEFINED shift works (-inf only
   when every key of the row is masked); the masked max is one (softmax_recompute_max).
   Fully masked rows: both sides are 0 by the mask guard, whatever LSE is there (in floating
   point LSE = -inf + log 0 = -inf; here eadd NInf _ = NInf, and log 0 is never evaluated by
   the proof).  The only place log enters is exp (x - log L) = exp x / L for L > 0
   (Algebra.v: exp_sub_log), L > 0 because the row has the live key j.  Assumes KAlgLog. *)
Require Import Arith Lia.
Require Import Derivc.Algebra Derivc.Sum Derivc.Rules.SplitSoftmax Derivc.Rules.OnlineAgg
  Derivc.Tactics.

Section Recompute.
Context {R : Type} {KA : KAlg R}.

(* the IR's a + b with a possibly -inf and b finite (LSE = M + log L): -inf + b = -inf *)
Definition eadd (a : ext R) (b : R) : ext R :=
  match a with
  | Fin x => Fin (add x b)
  | NInf => NInf
  end.

Lemma sumTo_nonneg : forall (n : nat) (f : nat -> R),
  (forall k, k < n -> le zero (f k)) -> le zero (sumTo n f).
Proof.
  induction n as [|n IH]; intros f Hf.
  - apply le_refl.
  - rewrite sumTo_S. apply add_nonneg; [apply IH; intros k Hk; apply Hf; lia | apply Hf; lia].
Qed.

(* a sum of nonnegative terms with one positive term is positive *)
Lemma sumTo_pos : forall (n : nat) (f : nat -> R) (j : nat),
  (forall k, k < n -> le zero (f k)) -> j < n -> rlt zero (f j) -> rlt zero (sumTo n f).
Proof.
  induction n as [|n IH]; intros f j Hf Hj Hp.
  - exfalso. inversion Hj.
  - rewrite sumTo_S. destruct (Nat.eq_dec j n) as [E | E].
    + subst j. apply add_nonneg_pos; [| exact Hp].
      apply sumTo_nonneg. intros k Hk. apply Hf. lia.
    + apply add_pos_nonneg; [| apply Hf; lia].
      apply (IH f j); [intros k Hk; apply Hf; lia | lia | exact Hp].
Qed.

(* the masked row sum L = Σ_{k | mask} exp (s_k - m) is positive when the row has a live key *)
Lemma masked_exp_sum_pos : forall (g : nat -> bool) (n : nat) (s : nat -> R) (m : R) (j : nat),
  j < n -> g j = true -> rlt zero (sumTo n (fun k => if g k then exp (sub (s k) m) else zero)).
Proof.
  intros g n s m j Hj Gj. apply (sumTo_pos n _ j); [| exact Hj |].
  - intros k Hk. destruct (g k); [apply exp_nonneg | apply le_refl].
  - cbv beta. rewrite Gj. apply exp_pos.
Qed.

(* the masked max is -inf only on fully masked rows: it is a valid shift *)
Lemma masked_max_valid : forall (g : nat -> bool) (n : nat) (s : nat -> R) (k : nat),
  k < n -> maxTo n (fun k' => if g k' then Fin (s k') else ninf) = NInf -> g k = false.
Proof.
  intros g n s k Hk E. pose proof (maxTo_NInf_inv n _ E k Hk) as F. cbv beta in F.
  destruct (g k); [discriminate F | reflexivity].
Qed.

Context {KL : KAlgLog R}.

(* RECOMPUTE, any defined shift M *)
Theorem softmax_recompute : forall (g : nat -> bool) (n : nat) (s : nat -> R) (M : ext R) (j : nat),
  j < n -> (forall k, k < n -> M = NInf -> g k = false) ->
  softmaxAtG g n s j
  = if g j
    then expd (Fin (s j)) (eadd M (log (sumTo n (fun k => if g k then expd (Fin (s k)) M else zero))))
    else zero.
Proof.
  intros g n s M j Hj HM.
  rewrite (softmaxAtG_shift g n s j M Hj HM).
  destruct (g j) eqn:Gj; [| reflexivity].
  destruct M as [m|]; [| rewrite (HM j Hj eq_refl) in Gj; discriminate Gj].
  cbv [expd eadd].
  rewrite sub_add_r, exp_sub_log by exact (masked_exp_sum_pos g n s m j Hj Gj).
  reflexivity.
Qed.

(* RECOMPUTE with the masked row max as the shift (the FlashAttention-2 LSE) *)
Theorem softmax_recompute_max : forall (g : nat -> bool) (n : nat) (s : nat -> R) (j : nat),
  j < n ->
  softmaxAtG g n s j
  = if g j
    then expd (Fin (s j))
           (eadd (maxTo n (fun k => if g k then Fin (s k) else ninf))
              (log (sumTo n (fun k => if g k
                                      then expd (Fin (s k)) (maxTo n (fun k' => if g k' then Fin (s k') else ninf))
                                      else zero))))
    else zero.
Proof.
  intros g n s j Hj. apply softmax_recompute; [exact Hj |].
  intros k Hk E. exact (masked_max_valid g n s k Hk E).
Qed.

End Recompute.
