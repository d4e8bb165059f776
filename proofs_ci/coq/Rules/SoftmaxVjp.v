(* The softmax vector-Jacobian product, algebraically (what GRAD's softmax adjoint uses).
   The derivative is taken with dual numbers a + ε a' (ε² = 0): dmul is the product of R[ε],
   dexp (a, a') = (exp a, exp a · a') says that exp' = exp, dinv (a, a') = (1/a, -a'/a²) is the
   inverse of R[ε] where a <> 0 (dmul_dinv).  The masked softmax evaluated on the dual scores
   s + ε t has as ε part its directional derivative along t (dsoftmaxG_eps):
       dP_j = P_j (t_j - Σ_k P_k t_k),
   and contracted with a cotangent c (the incoming dP of the IR):
       Σ_j c_j · dP_j = Σ_j t_j · P_j (c_j - Σ_k P_k c_k)       (softmax_vjp_row)
   i.e. the gradient of the scores is dS_j = P_j (c_j - Σ_k P_k c_k), the form the gradient
   program computes.  Masked keys have P_j = 0 (and the dual constant 0); no division by a
   possibly zero row sum is needed: the identity holds on fully masked rows too. *)
From Coq Require Import Ring.
Require Import Derivc.Algebra Derivc.Sum Derivc.Rules.SplitSoftmax Derivc.Rules.OnlineAgg
  Derivc.Tactics.

Record dual (R : Type) := mkDual { re : R; eps : R }.
Arguments mkDual {R} _ _.
Arguments re {R} _.
Arguments eps {R} _.

Section SoftmaxVjp.
Context {R : Type} {KA : KAlg R}.
Add Ring derivc_vjp_ring : (@kalg_ring R KA).

Definition dzero : dual R := mkDual zero zero.
Definition dadd (a b : dual R) : dual R := mkDual (add (re a) (re b)) (add (eps a) (eps b)).
Definition dmul (a b : dual R) : dual R :=
  mkDual (mul (re a) (re b)) (add (mul (re a) (eps b)) (mul (eps a) (re b))).
Definition dinv (a : dual R) : dual R :=
  mkDual (inv (re a)) (neg (mul (eps a) (mul (inv (re a)) (inv (re a))))).
Definition ddiv (a b : dual R) : dual R := dmul a (dinv b).
Definition dexp (a : dual R) : dual R := mkDual (exp (re a)) (mul (exp (re a)) (eps a)).

Fixpoint dsum (n : nat) (f : nat -> dual R) : dual R :=
  match n with
  | O => dzero
  | S k => dadd (dsum k f) (f k)
  end.

(* dinv is the inverse of the dual numbers with a nonzero real part *)
Lemma dmul_dinv : forall a : dual R, re a <> zero -> dmul a (dinv a) = mkDual one zero.
Proof.
  intros [a a'] Ha. cbn in Ha. unfold dmul, dinv. cbn [re eps]. f_equal.
  - apply mul_inv. exact Ha.
  - transitivity (mul (mul a' (inv a)) (sub one (mul a (inv a)))); [ring |].
    rewrite (mul_inv a Ha). unfold sub. rewrite add_neg. apply mul_0_r.
Qed.

(* the masked softmax over dual scores (0 at masked keys, as softmaxAtG) *)
Definition dsoftmaxG (g : nat -> bool) (n : nat) (x : nat -> dual R) (j : nat) : dual R :=
  if g j then ddiv (dexp (x j)) (dsum n (fun k => if g k then dexp (x k) else dzero)) else dzero.

Lemma dsum_re : forall (n : nat) (f : nat -> dual R), re (dsum n f) = sumTo n (fun k => re (f k)).
Proof. induction n as [|n IH]; intros f; [reflexivity | cbn [dsum]; simpl; rewrite IH; reflexivity]. Qed.

Lemma dsum_eps : forall (n : nat) (f : nat -> dual R), eps (dsum n f) = sumTo n (fun k => eps (f k)).
Proof. induction n as [|n IH]; intros f; [reflexivity | cbn [dsum]; simpl; rewrite IH; reflexivity]. Qed.

Definition dual_row (s t : nat -> R) (k : nat) : dual R := mkDual (s k) (t k).

(* the real part is the masked softmax *)
Lemma dsoftmaxG_re : forall (g : nat -> bool) (n : nat) (s t : nat -> R) (j : nat),
  re (dsoftmaxG g n (dual_row s t) j) = softmaxAtG g n s j.
Proof.
  intros g n s t j. unfold dsoftmaxG, softmaxAtG. destruct (g j); [| reflexivity].
  unfold ddiv, dmul, dinv. cbn [re eps]. rewrite dsum_re. unfold div.
  apply (f_equal2 mul); [reflexivity |]. apply f_equal.
  apply sumTo_ext. intros k Hk. destruct (g k); reflexivity.
Qed.

(* the ε part is the directional derivative: P_j (t_j - Σ_k P_k t_k) *)
Lemma dsoftmaxG_eps : forall (g : nat -> bool) (n : nat) (s t : nat -> R) (j : nat),
  eps (dsoftmaxG g n (dual_row s t) j)
  = mul (softmaxAtG g n s j) (sub (t j) (sumTo n (fun k => mul (softmaxAtG g n s k) (t k)))).
Proof.
  intros g n s t j.
  set (Z := sumTo n (fun k => if g k then exp (s k) else zero)).
  set (Z' := sumTo n (fun k => if g k then mul (exp (s k)) (t k) else zero)).
  assert (HP : sumTo n (fun k => mul (softmaxAtG g n s k) (t k)) = mul Z' (inv Z)).
  { unfold Z'. rewrite <- sumTo_mul_r. apply sumTo_ext. intros k Hk.
    unfold softmaxAtG, div. fold Z. destruct (g k); ring. }
  rewrite HP. unfold dsoftmaxG, softmaxAtG. fold Z. destruct (g j); [| cbn; ring].
  unfold ddiv, dmul, dinv, div. cbn [re eps]. rewrite dsum_re, dsum_eps.
  replace (sumTo n (fun k => re (if g k then dexp (dual_row s t k) else dzero))) with Z
    by (apply sumTo_ext; intros k Hk; destruct (g k); reflexivity).
  replace (sumTo n (fun k => eps (if g k then dexp (dual_row s t k) else dzero))) with Z'
    by (apply sumTo_ext; intros k Hk; destruct (g k); reflexivity).
  cbn. ring.
Qed.

(* the vector-Jacobian product of the masked softmax row *)
Theorem softmax_vjp_row : forall (g : nat -> bool) (n : nat) (s t c : nat -> R),
  sumTo n (fun j => mul (c j) (eps (dsoftmaxG g n (dual_row s t) j)))
  = sumTo n (fun j => mul (t j) (mul (softmaxAtG g n s j)
                                     (sub (c j) (sumTo n (fun k => mul (softmaxAtG g n s k) (c k)))))).
Proof.
  intros g n s t c.
  set (P := softmaxAtG g n s).
  set (a := sumTo n (fun k => mul (P k) (t k))).
  set (b := sumTo n (fun k => mul (P k) (c k))).
  transitivity (sumTo n (fun j => add (mul (t j) (mul (P j) (c j))) (mul (mul (P j) (c j)) (neg a)))).
  { apply sumTo_ext. intros j Hj. rewrite dsoftmaxG_eps. fold P a. ring. }
  transitivity (sumTo n (fun j => add (mul (t j) (mul (P j) (c j))) (mul (mul (P j) (t j)) (neg b)))).
  2: { apply sumTo_ext. intros j Hj. ring. }
  rewrite !sumTo_plus, !sumTo_mul_r. fold a b. f_equal. ring.
Qed.

End SoftmaxVjp.
