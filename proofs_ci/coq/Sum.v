(* derivc proof library: finite sums / maxima over index ranges, generated
   tensors, ceilDiv, and the core lemmas the rule theorems are built from. *)
Require Import Arith Lia.
Require Import Derivc.Algebra.

Definition ceilDiv (n t : nat) : nat := (n + t - 1) / t.

Lemma ltb_t : forall i n : nat, i < n -> Nat.ltb i n = true.
Proof. intros i n Hi. apply Nat.ltb_lt. exact Hi. Qed.

Lemma ltb_f : forall i n : nat, n <= i -> Nat.ltb i n = false.
Proof. intros i n Hi. apply Nat.ltb_ge. exact Hi. Qed.

Lemma mul_le_mul_r' : forall a b t : nat, a <= b -> a * t <= b * t.
Proof. intros a b t Hab. apply Nat.mul_le_mono_r. exact Hab. Qed.

Lemma ceilDiv_ge : forall N t : nat, 0 < t -> N <= ceilDiv N t * t.
Proof.
  intros N t Ht. unfold ceilDiv.
  pose proof (Nat.div_mod (N + t - 1) t) as Hd.
  pose proof (Nat.mod_upper_bound (N + t - 1) t) as Hm.
  rewrite (Nat.mul_comm ((N + t - 1) / t) t). lia.
Qed.

