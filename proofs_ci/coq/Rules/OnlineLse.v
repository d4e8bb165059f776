(* Rule FOLD-STAT: the ONLINE-AGG fold also writes its row's log-sum-exp, m + log l, read off
   the fold's final state.  By ONLINE-AGG's invariant (online_invariant) the final running sum is
   l = exp (-m) * sum of the live exp (s j), so for a row with a live key
       m + log l = m + log (exp (-m) * sum) = log (sum of the live exp (s j)).
   A row whose keys are all masked ends with m = -inf and l = 0 (the kernels write -inf: log 0).
   `log` is not (yet) a field of the algebra: it is an argument of the theorem with the one
   property the proof needs, log (exp a * b) = a + log b (for the real log: b > 0, which holds
   here: b is a sum of exponentials with a live key).  Once the algebra has `log` (its own branch),
   the hypothesis is that field's law and the theorem an instance. *)
Require Import Arith Lia.
Require Import Derivc.Algebra Derivc.Sum Derivc.Rules.SplitSoftmax Derivc.Rules.OnlineAgg.

Section OnlineLse.
Context {R : Type} `{KAlg R}.

Theorem online_lse : forall (log : R -> R),
    (forall a b : R, log (mul (exp a) b) = add a (log b)) ->
  forall (g : nat -> bool) (s v : nat -> R) (t : nat) (mnext : nat -> ext R -> ext R)
    (m0 : ext R) (T : nat),
  online_max_ok g t mnext T ->
  match st_m (onlineFoldG g s v t mnext m0 T) with
  | Fin x => add x (log (st_l (onlineFoldG g s v t mnext m0 T))) = log (sumTo (T * t) (eg g s))
  | NInf => st_l (onlineFoldG g s v t mnext m0 T) = zero /\ forall j, j < T * t -> g j = false
  end.
Proof.
  intros log Hlog g s v t mnext m0 T Hok.
  pose proof (online_invariant g s v t mnext m0 T Hok) as Hinv. unfold onlineInv in Hinv.
  destruct (st_m (onlineFoldG g s v t mnext m0 T)) as [x|].
  - destruct Hinv as [Hl _]. rewrite Hl, Hlog, <- add_assoc, add_neg, add_0_l. reflexivity.
  - destruct Hinv as [Hl [_ Hm]]. split; [exact Hl | exact Hm].
Qed.

End OnlineLse.
