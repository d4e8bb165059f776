(* Rule ONLINE-AGG: flash-attention style tile-by-tile softmax aggregation with a
   running max m, running denominator l and running accumulator acc.  The new
   running max is an arbitrary function mnext of (tile index, old max): exactness
   does not depend on it being the true max. *)
Require Import Arith.
Require Import Derivc.Algebra Derivc.Sum Derivc.Rules.SplitSoftmax.

Record OState (R : Type) := mkOState { st_m : R; st_l : R; st_acc : R }.
Arguments mkOState {R} _ _ _.
Arguments st_m {R} _.
Arguments st_l {R} _.
Arguments st_acc {R} _.

Section Online.
Context {R : Type} `{KAlg R}.

(* generic step: w j m' is the (possibly masked) weight of score j under max m' *)
Definition onlineStepW (w : nat -> R -> R) (v : nat -> R) (t : nat)
    (mnext : nat -> R -> R) (o : nat) (st : OState R) : OState R :=
  mkOState (mnext o (st_m st))
    (add (mul (st_l st) (exp (sub (st_m st) (mnext o (st_m st)))))
         (sumTo t (fun i => w (o * t + i) (mnext o (st_m st)))))
    (add (mul (st_acc st) (exp (sub (st_m st) (mnext o (st_m st)))))
         (sumTo t (fun i => mul (w (o * t + i) (mnext o (st_m st))) (v (o * t + i))))).

Fixpoint onlineFoldW (w : nat -> R -> R) (v : nat -> R) (t : nat)
    (mnext : nat -> R -> R) (m0 : R) (T : nat) : OState R :=
  match T with
  | O => mkOState m0 zero zero
  | S T' => onlineStepW w v t mnext T' (onlineFoldW w v t mnext m0 T')
  end.

(* unmasked: weight exp (s j - m') *)
Definition onlineFold (s v : nat -> R) (t : nat) (mnext : nat -> R -> R) (m0 : R) (T : nat)
  : OState R :=
  onlineFoldW (fun j m => exp (sub (s j) m)) v t mnext m0 T.

(* masked: weight (if g j then exp (s j - m') else 0) *)
Definition onlineFoldG (g : nat -> bool) (s v : nat -> R) (t : nat) (mnext : nat -> R -> R)
    (m0 : R) (T : nat) : OState R :=
  onlineFoldW (fun j m => if g j then exp (sub (s j) m) else zero) v t mnext m0 T.

Lemma rescale_step : forall m m' S X : R,
  add (mul (mul (exp (neg m)) S) (exp (sub m m'))) (mul X (exp (neg m')))
  = mul (exp (neg m')) (add S X).
Proof.
  intros m m' S X.
  rewrite (mul_rot (exp (neg m)) S (exp (sub m m'))), (exp_rescale m m').
  rewrite (mul_comm X (exp (neg m'))), <- (mul_add (exp (neg m')) S X).
  reflexivity.
Qed.

Lemma step_sum : forall (a b : nat -> R) (t T : nat) (m m' x : R),
  (forall j, a j = mul (b j) (exp (neg m'))) ->
  x = mul (exp (neg m)) (sumTo (T * t) b) ->
  add (mul x (exp (sub m m'))) (sumTo t (fun i => a (T * t + i)))
  = mul (exp (neg m')) (sumTo (S T * t) b).
Proof.
  intros a b t T m m' x Ha Hx.
  rewrite (sumTo_ext t (fun i => a (T * t + i)) (fun i => mul (b (T * t + i)) (exp (neg m'))))
    by (intros i Hi; apply Ha).
  rewrite Hx, (sumTo_mul_r t (fun i => b (T * t + i)) (exp (neg m'))).
  rewrite rescale_step, Nat.mul_succ_l, sumTo_app. reflexivity.
Qed.

Lemma online_invariant_w : forall (w : nat -> R -> R) (e v : nat -> R) (t : nat)
    (mnext : nat -> R -> R) (m0 : R),
  (forall j mm, w j mm = mul (e j) (exp (neg mm))) ->
  forall T : nat,
  st_l (onlineFoldW w v t mnext m0 T)
    = mul (exp (neg (st_m (onlineFoldW w v t mnext m0 T)))) (sumTo (T * t) e)
  /\ st_acc (onlineFoldW w v t mnext m0 T)
    = mul (exp (neg (st_m (onlineFoldW w v t mnext m0 T)))) (sumTo (T * t) (fun j => mul (e j) (v j))).
Proof.
  intros w e v t mnext m0 Hw T. induction T as [|T IH].
  - split.
    + change (zero = mul (exp (neg m0)) (sumTo (0 * t) e)).
      rewrite Nat.mul_0_l, sumTo_O, mul_0_r. reflexivity.
    + change (zero = mul (exp (neg m0)) (sumTo (0 * t) (fun j => mul (e j) (v j)))).
      rewrite Nat.mul_0_l, sumTo_O, mul_0_r. reflexivity.
  - destruct IH as [Hl Ha]. split.
    + exact (step_sum (fun j => w j (mnext T (st_m (onlineFoldW w v t mnext m0 T)))) e t T
               _ _ _ (fun j => Hw j _) Hl).
    + exact (step_sum (fun j => mul (w j (mnext T (st_m (onlineFoldW w v t mnext m0 T)))) (v j))
               (fun j => mul (e j) (v j)) t T _ _ _
               (fun j => eq_trans (f_equal (fun z => mul z (v j)) (Hw j _)) (mul_rot _ _ _)) Ha).
Qed.

Theorem online_invariant : forall (s v : nat -> R) (t : nat) (mnext : nat -> R -> R) (m0 : R)
    (T : nat),
  st_l (onlineFold s v t mnext m0 T)
    = mul (exp (neg (st_m (onlineFold s v t mnext m0 T)))) (sumTo (T * t) (fun j => exp (s j)))
  /\ st_acc (onlineFold s v t mnext m0 T)
    = mul (exp (neg (st_m (onlineFold s v t mnext m0 T))))
          (sumTo (T * t) (fun j => mul (exp (s j)) (v j))).
Proof.
  intros s v t mnext m0 T.
  destruct (online_invariant_w (fun j m => exp (sub (s j) m)) (fun j => exp (s j)) v t mnext m0
              (fun j mm => exp_sub (s j) mm) T) as [Hl Ha].
  split.
  - exact Hl.
  - exact Ha.
Qed.

Lemma online_ratio_w : forall (w : nat -> R -> R) (e v : nat -> R) (t : nat)
    (mnext : nat -> R -> R) (m0 : R) (T : nat),
  (forall j mm, w j mm = mul (e j) (exp (neg mm))) ->
  div (st_acc (onlineFoldW w v t mnext m0 T)) (st_l (onlineFoldW w v t mnext m0 T))
  = div (sumTo (T * t) (fun j => mul (e j) (v j))) (sumTo (T * t) e).
Proof.
  intros w e v t mnext m0 T Hw.
  destruct (online_invariant_w w e v t mnext m0 Hw T) as [Hl Ha].
  rewrite Hl, Ha. apply div_cancel_l. apply exp_ne_zero.
Qed.

Theorem online_agg : forall (s v : nat -> R) (t : nat) (mnext : nat -> R -> R) (m0 M : R)
    (T : nat),
  div (st_acc (onlineFold s v t mnext m0 T)) (st_l (onlineFold s v t mnext m0 T))
  = div (sumTo (T * t) (fun j => mul (exp (sub (s j) M)) (v j)))
        (sumTo (T * t) (fun j => exp (sub (s j) M))).
Proof.
  intros s v t mnext m0 M T. unfold onlineFold.
  rewrite (online_ratio_w (fun j m => exp (sub (s j) m)) (fun j => exp (s j)) v t mnext m0 T
             (fun j mm => exp_sub (s j) mm)).
  rewrite shift_ratio. reflexivity.
Qed.

Lemma cond_exp : forall (b : bool) (x m : R),
  (if b then exp (sub x m) else zero) = mul (if b then exp x else zero) (exp (neg m)).
Proof.
  intros b x m. destruct b.
  - apply exp_sub.
  - symmetry. apply mul_0_l.
Qed.

Theorem online_agg_guard : forall (g : nat -> bool) (s v : nat -> R) (t : nat)
    (mnext : nat -> R -> R) (m0 M : R) (T : nat),
  div (st_acc (onlineFoldG g s v t mnext m0 T)) (st_l (onlineFoldG g s v t mnext m0 T))
  = div (sumTo (T * t) (fun j => mul (if g j then exp (sub (s j) M) else zero) (v j)))
        (sumTo (T * t) (fun j => if g j then exp (sub (s j) M) else zero)).
Proof.
  intros g s v t mnext m0 M T. unfold onlineFoldG.
  rewrite (online_ratio_w (fun j m => if g j then exp (sub (s j) m) else zero)
             (fun j => if g j then exp (s j) else zero) v t mnext m0 T
             (fun j mm => cond_exp (g j) (s j) mm)).
  rewrite (sumTo_ext (T * t) (fun j => mul (if g j then exp (sub (s j) M) else zero) (v j))
             (fun j => mul (mul (if g j then exp (s j) else zero) (exp (neg M))) (v j)))
    by (intros j Hj; rewrite cond_exp; reflexivity).
  rewrite (sumTo_ext (T * t) (fun j => if g j then exp (sub (s j) M) else zero)
             (fun j => mul (if g j then exp (s j) else zero) (exp (neg M))))
    by (intros j Hj; apply cond_exp).
  rewrite (ratio_scale (T * t) (fun j => if g j then exp (s j) else zero) v (exp (neg M))
             (exp_ne_zero (neg M))).
  reflexivity.
Qed.

End Online.