Section Sums.
Context {R : Type} `{KAlg R}.

Fixpoint sumTo (n : nat) (f : nat -> R) : R :=
  match n with
  | O => zero
  | S k => add (sumTo k f) (f k)
  end.

(* max over a range: an extended value, -inf when the range is empty *)
Fixpoint maxTo (n : nat) (f : nat -> ext R) : ext R :=
  match n with
  | O => ninf
  | S k => max (maxTo k f) (f k)
  end.

(* a generated (producer) tensor of extent n *)
Definition genAt (n : nat) (f : nat -> R) (i : nat) : R :=
  if Nat.ltb i n then f i else zero.

(* a generated tensor of extended values (e.g. a row max): -inf outside its extent *)
Definition genAtX (n : nat) (f : nat -> ext R) (i : nat) : ext R :=
  if Nat.ltb i n then f i else ninf.

Lemma sumTo_O : forall f, sumTo 0 f = zero.
Proof. reflexivity. Qed.

Lemma sumTo_S : forall n f, sumTo (S n) f = add (sumTo n f) (f n).
Proof. reflexivity. Qed.

Lemma maxTo_O : forall f, maxTo 0 f = ninf.
Proof. reflexivity. Qed.

Lemma maxTo_S : forall n f, maxTo (S n) f = max (maxTo n f) (f n).
Proof. reflexivity. Qed.

Lemma sumTo_ext : forall n (f g : nat -> R),
  (forall i, i < n -> f i = g i) -> sumTo n f = sumTo n g.
Proof.
  induction n as [|n IH]; intros f g Hfg.
  - reflexivity.
  - rewrite !sumTo_S.
    rewrite (IH f g) by (intros i Hi; apply Hfg; lia).
    rewrite (Hfg n) by lia. reflexivity.
Qed.

Lemma maxTo_ext : forall n (f g : nat -> ext R),
  (forall i, i < n -> f i = g i) -> maxTo n f = maxTo n g.
Proof.
  induction n as [|n IH]; intros f g Hfg.
  - reflexivity.
  - rewrite !maxTo_S.
    rewrite (IH f g) by (intros i Hi; apply Hfg; lia).
    rewrite (Hfg n) by lia. reflexivity.
Qed.

Lemma sumTo_zero_ext : forall n (f : nat -> R),
  (forall i, i < n -> f i = zero) -> sumTo n f = zero.
Proof.
  induction n as [|n IH]; intros f Hf.
  - reflexivity.
  - rewrite sumTo_S.
    rewrite (IH f) by (intros i Hi; apply Hf; lia).
    rewrite (Hf n) by lia. apply add_zero.
Qed.

Lemma sumTo_const_zero : forall n, sumTo n (fun _ => zero) = zero.
Proof. intros n. apply sumTo_zero_ext. intros i Hi. reflexivity. Qed.

Lemma maxTo_ninf_ext : forall n (f : nat -> ext R),
  (forall i, i < n -> f i = ninf) -> maxTo n f = ninf.
Proof.
  induction n as [|n IH]; intros f Hf.
  - reflexivity.
  - rewrite maxTo_S.
    rewrite (IH f) by (intros i Hi; apply Hf; lia).
    rewrite (Hf n) by lia. apply max_ninf.
Qed.

(* splitting a range [0, a+b) into [0, a) and [a, a+b) *)
Lemma sumTo_app : forall a b (f : nat -> R),
  sumTo (a + b) f = add (sumTo a f) (sumTo b (fun j => f (a + j))).
Proof.
  intros a b f. induction b as [|b IH].
  - rewrite Nat.add_0_r, sumTo_O, add_zero. reflexivity.
  - rewrite Nat.add_succ_r, sumTo_S, sumTo_S, IH, add_assoc. reflexivity.
Qed.

Lemma maxTo_app : forall a b (f : nat -> ext R),
  maxTo (a + b) f = max (maxTo a f) (maxTo b (fun j => f (a + j))).
Proof.
  intros a b f. induction b as [|b IH].
  - rewrite Nat.add_0_r, maxTo_O, max_comm, max_ninf. reflexivity.
  - rewrite Nat.add_succ_r, maxTo_S, maxTo_S, IH, max_assoc. reflexivity.
Qed.

Lemma sumTo_plus : forall n (f g : nat -> R),
  sumTo n (fun j => add (f j) (g j)) = add (sumTo n f) (sumTo n g).
Proof.
  intros n f g. induction n as [|n IH].
  - rewrite !sumTo_O, add_zero. reflexivity.
  - rewrite sumTo_S, sumTo_S, sumTo_S, IH, add_swap4. reflexivity.
Qed.

Lemma sumTo_mul_r : forall n (f : nat -> R) (c : R),
  sumTo n (fun j => mul (f j) c) = mul (sumTo n f) c.
Proof.
  intros n f c. induction n as [|n IH].
  - rewrite !sumTo_O, mul_0_l. reflexivity.
  - rewrite sumTo_S, sumTo_S, IH, add_mul. reflexivity.
Qed.

Lemma sumTo_mul_l : forall n (f : nat -> R) (c : R),
  sumTo n (fun j => mul c (f j)) = mul c (sumTo n f).
Proof.
  intros n f c.
  rewrite (sumTo_ext n (fun j => mul c (f j)) (fun j => mul (f j) c))
    by (intros i Hi; apply mul_comm).
  rewrite sumTo_mul_r. apply mul_comm.
Qed.

(* dropping a tail of zero terms *)
Lemma sumTo_trunc : forall n k (f : nat -> R),
  (forall j, k <= j -> j < n -> f j = zero) -> k <= n -> sumTo n f = sumTo k f.
Proof.
  intros n k f Hz Hk.
  replace n with (k + (n - k)) by lia.
  rewrite sumTo_app.
  rewrite (sumTo_zero_ext (n - k) (fun j => f (k + j)))
    by (intros j Hj; apply Hz; lia).
  apply add_zero.
Qed.

Lemma maxTo_trunc : forall n k (f : nat -> ext R),
  (forall j, k <= j -> j < n -> f j = ninf) -> k <= n -> maxTo n f = maxTo k f.
Proof.
  intros n k f Hz Hk.
  replace n with (k + (n - k)) by lia.
  rewrite maxTo_app.
  rewrite (maxTo_ninf_ext (n - k) (fun j => f (k + j)))
    by (intros j Hj; apply Hz; lia).
  rewrite max_comm. apply max_ninf.
Qed.

(* a max that is -inf has only -inf terms *)
Lemma maxTo_NInf_inv : forall n (f : nat -> ext R),
  maxTo n f = NInf -> forall k, k < n -> f k = NInf.
Proof.
  induction n as [|n IH]; intros f E k Hk.
  - exfalso. inversion Hk.
  - rewrite maxTo_S in E. apply max_NInf_inv in E. destruct E as [E1 E2].
    destruct (Nat.eq_dec k n) as [Ek | Ek].
    + subst k. exact E2.
    + apply IH; [exact E1 | lia].
Qed.

End Sums.
