(* derivc proof library: the abstract element algebra.
   Only the fields of KAlg are assumed (plus functional extensionality,
   imported where it is used).  Every other fact is proved.

   R holds FINITE values only: a commutative ring with exp and a finite max.  -infinity is
   not an element of R: it is the constructor NInf of the extended type `ext R` (Fin r | NInf),
   the type of everything max-like (max, maxTo, masked scores, the running max).  There is
   no ring arithmetic on ext R; the only bridges back to R are
     eexp   : exp of an extended value            eexp NInf = zero
     expd   : exp (a - b) for extended a, b        expd NInf (Fin b) = zero
     rescale: the IR's rescale(a, b)               rescale a a = one (also at -inf)
   and the undefined cases (exp (x - (-inf)) = +inf, -inf - -inf = NaN outside rescale) give
   `undef`, an element about which NOTHING is assumed: a statement that depends on it is
   not provable (models with different undef values disagree) -- except the ring laws, which
   hold of every element of R: undef * 0 = 0 is provable (README, "The proof layer").

   R is totally ordered (`le`, compatible with +), rmax is the join of that order, exp is
   monotone; -inf (NInf) is below every extended value (`ele`).  The order is what the
   safety obligations use: every exp argument s - m with m a running max is <= 0.
   `gt` is the order's 0/1 step (d max(a, b) / da = gt a b).

   The natural logarithm is NOT a field of KAlg: it lives in the extension class KAlgLog
   (end of this file), with exp (log a) = a for a > 0 and log (exp a) = a.  Those force exp to
   be a bijection onto the positive elements, which the axiom-free rational model (exp := 1)
   cannot satisfy; only the theorems that use log (RECOMPUTE) assume KAlgLog. *)

Class KAlg (R : Type) := {
  zero : R;
  one : R;
  add : R -> R -> R;
  mul : R -> R -> R;
  neg : R -> R;
  inv : R -> R;
  exp : R -> R;
  rmax : R -> R -> R;
  (* the value of an undefined operation (+inf, NaN): unconstrained *)
  undef : R;
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
  (* a total order compatible with + *)
  le : R -> R -> Prop;
  le_total : forall a b : R, le a b \/ le b a;
  le_antisym : forall a b : R, le a b -> le b a -> a = b;
  le_trans : forall a b c : R, le a b -> le b c -> le a c;
  le_add_r : forall a b c : R, le a b -> le (add a c) (add b c);
  (* finite max = the larger of the two (the join); -infinity (its unit) lives in ext R *)
  rmax_l : forall a b : R, le b a -> rmax a b = a;
  rmax_r : forall a b : R, le a b -> rmax a b = b;
  (* exp is monotone and nonnegative (exp a <> 0 is derived: exp_ne_zero; so exp a > 0) *)
  exp_mono : forall a b : R, le a b -> le (exp a) (exp b);
  exp_nonneg : forall a : R, le zero (exp a);
  (* the step function of the order: gt a b = 1 if a > b else 0 (the derivative of max) *)
  gt : R -> R -> R;
  gt_true : forall a b : R, ~ le a b -> gt a b = one;
  gt_false : forall a b : R, le a b -> gt a b = zero
}.

(* the extended values: finite, or -infinity as its own constructor *)
Inductive ext (R : Type) : Type :=
| Fin : R -> ext R
| NInf : ext R.
Arguments Fin {R} _.
Arguments NInf {R}.
Notation ninf := NInf (only parsing).

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

(* ----------------------------------------------------------- the order *)

Lemma le_refl : forall a : R, le a a.
Proof. intros a. destruct (le_total a a) as [E | E]; exact E. Qed.

Lemma le_rmax_l : forall a b : R, le a (rmax a b).
Proof.
  intros a b. destruct (le_total a b) as [E | E].
  - rewrite (rmax_r a b E). exact E.
  - rewrite (rmax_l a b E). apply le_refl.
Qed.

Lemma le_rmax_r : forall a b : R, le b (rmax a b).
Proof.
  intros a b. destruct (le_total a b) as [E | E].
  - rewrite (rmax_r a b E). apply le_refl.
  - rewrite (rmax_l a b E). exact E.
Qed.

Lemma rmax_lub : forall a b x : R, le a x -> le b x -> le (rmax a b) x.
Proof.
  intros a b x Ha Hb. destruct (le_total a b) as [E | E].
  - rewrite (rmax_r a b E). exact Hb.
  - rewrite (rmax_l a b E). exact Ha.
