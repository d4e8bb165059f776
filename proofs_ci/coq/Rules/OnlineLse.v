(* Rule FOLD-STAT: the ONLINE-AGG fold also writes its row's log-sum-exp, m + log l, read off
   the fold's final state.  By ONLINE-AGG's invariant (online_invariant) the final running sum is
   l = exp (-m) * (sum of the live exp (s j)), so for a row with a live key (the sum positive)
       m + log l = m + log (exp (-m) * sum) = log (sum of the live exp (s j)).
   A row whose keys are all masked ends with m = -inf and l = 0 (the kernels write -inf: log 0).
   log is the algebra's (class KAlgLog); only its laws on positive elements are used. *)
Require Import Arith Lia.
Require Import Derivc.Algebra Derivc.Sum Derivc.Rules.SplitSoftmax Derivc.Rules.OnlineAgg.

Section OnlineLse.
Context {R : Type} {KA : KAlg R} {KL : KAlgLog R}.

(* log (exp a * b) = a + log b for b > 0 *)
Lemma log_exp_mul : forall a b : R, rlt zero b -> log (mul (exp a) b) = add a (log b).
Proof.
  intros a b Hb. rewrite <- (exp_log b Hb) at 1. rewrite <- exp_add. apply log_exp.
Qed.

Theorem online_lse : forall (g : nat -> bool) (s v : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 : ext R) (T : nat),
  online_max_ok g t mnext T ->
  match st_m (onlineFoldG g s v t mnext m0 T) with
  | Fin x => rlt zero (sumTo (T * t) (eg g s)) ->
             add x (log (st_l (onlineFoldG g s v t mnext m0 T))) = log (sumTo (T * t) (eg g s))
  | NInf => st_l (onlineFoldG g s v t mnext m0 T) = zero /\ forall j, j < T * t -> g j = false
  end.
Proof.
  intros g s v t mnext m0 T Hok.
  pose proof (online_invariant g s v t mnext m0 T Hok) as Hinv. unfold onlineInv in Hinv.
  destruct (st_m (onlineFoldG g s v t mnext m0 T)) as [x|].
  - intros Hpos. destruct Hinv as [Hl _].
    rewrite Hl, (log_exp_mul _ _ Hpos), <- add_assoc, add_neg, add_0_l. reflexivity.
  - destruct Hinv as [Hl [_ Hm]]. split; [exact Hl | exact Hm].
Qed.

End OnlineLse.
