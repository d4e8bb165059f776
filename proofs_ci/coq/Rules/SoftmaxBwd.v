(* Rule SOFTMAX-BWD-ROWTERM (FlashAttention-2's row term D_i): in the softmax backward,
   D = Σ_j P_j dP_j with dP_j = Σ_d g_d V_{j,d} (g = the output cotangent row dO_i) is computed
   as Σ_d g_d O_d with O_d = Σ_j P_j V_{j,d}, the forward output's row: a finite-sum exchange.
   It holds for any weights P (masking lives inside P: masked P_j = 0). *)
Require Import Derivc.Algebra Derivc.Sum Derivc.Rules.Reorder.

Section SoftmaxBwd.
Context {R : Type} {KA : KAlg R}.

Lemma mul_left_comm : forall a b c : R, mul a (mul b c) = mul b (mul a c).
Proof. intros a b c. rewrite <- !mul_assoc, (mul_comm a b). reflexivity. Qed.

Theorem softmax_bwd_rowterm : forall (n m : nat) (P g : nat -> R) (V : nat -> nat -> R),
  sumTo n (fun j => mul (P j) (sumTo m (fun d => mul (g d) (V j d))))
  = sumTo m (fun d => mul (g d) (sumTo n (fun j => mul (P j) (V j d)))).
Proof.
  intros n m P g V.
  transitivity (sumTo n (fun j => sumTo m (fun d => mul (g d) (mul (P j) (V j d))))).
  - apply sumTo_ext. intros j Hj.
    rewrite <- (sumTo_mul_l m (fun d => mul (g d) (V j d)) (P j)).
    apply sumTo_ext. intros d Hd. apply mul_left_comm.
  - rewrite (sumTo_swap n m (fun j d => mul (g d) (mul (P j) (V j d)))).
    apply sumTo_ext. intros d Hd. apply (sumTo_mul_l n (fun j => mul (P j) (V j d)) (g d)).
Qed.

End SoftmaxBwd.
