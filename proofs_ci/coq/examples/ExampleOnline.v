(* Worked example of an ONLINE-AGG obligation: one attention row i, column c.
   Scores s_j = sum_d Q[i,d] K[j,d]; the kernel streams T key tiles of 64 with a
   running max m' = max(m, rowmax of the tile) starting from -inf.  The running max is an
   extended value: the proof must show it is finite once a live key has been seen
   (derivc_mnext), else exp (s - (-inf)) would be evaluated. *)
From Coq Require Import Arith Lia Bool.
Require Import Derivc.All.

Section Step07.
Context {R : Type} {KA : KAlg R}.

Theorem step07_ONLINE_AGG : forall (T D i c : nat) (Q K V : nat -> nat -> R),
  sumTo (T * 64)
    (fun j => mul (softmaxAt (T * 64) (fun j => sumTo D (fun d => mul (Q i d) (K j d))) j) (V j c))
  = div (st_acc (onlineFold (fun j => sumTo D (fun d => mul (Q i d) (K j d)))
                            (fun j => V j c) 64
                            (fun o m => max m (maxTo 64 (fun jj =>
                                         Fin (sumTo D (fun d => mul (Q i d) (K (o * 64 + jj) d))))))
                            ninf T))
        (st_l (onlineFold (fun j => sumTo D (fun d => mul (Q i d) (K j d)))
                          (fun j => V j c) 64
                          (fun o m => max m (maxTo 64 (fun jj =>
                                       Fin (sumTo D (fun d => mul (Q i d) (K (o * 64 + jj) d))))))
                          ninf T)).
Proof.
  intros T D i c Q K V.
  rewrite (softmax_split _ _ _ zero).
  symmetry. apply online_agg.
  intros o m Ho E. apply max_NInf_inv in E. destruct E as [_ E].
  pose proof (maxTo_NInf_inv _ _ E 0 ltac:(lia)) as H0. discriminate H0.
Qed.

(* causal mask inside the tiles: key j visible iff j <= i; the running max of the IR *)
Theorem step08_ONLINE_AGG_MASK : forall (T i : nat) (s v : nat -> R),
  let mnext := fun o m => max m (maxTo 64 (fun jj =>
                 if Nat.leb (o * 64 + jj) i then Fin (s (o * 64 + jj)) else ninf)) in
  div (st_acc (onlineFoldG (fun j => Nat.leb j i) s v 64 mnext ninf T))
      (st_l (onlineFoldG (fun j => Nat.leb j i) s v 64 mnext ninf T))
  = div (sumTo (T * 64) (fun j => mul (if Nat.leb j i then expd (Fin (s j)) (Fin zero) else zero) (v j)))
        (sumTo (T * 64) (fun j => if Nat.leb j i then expd (Fin (s j)) (Fin zero) else zero)).
Proof.
  intros T i s v mnext. apply online_agg_guard.
  - unfold mnext. derivc_mnext.
  - intros j Hj E. discriminate E.
Qed.

(* a row whose keys are all masked gives 0 (x / 0 = 0) *)
Theorem step08_ONLINE_AGG_MASKED_ROW : forall (T : nat) (s v : nat -> R),
  let mnext := fun o m => max m (maxTo 64 (fun jj =>
                 if Nat.ltb (o * 64 + jj) 0 then Fin (s (o * 64 + jj)) else ninf)) in
  div (st_acc (onlineFoldG (fun j => Nat.ltb j 0) s v 64 mnext ninf T))
      (st_l (onlineFoldG (fun j => Nat.ltb j 0) s v 64 mnext ninf T)) = zero.
Proof.
  intros T s v mnext. apply (online_agg_guard _ _ _ _ _ _ ninf).
  - unfold mnext. derivc_mnext.
  - intros j Hj _. reflexivity.
  - intros j Hj. reflexivity.
Qed.

(* a running max that is never updated is not defined: the invariant cannot start *)
Lemma never_updated_not_ok : forall (T : nat), 0 < T ->
  ~ online_max_ok (R := R) (fun _ => true) 64 (fun _ m => m) T.
Proof.
  intros T HT H. destruct (H 0 ninf HT eq_refl) as [_ Hg].
  specialize (Hg 0 ltac:(lia)). discriminate Hg.
Qed.

End Step07.