Qed.

Lemma rmax_comm : forall a b : R, rmax a b = rmax b a.
Proof.
  intros a b. apply le_antisym; apply rmax_lub; first [apply le_rmax_l | apply le_rmax_r].
Qed.

Lemma rmax_assoc : forall a b c : R, rmax (rmax a b) c = rmax a (rmax b c).
Proof.
  intros a b c. apply le_antisym.
  - apply rmax_lub; [apply rmax_lub |].
    + apply le_rmax_l.
    + apply (le_trans b (rmax b c)); [apply le_rmax_l | apply le_rmax_r].
    + apply (le_trans c (rmax b c)); [apply le_rmax_r | apply le_rmax_r].
  - apply rmax_lub; [| apply rmax_lub].
    + apply (le_trans a (rmax a b)); [apply le_rmax_l | apply le_rmax_l].
    + apply (le_trans b (rmax a b)); [apply le_rmax_r | apply le_rmax_l].
    + apply le_rmax_r.
Qed.

(* the exp argument a - b is <= 0 exactly when a <= b *)
Lemma le_sub_0 : forall a b : R, le a b -> le (sub a b) zero.
Proof.
  intros a b E. unfold sub. rewrite <- (add_neg b). apply le_add_r. exact E.
Qed.

Lemma exp_le_one : forall a : R, le a zero -> le (exp a) one.
Proof. intros a E. rewrite <- exp_zero. apply exp_mono. exact E. Qed.

(* the strict order; exp is positive *)
Definition rlt (a b : R) : Prop := le a b /\ a <> b.

Lemma exp_pos : forall a : R, rlt zero (exp a).
Proof.
  intros a. split; [apply exp_nonneg |].
  intros E. apply (exp_ne_zero a). symmetry. exact E.
Qed.

Lemma rlt_ne_zero : forall a : R, rlt zero a -> a <> zero.
Proof. intros a [_ E] F. apply E. symmetry. exact F. Qed.

Lemma le_add_nonneg_l : forall a b : R, le zero a -> le b (add a b).
Proof.
  intros a b E. pose proof (le_add_r zero a b E) as F. rewrite add_0_l in F. exact F.
Qed.

Lemma add_nonneg : forall a b : R, le zero a -> le zero b -> le zero (add a b).
Proof. intros a b Ea Eb. apply (le_trans zero b (add a b) Eb). apply le_add_nonneg_l. exact Ea. Qed.

Lemma add_nonneg_pos : forall a b : R, le zero a -> rlt zero b -> rlt zero (add a b).
Proof.
  intros a b Ea [Eb Nb]. split; [apply add_nonneg; assumption |].
  intros Z. apply Nb. apply le_antisym; [exact Eb |].
  rewrite Z. apply le_add_nonneg_l. exact Ea.
Qed.

Lemma add_pos_nonneg : forall a b : R, rlt zero a -> le zero b -> rlt zero (add a b).
Proof. intros a b Ea Eb. rewrite add_comm. apply add_nonneg_pos; assumption. Qed.

Lemma neg_add : forall a b : R, neg (add a b) = add (neg a) (neg b).
Proof.
  intros a b. apply (add_cancel_l (add a b)).
  rewrite add_neg, add_swap4, !add_neg, add_zero. reflexivity.
Qed.

(* x - (m + l) = (x - m) - l *)
Lemma sub_add_r : forall x m l : R, sub x (add m l) = sub (sub x m) l.
Proof. intros x m l. unfold sub. rewrite neg_add, add_assoc. reflexivity. Qed.

(* a left inverse of a nonzero element is its inverse *)
Lemma inv_of_mul_one : forall a b : R, a <> zero -> mul b a = one -> b = inv a.
Proof.
  intros a b Ha E.
  rewrite <- (mul_one b), <- (mul_inv a Ha), <- mul_assoc, E. apply mul_1_l.
Qed.

(* the step function gt at equal arguments is 0 *)
Lemma gt_refl : forall a : R, gt a a = zero.
Proof. intros a. apply gt_false. apply le_refl. Qed.

(* ----------------------------------------------------------- extended values *)

Definition max (a b : ext R) : ext R :=
  match a, b with
  | NInf, y => y
  | x, NInf => x
  | Fin x, Fin y => Fin (rmax x y)
  end.

