(* derivc proof library: the abstract element algebra.
   Only the fields of KAlg are assumed (plus functional extensionality,
   imported where it is used).  Every other fact is proved. *)

Class KAlg (R : Type) := {
  zero : R;
  one : R;
  add : R -> R -> R;
  mul : R -> R -> R;
  neg : R -> R;
  inv : R -> R;
  exp : R -> R;
  max : R -> R -> R;
  ninf : R;
  (* commutative ring *)
  add_assoc : forall a b c : R, add (add a b) c = add a (add b c);
  add_comm : forall a b : R, add a b = add b a;
  add_zero : forall a : R, add a zero = a;
  add_neg : forall a : R, add a (neg a) = zero;
  mul_assoc : forall a b c : R, mul (mul a b) c = mul a (mul b c);
  mul_comm : forall a b : R, mul a b = mul b a;
  mul_one : forall a : R, mul a one = a;
  mul_add : forall a b c : R, mul a (add b c) = add (mul a b) (mul a c);
  one_ne_zero : one <> zero;
  (* field-like inverse, total: inv zero is unconstrained except by inv_mul_distrib *)
  mul_inv : forall a : R, a <> zero -> mul a (inv a) = one;
  inv_mul_distrib : forall a b : R, inv (mul a b) = mul (inv a) (inv b);
  (* exponential *)
  exp_add : forall a b : R, exp (add a b) = mul (exp a) (exp b);
  exp_zero : exp zero = one;
  (* max with -infinity as unit *)
  max_assoc : forall a b c : R, max (max a b) c = max a (max b c);
  max_comm : forall a b : R, max a b = max b a;
  max_ninf : forall a : R, max ninf a = a
}.

(* Optional infix notations; obligations use the prefix forms. *)
Declare Scope kalg_scope.
Delimit Scope kalg_scope with K.
Infix "+" := add : kalg_scope.
Infix "*" := mul : kalg_scope.

Section Derived.
Context {R : Type} `{KAlg R}.

Definition sub (a b : R) : R := add a (neg b).
Definition div (a b : R) : R := mul a (inv b).

Lemma add_0_l : forall a : R, add zero a = a.
Proof. intros a. rewrite add_comm. apply add_zero. Qed.

Lemma add_cancel_l : forall a b c : R, add a b = add a c -> b = c.
Proof.
  intros a b c Hb.
  transitivity (add (add (neg a) a) b).
  - rewrite (add_comm (neg a) a), add_neg, add_0_l. reflexivity.
  - rewrite add_assoc, Hb, <- add_assoc, (add_comm (neg a) a), add_neg, add_0_l.
    reflexivity.
Qed.

Lemma mul_0_r : forall a : R, mul a zero = zero.
Proof.
  intros a. apply (add_cancel_l (mul a zero)).
  rewrite <- mul_add, !add_zero. reflexivity.
Qed.

Lemma mul_0_l : forall a : R, mul zero a = zero.
Proof. intros a. rewrite mul_comm. apply mul_0_r. Qed.

Lemma mul_1_l : forall a : R, mul one a = a.
Proof. intros a. rewrite mul_comm. apply mul_one. Qed.

Lemma add_mul : forall a b c : R, mul (add a b) c = add (mul a c) (mul b c).
Proof.
  intros a b c. rewrite (mul_comm (add a b) c), mul_add, (mul_comm c a), (mul_comm c b).
  reflexivity.
Qed.

Lemma add_swap4 : forall a b c d : R,
  add (add a b) (add c d) = add (add a c) (add b d).
Proof.
  intros a b c d.
  rewrite (add_assoc a b (add c d)), (add_assoc a c (add b d)).
  rewrite <- (add_assoc b c d), (add_comm b c), (add_assoc c b d).
  reflexivity.
Qed.

Lemma mul_swap4 : forall a b c d : R,
  mul (mul a b) (mul c d) = mul (mul a c) (mul b d).
Proof.
  intros a b c d.
  rewrite (mul_assoc a b (mul c d)), (mul_assoc a c (mul b d)).
  rewrite <- (mul_assoc b c d), (mul_comm b c), (mul_assoc c b d).
  reflexivity.
Qed.

Lemma mul_rot : forall a b c : R, mul (mul a b) c = mul (mul a c) b.
Proof.
  intros a b c. rewrite (mul_assoc a b c), (mul_comm b c), <- (mul_assoc a c b).
  reflexivity.
Qed.

Lemma neg_cancel : forall a b : R, add (neg a) (add a b) = b.
Proof.
  intros a b. rewrite <- (add_assoc (neg a) a b), (add_comm (neg a) a), add_neg, add_0_l.
  reflexivity.
Qed.

Lemma exp_ne_zero : forall a : R, exp a <> zero.
Proof.
  intros a Ha. apply one_ne_zero.
  assert (E : one = mul (exp a) (exp (neg a))).
  { rewrite <- exp_add, add_neg, exp_zero. reflexivity. }
  rewrite E, Ha, mul_0_l. reflexivity.
Qed.

Lemma exp_sub : forall a b : R, exp (sub a b) = mul (exp a) (exp (neg b)).
Proof. intros a b. unfold sub. apply exp_add. Qed.

(* exp (-m) * exp (m - m') = exp (-m') : the online-softmax rescale *)
Lemma exp_rescale : forall m m' : R, mul (exp (neg m)) (exp (sub m m')) = exp (neg m').
Proof.
  intros m m'. unfold sub. rewrite <- exp_add, neg_cancel. reflexivity.
Qed.

Lemma div_mul_r : forall a b c : R, mul (div a b) c = div (mul a c) b.
Proof. intros a b c. unfold div. apply mul_rot. Qed.

Lemma div_cancel_l : forall e a b : R, e <> zero -> div (mul e a) (mul e b) = div a b.
Proof.
  intros e a b He. unfold div.
  rewrite inv_mul_distrib, mul_swap4, (mul_inv e He), mul_1_l. reflexivity.
Qed.

Lemma div_cancel_r : forall c a b : R, c <> zero -> div (mul a c) (mul b c) = div a b.
Proof.
  intros c a b Hc. rewrite (mul_comm a c), (mul_comm b c). apply div_cancel_l. exact Hc.
Qed.

End Derived.
