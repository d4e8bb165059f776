(* Rule ONLINE-AGG: flash-attention style tile-by-tile softmax aggregation with a
   running max m (an extended value: it starts at -inf), running denominator l and running
   accumulator acc.  The new running max is a function mnext of (tile index, old max).
   Exactness does not need it to be the true max, but it must be DEFINED: it may stay -inf
   only while every key seen so far is masked, and never fall back to -inf (hypothesis
   `online_max_ok`).  A running max that is never updated, or a rescale against a stale max,
   evaluates exp (s - (-inf)) (`undef`) and cannot be proved.
   Fully masked rows: when every key is masked the fold gives acc / l = 0 / 0 = 0 (the
   convention x / 0 = 0 of the interpreter and the kernels); `online_agg_guard` states it. *)
Require Import Arith Lia.
Require Import Derivc.Algebra Derivc.Sum Derivc.Rules.SplitSoftmax.

Record OState (R : Type) := mkOState { st_m : ext R; st_l : R; st_acc : R }.
Arguments mkOState {R} _ _ _.
Arguments st_m {R} _.
Arguments st_l {R} _.
Arguments st_acc {R} _.

Section Online.
Context {R : Type} `{KAlg R}.

(* generic step: w j m' is the (possibly masked) weight of score j under max m' *)
Definition onlineStepW (w : nat -> ext R -> R) (v : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (o : nat) (st : OState R) : OState R :=
  mkOState (mnext o (st_m st))
    (add (mul (st_l st) (rescale (st_m st) (mnext o (st_m st))))
         (sumTo t (fun i => w (o * t + i) (mnext o (st_m st)))))
    (add (mul (st_acc st) (rescale (st_m st) (mnext o (st_m st))))
         (sumTo t (fun i => mul (w (o * t + i) (mnext o (st_m st))) (v (o * t + i))))).

Fixpoint onlineFoldW (w : nat -> ext R -> R) (v : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 : ext R) (T : nat) : OState R :=
  match T with
  | O => mkOState m0 zero zero
  | S T' => onlineStepW w v t mnext T' (onlineFoldW w v t mnext m0 T')
  end.

(* masked: weight (if g j then exp (s j - m') else 0) *)
Definition onlineFoldG (g : nat -> bool) (s v : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 : ext R) (T : nat) : OState R :=
  onlineFoldW (fun j m => if g j then expd (Fin (s j)) m else zero) v t mnext m0 T.

(* unmasked *)
Definition onlineFold (s v : nat -> R) (t : nat) (mnext : nat -> ext R -> ext R) (m0 : ext R)
    (T : nat) : OState R :=
  onlineFoldG (fun _ => true) s v t mnext m0 T.

(* the running max is defined: -inf only after fully masked tiles, and never back to -inf *)
Definition online_max_ok (g : nat -> bool) (t : nat) (mnext : nat -> ext R -> ext R) (T : nat)
  : Prop :=
  forall o m, o < T -> mnext o m = NInf -> m = NInf /\ forall i, i < t -> g (o * t + i) = false.

Definition eg (g : nat -> bool) (s : nat -> R) (j : nat) : R := if g j then exp (s j) else zero.

(* exp (-x): the scale of the running sums under running max Fin x *)
Definition onlineInv (g : nat -> bool) (s v : nat -> R) (n : nat) (st : OState R) : Prop :=
  match st_m st with
  | NInf => st_l st = zero /\ st_acc st = zero /\ forall j, j < n -> g j = false
  | Fin x => st_l st = mul (exp (neg x)) (sumTo n (eg g s))
             /\ st_acc st = mul (exp (neg x)) (sumTo n (fun j => mul (eg g s j) (v j)))
  end.

Lemma rescale_step : forall m m' S X : R,
  add (mul (mul (exp (neg m)) S) (exp (sub m m'))) (mul X (exp (neg m')))
  = mul (exp (neg m')) (add S X).
Proof.
  intros m m' S X.
  rewrite (mul_rot (exp (neg m)) S (exp (sub m m'))), (exp_rescale m m').
  rewrite (mul_comm X (exp (neg m'))), <- (mul_add (exp (neg m')) S X).
  reflexivity.
Qed.

Lemma sumTo_masked : forall (g : nat -> bool) (f : nat -> R) (n : nat),
  (forall j, j < n -> g j = false) -> sumTo n (fun j => if g j then f j else zero) = zero.
Proof.
  intros g f n Hg. apply sumTo_zero_ext. intros j Hj. rewrite (Hg j Hj). reflexivity.
Qed.

Lemma cond_exp : forall (b : bool) (x m : R),
  (if b then exp (sub x m) else zero) = mul (if b then exp x else zero) (exp (neg m)).
Proof.
  intros b x m. destruct b.
  - apply exp_sub.
  - symmetry. apply mul_0_l.
Qed.

Lemma weight_fin : forall (g : nat -> bool) (s : nat -> R) (j : nat) (y : R),
  (if g j then expd (Fin (s j)) (Fin y) else zero) = mul (eg g s j) (exp (neg y)).
Proof.
  intros g s j y. unfold eg. destruct (g j).
  - apply exp_sub.
  - symmetry. apply mul_0_l.
Qed.

Lemma onlineFoldG_S : forall (g : nat -> bool) (s v : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 : ext R) (T : nat),
  onlineFoldG g s v t mnext m0 (S T)
  = onlineStepW (fun j m => if g j then expd (Fin (s j)) m else zero) v t mnext T
      (onlineFoldG g s v t mnext m0 T).
Proof. reflexivity. Qed.

Lemma online_invariant_g : forall (g : nat -> bool) (s v : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 : ext R) (T : nat),
  online_max_ok g t mnext T -> onlineInv g s v 0 (mkOState m0 zero zero) ->
  forall T', T' <= T -> onlineInv g s v (T' * t) (onlineFoldG g s v t mnext m0 T').
Proof.
  intros g s v t mnext m0 T Hok H0 T' HT'. induction T' as [|T' IH].
  - exact H0.
  - specialize (IH ltac:(lia)). rewrite onlineFoldG_S.
    set (st := onlineFoldG g s v t mnext m0 T') in *.
    unfold onlineInv in *. unfold onlineStepW. cbn [st_m st_l st_acc].
    rewrite Nat.mul_succ_l. revert IH.
    destruct (mnext T' (st_m st)) as [y|] eqn:Em; destruct (st_m st) as [x|] eqn:Ex;
      intros IH; cbv beta iota in IH |- *.
    + (* finite -> finite: the usual rescale *)
      destruct IH as [Hl Ha].
      rewrite rescale_fin, Hl, Ha, !sumTo_app. cbv beta.
      rewrite (sumTo_ext t (fun i => if g (T' * t + i) then expd (Fin (s (T' * t + i))) (Fin y)
                                      else zero)
                 (fun i => mul (eg g s (T' * t + i)) (exp (neg y))))
        by (intros i Hi; apply weight_fin).
      rewrite (sumTo_ext t (fun i => mul (if g (T' * t + i) then expd (Fin (s (T' * t + i))) (Fin y)
                                          else zero) (v (T' * t + i)))
                 (fun i => mul (mul (eg g s (T' * t + i)) (v (T' * t + i))) (exp (neg y))))
        by (intros i Hi; rewrite weight_fin; apply mul_rot).
      rewrite !sumTo_mul_r, !rescale_step. split; reflexivity.
    + (* -inf -> finite: nothing seen so far, the first unmasked tile *)
      destruct IH as [Hl [Ha Hm]].
      rewrite Hl, Ha, rescale_ninf_l, !mul_0_l, !add_0_l, !sumTo_app. cbv beta.
      rewrite (sumTo_zero_ext (T' * t) (eg g s))
        by (intros j Hj; unfold eg; rewrite (Hm j Hj); reflexivity).
      rewrite (sumTo_zero_ext (T' * t) (fun j => mul (eg g s j) (v j)))
        by (intros j Hj; unfold eg; rewrite (Hm j Hj); apply mul_0_l).
      rewrite !add_0_l.
      rewrite (sumTo_ext t (fun i => if g (T' * t + i) then expd (Fin (s (T' * t + i))) (Fin y)
                                      else zero)
                 (fun i => mul (eg g s (T' * t + i)) (exp (neg y))))
        by (intros i Hi; apply weight_fin).
      rewrite (sumTo_ext t (fun i => mul (if g (T' * t + i) then expd (Fin (s (T' * t + i))) (Fin y)
                                          else zero) (v (T' * t + i)))
                 (fun i => mul (mul (eg g s (T' * t + i)) (v (T' * t + i))) (exp (neg y))))
        by (intros i Hi; rewrite weight_fin; apply mul_rot).
      rewrite !sumTo_mul_r, (mul_comm (exp (neg y))), (mul_comm (exp (neg y))).
      unfold eg. split; reflexivity.
    + (* finite -> -inf: excluded *)
      exfalso. destruct (Hok T' (Fin x) ltac:(lia) Em) as [E _]. discriminate E.
    + (* -inf -> -inf: a fully masked tile *)
      destruct IH as [Hl [Ha Hm]].
      destruct (Hok T' NInf ltac:(lia) Em) as [_ Hg].
      rewrite Hl, Ha, !mul_0_l, !add_0_l.
      split; [| split].
      * apply sumTo_zero_ext. intros i Hi. rewrite (Hg i Hi). reflexivity.
      * apply sumTo_zero_ext. intros i Hi. rewrite (Hg i Hi). apply mul_0_l.
      * intros j Hj. destruct (Nat.lt_ge_cases j (T' * t)) as [Hlt | Hge].
        -- exact (Hm j Hlt).
        -- replace j with (T' * t + (j - T' * t)) by lia. apply Hg. lia.
Qed.

Lemma onlineInv_init : forall (g : nat -> bool) (s v : nat -> R) (m0 : ext R),
  onlineInv g s v 0 (mkOState m0 zero zero).
Proof.
  intros g s v [x|]; unfold onlineInv; cbn [st_m st_l st_acc].
  - rewrite !sumTo_O, mul_0_r. split; reflexivity.
  - split; [reflexivity | split; [reflexivity | intros j Hj; inversion Hj]].
Qed.

Theorem online_invariant : forall (g : nat -> bool) (s v : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 : ext R) (T : nat),
  online_max_ok g t mnext T ->
  onlineInv g s v (T * t) (onlineFoldG g s v t mnext m0 T).
Proof.
  intros g s v t mnext m0 T Hok.
  exact (online_invariant_g g s v t mnext m0 T Hok (onlineInv_init g s v m0) T (le_n T)).
Qed.

Lemma div_zero_zero : div zero zero = zero.
Proof. unfold div. apply mul_0_l. Qed.

(* ONLINE-AGG, masked: the fold's acc / l is the shifted quotient for ANY valid shift M
   (-inf only when every key is masked), and a row with every key masked gives 0. *)
Theorem online_agg_guard : forall (g : nat -> bool) (s v : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 M : ext R) (T : nat),
  online_max_ok g t mnext T ->
  (forall j, j < T * t -> M = NInf -> g j = false) ->
  div (st_acc (onlineFoldG g s v t mnext m0 T)) (st_l (onlineFoldG g s v t mnext m0 T))
  = div (sumTo (T * t) (fun j => mul (if g j then expd (Fin (s j)) M else zero) (v j)))
        (sumTo (T * t) (fun j => if g j then expd (Fin (s j)) M else zero))
  /\ ((forall j, j < T * t -> g j = false) ->
      div (st_acc (onlineFoldG g s v t mnext m0 T)) (st_l (onlineFoldG g s v t mnext m0 T))
      = zero).
Proof.
  intros g s v t mnext m0 M T Hok HM.
  pose proof (online_invariant g s v t mnext m0 T Hok) as Hinv. unfold onlineInv in Hinv.
  assert (Hmasked : (forall j, j < T * t -> g j = false) ->
            div (st_acc (onlineFoldG g s v t mnext m0 T)) (st_l (onlineFoldG g s v t mnext m0 T))
            = zero).
  { intros Hg. destruct (st_m (onlineFoldG g s v t mnext m0 T)) as [x|].
    - destruct Hinv as [Hl Ha]. rewrite Hl, Ha.
      rewrite (sumTo_zero_ext _ (eg g s)) by (intros j Hj; unfold eg; rewrite (Hg j Hj); reflexivity).
      rewrite (sumTo_zero_ext _ (fun j => mul (eg g s j) (v j)))
        by (intros j Hj; unfold eg; rewrite (Hg j Hj); apply mul_0_l).
      rewrite mul_0_r. apply div_zero_zero.
    - destruct Hinv as [Hl [Ha _]]. rewrite Hl, Ha. apply div_zero_zero. }
  split; [| exact Hmasked].
  destruct M as [mu|].
  - (* a finite shift *)
    rewrite (sumTo_ext (T * t) (fun j => mul (if g j then expd (Fin (s j)) (Fin mu) else zero) (v j))
               (fun j => mul (mul (eg g s j) (exp (neg mu))) (v j)))
      by (intros j Hj; rewrite weight_fin; reflexivity).
    rewrite (sumTo_ext (T * t) (fun j => if g j then expd (Fin (s j)) (Fin mu) else zero)
               (fun j => mul (eg g s j) (exp (neg mu))))
      by (intros j Hj; apply weight_fin).
    rewrite (ratio_scale (T * t) (eg g s) v (exp (neg mu)) (exp_ne_zero (neg mu))).
    destruct (st_m (onlineFoldG g s v t mnext m0 T)) as [x|].
    + destruct Hinv as [Hl Ha]. rewrite Hl, Ha. apply div_cancel_l. apply exp_ne_zero.
    + destruct Hinv as [Hl [Ha Hg]]. rewrite Hl, Ha, div_zero_zero.
      rewrite (sumTo_zero_ext _ (eg g s)) by (intros j Hj; unfold eg; rewrite (Hg j Hj); reflexivity).
      rewrite (sumTo_zero_ext _ (fun j => mul (eg g s j) (v j)))
        by (intros j Hj; unfold eg; rewrite (Hg j Hj); apply mul_0_l).
      symmetry. apply div_zero_zero.
  - (* shift -inf: every key is masked, both sides are 0 / 0 *)
    assert (Hg : forall j, j < T * t -> g j = false) by (intros j Hj; exact (HM j Hj eq_refl)).
    rewrite (Hmasked Hg).
    rewrite (sumTo_zero_ext _ (fun j => mul (if g j then expd (Fin (s j)) NInf else zero) (v j)))
      by (intros j Hj; rewrite (Hg j Hj); apply mul_0_l).
    rewrite (sumTo_zero_ext _ (fun j => if g j then expd (Fin (s j)) NInf else zero))
      by (intros j Hj; rewrite (Hg j Hj); reflexivity).
    symmetry. apply div_zero_zero.
Qed.

(* ONLINE-AGG, unmasked: every tile has live keys, so the running max must be finite *)
Theorem online_agg : forall (s v : nat -> R) (t : nat) (mnext : nat -> ext R -> ext R)
    (m0 : ext R) (M : R) (T : nat),
  (forall o m, o < T -> mnext o m <> NInf) ->
  div (st_acc (onlineFold s v t mnext m0 T)) (st_l (onlineFold s v t mnext m0 T))
  = div (sumTo (T * t) (fun j => mul (exp (sub (s j) M)) (v j)))
        (sumTo (T * t) (fun j => exp (sub (s j) M))).
Proof.
  intros s v t mnext m0 M T Hm. unfold onlineFold.
  destruct (online_agg_guard (fun _ => true) s v t mnext m0 (Fin M) T) as [E _].
  - intros o m Ho E. exfalso. exact (Hm o m Ho E).
  - intros j Hj E. discriminate E.
  - rewrite E. reflexivity.
Qed.


(* ONLINE-AGG without the V product (row softmax in one streaming pass): the fold carries only
   the running max m and the running sum l, and one element of the softmax is
   exp (a - m) / l.  The pair fold is the (m, l) half of onlineFoldG (acc is never read). *)
Definition onlineStep2 (g : nat -> bool) (s : nat -> R) (t : nat) (mnext : nat -> ext R -> ext R)
    (o : nat) (st : ext R * R) : ext R * R :=
  (mnext o (fst st),
   add (mul (snd st) (rescale (fst st) (mnext o (fst st))))
       (sumTo t (fun i => if g (o * t + i) then expd (Fin (s (o * t + i))) (mnext o (fst st)) else zero))).

Fixpoint onlineFold2 (g : nat -> bool) (s : nat -> R) (t : nat) (mnext : nat -> ext R -> ext R)
    (m0 : ext R) (T : nat) : ext R * R :=
  match T with
  | O => (m0, zero)
  | S T' => onlineStep2 g s t mnext T' (onlineFold2 g s t mnext m0 T')
  end.

Lemma onlineFoldG_pair : forall (g : nat -> bool) (s v : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 : ext R) (T : nat),
  onlineFold2 g s t mnext m0 T
  = (st_m (onlineFoldG g s v t mnext m0 T), st_l (onlineFoldG g s v t mnext m0 T)).
Proof.
  intros g s v t mnext m0 T. induction T as [|T IH]; [reflexivity|].
  cbn [onlineFold2]. rewrite IH, onlineFoldG_S. reflexivity.
Qed.

(* one element of the softmax, any numerator score a: exp (a - m) / l of the fold equals
   exp (a - M) / Σ exp (s - M) for any defined shift M, given one live key (the element's own
   column is one: a row with an output has a live key) *)
Theorem online_softmax : forall (g : nat -> bool) (s : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 M : ext R) (T j0 : nat) (a : R),
  online_max_ok g t mnext T ->
  (forall j, j < T * t -> M = NInf -> g j = false) ->
  j0 < T * t -> g j0 = true ->
  div (expd (Fin a) (fst (onlineFold2 g s t mnext m0 T))) (snd (onlineFold2 g s t mnext m0 T))
  = div (expd (Fin a) M) (sumTo (T * t) (fun j => if g j then expd (Fin (s j)) M else zero)).
Proof.
  intros g s t mnext m0 M T j0 a Hok HM Hj0 Hg0.
  rewrite (onlineFoldG_pair g s (fun _ => zero) t mnext m0 T). cbn [fst snd].
  pose proof (online_invariant g s (fun _ => zero) t mnext m0 T Hok) as Hinv. unfold onlineInv in Hinv.
  destruct M as [mu|]; [| rewrite (HM j0 Hj0 eq_refl) in Hg0; discriminate Hg0].
  rewrite (sumTo_ext (T * t) (fun j => if g j then expd (Fin (s j)) (Fin mu) else zero)
             (fun j => mul (eg g s j) (exp (neg mu))))
    by (intros j Hj; apply weight_fin).
  rewrite sumTo_mul_r.
  destruct (st_m (onlineFoldG g s (fun _ => zero) t mnext m0 T)) as [x|].
  - destruct Hinv as [Hl _]. rewrite Hl, !expd_fin, !exp_sub.
    rewrite (mul_comm (sumTo (T * t) (eg g s)) (exp (neg mu))).
    rewrite (mul_comm (exp a) (exp (neg x))), (mul_comm (exp a) (exp (neg mu))).
    rewrite !div_cancel_l by apply exp_ne_zero. reflexivity.
  - destruct Hinv as [_ [_ Hm]]. rewrite (Hm j0 Hj0) in Hg0. discriminate Hg0.
Qed.

End Online.