Definition eexp (a : ext R) : R :=
  match a with
  | Fin x => exp x
  | NInf => zero
  end.

(* exp (a - b) on extended values *)
Definition expd (a b : ext R) : R :=
  match a, b with
  | Fin x, Fin y => exp (sub x y)
  | NInf, Fin _ => zero
  | _, NInf => undef
  end.

(* the IR's rescale(a, b) = exp (a - b), exactly one when a and b are both -inf *)
Definition rescale (a b : ext R) : R :=
  match a, b with
  | NInf, NInf => one
  | _, _ => expd a b
  end.

Lemma max_assoc : forall a b c : ext R, max (max a b) c = max a (max b c).
Proof.
  intros [a|] [b|] [c|]; simpl; try reflexivity. rewrite rmax_assoc. reflexivity.
Qed.

Lemma max_comm : forall a b : ext R, max a b = max b a.
Proof. intros [a|] [b|]; simpl; try reflexivity. rewrite rmax_comm. reflexivity. Qed.

Lemma max_ninf : forall a : ext R, max ninf a = a.
Proof. intros [a|]; reflexivity. Qed.

Lemma max_ninf_r : forall a : ext R, max a ninf = a.
Proof. intros [a|]; reflexivity. Qed.

Lemma max_NInf_inv : forall a b : ext R, max a b = NInf -> a = NInf /\ b = NInf.
Proof. intros [a|] [b|]; simpl; intros E; try discriminate E; split; reflexivity. Qed.

Lemma max_fin_l : forall (x : R) (b : ext R), max (Fin x) b <> NInf.
Proof. intros x [b|]; simpl; discriminate. Qed.

Lemma eexp_ninf : eexp ninf = zero.
Proof. reflexivity. Qed.

Lemma expd_fin : forall x y : R, expd (Fin x) (Fin y) = exp (sub x y).
Proof. reflexivity. Qed.

Lemma expd_ninf_l : forall y : R, expd ninf (Fin y) = zero.
Proof. reflexivity. Qed.

Lemma rescale_diag : forall a : ext R, rescale a a = one.
Proof.
  intros [a|]; simpl; [|reflexivity].
  unfold sub. rewrite add_neg. apply exp_zero.
Qed.

Lemma rescale_fin : forall x y : R, rescale (Fin x) (Fin y) = exp (sub x y).
Proof. reflexivity. Qed.

Lemma rescale_ninf_l : forall y : R, rescale ninf (Fin y) = zero.
Proof. reflexivity. Qed.

(* the order on extended values: -inf below everything *)
Definition ele (a b : ext R) : Prop :=
  match a, b with
  | NInf, _ => True
  | Fin _, NInf => False
  | Fin x, Fin y => le x y
  end.

Lemma ele_ninf : forall a : ext R, ele ninf a.
Proof. intros a. exact I. Qed.

Lemma ele_refl : forall a : ext R, ele a a.
Proof. intros [a|]; simpl; [apply le_refl | exact I]. Qed.

Lemma ele_trans : forall a b c : ext R, ele a b -> ele b c -> ele a c.
Proof.
  intros [a|] [b|] [c|]; simpl; intros E F; try exact I; try contradiction.
  exact (le_trans a b c E F).
Qed.

Lemma ele_max_l : forall a b : ext R, ele a (max a b).
Proof. intros [a|] [b|]; simpl; first [apply le_rmax_l | apply le_refl | exact I]. Qed.

Lemma ele_max_r : forall a b : ext R, ele b (max a b).
Proof. intros [a|] [b|]; simpl; first [apply le_rmax_r | apply le_refl | exact I]. Qed.

(* max is the join: the larger of the two *)
Lemma max_l : forall a b : ext R, ele b a -> max a b = a.
Proof.
  intros [a|] [b|]; simpl; intros E; try reflexivity; try contradiction.
  rewrite (rmax_l a b E). reflexivity.
Qed.

Lemma max_r : forall a b : ext R, ele a b -> max a b = b.
Proof.
  intros [a|] [b|]; simpl; intros E; try reflexivity; try contradiction.
  rewrite (rmax_r a b E). reflexivity.
Qed.

(* the safety of the IR's rescale(a, b) = exp (a - b): the argument is <= 0, i.e. a <= b
   (a = -inf: exp gives 0, and rescale(-inf, -inf) = 1 by the IR's convention; b = -inf with
   a finite: exp (a - (-inf)) = +inf, unsafe) *)
Definition rescale_safe (a b : ext R) : Prop :=
  match a, b with
  | NInf, _ => True
  | Fin _, NInf => False
  | Fin x, Fin y => le (sub x y) zero
  end.

(* the safety of a plain exp (a - b): as rescale, except that -inf - (-inf) is NaN *)
Definition expd_safe (a b : ext R) : Prop :=
  match a, b with
  | Fin x, Fin y => le (sub x y) zero
  | NInf, Fin _ => True
  | _, NInf => False
  end.

Lemma rescale_safe_of_ele : forall a b : ext R, ele a b -> rescale_safe a b.
Proof. intros [a|] [b|]; simpl; intros E; try exact I; try contradiction. apply le_sub_0. exact E. Qed.

(* a finite (or live) a below b: b is finite too, so exp (a - b) is defined and <= 1 *)
Lemma expd_safe_of_ele_ne : forall a b : ext R, ele a b -> a <> NInf -> expd_safe a b.
Proof.
  intros [a|] [b|]; simpl; intros E N; try contradiction; try exact I;
    first [ apply le_sub_0; exact E | exfalso; apply N; reflexivity ].
Qed.

Lemma expd_safe_le_one : forall x y : R, expd_safe (Fin x) (Fin y) -> le (expd (Fin x) (Fin y)) one.
Proof. intros x y E. simpl. apply exp_le_one. exact E. Qed.

Lemma rescale_safe_max_l : forall a b : ext R, rescale_safe a (max a b).
Proof. intros a b. apply rescale_safe_of_ele, ele_max_l. Qed.

(* on safe arguments exp (a - b) never meets `undef`: its value is one of these *)
Definition expd_def (a b : ext R) : R :=
  match a, b with
  | Fin x, Fin y => exp (sub x y)
  | _, _ => zero
  end.

Definition rescale_def (a b : ext R) : R :=
  match a, b with
  | Fin x, Fin y => exp (sub x y)
  | NInf, NInf => one
  | _, _ => zero
  end.

Lemma expd_safe_defined : forall a b : ext R, expd_safe a b -> expd a b = expd_def a b.
Proof. intros [a|] [b|]; simpl; intros E; try contradiction; reflexivity. Qed.

Lemma rescale_safe_defined : forall a b : ext R, rescale_safe a b -> rescale a b = rescale_def a b.
Proof. intros [a|] [b|]; simpl; intros E; try contradiction; reflexivity. Qed.

(* exp (-inf - (-inf)) is NaN: never safe *)
Lemma expd_safe_ninf_ninf : ~ expd_safe NInf NInf.
Proof. simpl. intros F. exact F. Qed.

End Derived.

(* ----------------------------------------------------------- the logarithm *)

(* The natural logarithm, inverse of exp on the positive elements.  A separate class: its
   laws make exp a bijection from R onto the positive elements, which the rational model
   (exp := 1) cannot satisfy (models/ModelRat.v: qc_has_no_log); the reals do
   (models/ModelReals.v).  Only the theorems that mention log assume it. *)
Class KAlgLog (R : Type) `{KA : KAlg R} := {
  log : R -> R;
  exp_log : forall a : R, rlt zero a -> exp (log a) = a;
  log_exp : forall a : R, log (exp a) = a
}.

Section LogDerived.
Context {R : Type} {KA : KAlg R} {KL : KAlgLog R}.

(* exp (- log a) = 1 / a for a > 0 *)
Lemma exp_neg_log : forall a : R, rlt zero a -> exp (neg (log a)) = inv a.
Proof.
  intros a Ha. apply inv_of_mul_one; [apply rlt_ne_zero; exact Ha |].
  assert (E : mul (exp (neg (log a))) (exp (log a)) = one)
    by (rewrite <- exp_add, (add_comm (neg (log a))), add_neg; apply exp_zero).
  rewrite (exp_log a Ha) in E. exact E.
Qed.

(* exp (x - log l) = exp x / l for l > 0 *)
Lemma exp_sub_log : forall x l : R, rlt zero l -> exp (sub x (log l)) = div (exp x) l.
Proof. intros x l Hl. unfold div. rewrite exp_sub, exp_neg_log by exact Hl. reflexivity. Qed.

End LogDerived.
