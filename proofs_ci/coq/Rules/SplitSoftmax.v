(* Rule SPLIT-SOFTMAX: softmax(s) . v computed with any stabilising shift m. *)
Require Import Derivc.Algebra Derivc.Sum.

Section SplitSoftmax.
Context {R : Type} `{KAlg R}.

Definition softmaxAt (n : nat) (s : nat -> R) (j : nat) : R :=
  div (exp (s j)) (sumTo n (fun k => exp (s k))).

Lemma exp_sub_mul_r : forall a m b : R,
  mul (exp (sub a m)) b = mul (mul (exp a) (exp (neg m))) b.
Proof. intros a m b. rewrite exp_sub. reflexivity. Qed.

(* sum (e_j c) v_j / sum (e_j c) = sum e_j v_j / sum e_j  for c <> 0 *)
Lemma ratio_scale : forall (n : nat) (e v : nat -> R) (c : R), c <> zero ->
  div (sumTo n (fun j => mul (mul (e j) c) (v j))) (sumTo n (fun j => mul (e j) c))
  = div (sumTo n (fun j => mul (e j) (v j))) (sumTo n e).
Proof.
  intros n e v c Hc.
  rewrite (sumTo_ext n (fun j => mul (mul (e j) c) (v j)) (fun j => mul (mul (e j) (v j)) c))
    by (intros j Hj; apply mul_rot).
  rewrite (sumTo_mul_r n (fun j => mul (e j) (v j)) c), (sumTo_mul_r n e c).
  apply div_cancel_r. exact Hc.
Qed.

(* the shifted form sum exp(s_j - m) v_j / sum exp(s_j - m) does not depend on m *)
Lemma shift_ratio : forall (n : nat) (s v : nat -> R) (m : R),
  div (sumTo n (fun j => mul (exp (sub (s j) m)) (v j))) (sumTo n (fun j => exp (sub (s j) m)))
  = div (sumTo n (fun j => mul (exp (s j)) (v j))) (sumTo n (fun j => exp (s j))).
Proof.
  intros n s v m.
  rewrite (sumTo_ext n (fun j => mul (exp (sub (s j) m)) (v j))
                       (fun j => mul (mul (exp (s j)) (exp (neg m))) (v j)))
    by (intros j Hj; apply exp_sub_mul_r).
  rewrite (sumTo_ext n (fun j => exp (sub (s j) m))
                       (fun j => mul (exp (s j)) (exp (neg m))))
    by (intros j Hj; apply exp_sub).
  exact (ratio_scale n (fun j => exp (s j)) v (exp (neg m)) (exp_ne_zero (neg m))).
Qed.

Theorem softmax_split : forall (n : nat) (s v : nat -> R) (m : R),
  sumTo n (fun j => mul (softmaxAt n s j) (v j))
  = div (sumTo n (fun j => mul (exp (sub (s j) m)) (v j))) (sumTo n (fun j => exp (sub (s j) m))).
Proof.
  intros n s v m. rewrite shift_ratio.
  rewrite (sumTo_ext n (fun j => mul (softmaxAt n s j) (v j))
                       (fun j => mul (mul (exp (s j)) (v j)) (inv (sumTo n (fun k => exp (s k))))))
    by (intros j Hj; unfold softmaxAt, div; apply mul_rot).
  rewrite sumTo_mul_r. reflexivity.
Qed.

End SplitSoftmax.
