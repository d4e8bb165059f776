(* Worked example of an ONLINE-AGG obligation: one attention row i, column c.
   Scores s_j = sum_d Q[i,d] K[j,d]; the kernel streams T key tiles of 64 with a
   running max m' = max(m, rowmax of the tile) starting from -inf. *)
From Coq Require Import Arith Lia.
Require Import Derivc.All.

Section Step07.
Context {R : Type} {KA : KAlg R}.

Theorem step07_ONLINE_AGG : forall (T D i c : nat) (Q K V : nat -> nat -> R),
  sumTo (T * 64)
    (fun j => mul (softmaxAt (T * 64) (fun j => sumTo D (fun d => mul (Q i d) (K j d))) j) (V j c))
  = div (st_acc (onlineFold (fun j => sumTo D (fun d => mul (Q i d) (K j d)))
                            (fun j => V j c) 64
                            (fun o m => max m (maxTo 64 (fun jj =>
                                         sumTo D (fun d => mul (Q i d) (K (o * 64 + jj) d)))))
                            ninf T))
        (st_l (onlineFold (fun j => sumTo D (fun d => mul (Q i d) (K j d)))
                          (fun j => V j c) 64
                          (fun o m => max m (maxTo 64 (fun jj =>
                                       sumTo D (fun d => mul (Q i d) (K (o * 64 + jj) d)))))
                          ninf T)).
Proof.
  intros T D i c Q K V.
  rewrite (softmax_split _ _ _ zero).
  symmetry. apply online_agg.
Qed.

(* causal mask inside the tiles: key j visible iff j <= i *)
Theorem step08_ONLINE_AGG_MASK : forall (T i : nat) (s v : nat -> R) (mnext : nat -> R -> R),
  div (st_acc (onlineFoldG (fun j => Nat.leb j i) s v 64 mnext ninf T))
      (st_l (onlineFoldG (fun j => Nat.leb j i) s v 64 mnext ninf T))
  = div (sumTo (T * 64) (fun j => mul (if Nat.leb j i then exp (sub (s j) zero) else zero) (v j)))
        (sumTo (T * 64) (fun j => if Nat.leb j i then exp (sub (s j) zero) else zero)).
Proof.
  intros T i s v mnext. apply online_agg_guard.
Qed.

End Step07.
