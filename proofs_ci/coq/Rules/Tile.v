(* Rule TILE: strip-mine a range into (outer, inner); guarded tails for
   dynamic extents; index arithmetic facts for tiled generators. *)
Require Import Arith Lia.
Require Import Derivc.Algebra Derivc.Sum.

Theorem sumTo_tile {R : Type} `{KAlg R} : forall (n t : nat) (f : nat -> R),
  sumTo (n * t) f = sumTo n (fun o => sumTo t (fun i => f (o * t + i))).
Proof.
  intros n t f. induction n as [|n IH].
  - rewrite Nat.mul_0_l, !sumTo_O. reflexivity.
  - rewrite Nat.mul_succ_l, sumTo_app, IH, sumTo_S. reflexivity.
Qed.

Theorem maxTo_tile {R : Type} `{KAlg R} : forall (n t : nat) (f : nat -> ext R),
  maxTo (n * t) f = maxTo n (fun o => maxTo t (fun i => f (o * t + i))).
Proof.
  intros n t f. induction n as [|n IH].
  - rewrite Nat.mul_0_l, !maxTo_O. reflexivity.
  - rewrite Nat.mul_succ_l, maxTo_app, IH, maxTo_S. reflexivity.
Qed.

Theorem sumTo_tile_guard {R : Type} `{KAlg R} : forall (N n t : nat) (f : nat -> R),
  N <= n * t ->
  sumTo N f =
  sumTo n (fun o => sumTo t (fun i => if Nat.ltb (o * t + i) N then f (o * t + i) else zero)).
Proof.
  intros N n t f HN.
  transitivity (sumTo (n * t) (fun p => if Nat.ltb p N then f p else zero)).
  - rewrite (sumTo_trunc (n * t) N (fun p => if Nat.ltb p N then f p else zero)).
    + apply sumTo_ext. intros i Hi. rewrite (ltb_t i N Hi). reflexivity.
    + intros j Hj1 Hj2. rewrite (ltb_f j N Hj1). reflexivity.
    + exact HN.
  - exact (sumTo_tile n t (fun p => if Nat.ltb p N then f p else zero)).
Qed.

Theorem maxTo_tile_guard {R : Type} `{KAlg R} : forall (N n t : nat) (f : nat -> ext R),
  N <= n * t ->
  maxTo N f =
  maxTo n (fun o => maxTo t (fun i => if Nat.ltb (o * t + i) N then f (o * t + i) else ninf)).
Proof.
  intros N n t f HN.
  transitivity (maxTo (n * t) (fun p => if Nat.ltb p N then f p else ninf)).
  - rewrite (maxTo_trunc (n * t) N (fun p => if Nat.ltb p N then f p else ninf)).
    + apply maxTo_ext. intros i Hi. rewrite (ltb_t i N Hi). reflexivity.
    + intros j Hj1 Hj2. rewrite (ltb_f j N Hj1). reflexivity.
    + exact HN.
  - exact (maxTo_tile n t (fun p => if Nat.ltb p N then f p else ninf)).
Qed.

(* the usual instance: ceilDiv N t outer iterations *)
Theorem sumTo_tile_ceil {R : Type} `{KAlg R} : forall (N t : nat) (f : nat -> R),
  0 < t ->
  sumTo N f =
  sumTo (ceilDiv N t) (fun o => sumTo t (fun i => if Nat.ltb (o * t + i) N then f (o * t + i) else zero)).
Proof.
  intros N t f Ht. apply sumTo_tile_guard. apply ceilDiv_ge. exact Ht.
Qed.

Theorem maxTo_tile_ceil {R : Type} `{KAlg R} : forall (N t : nat) (f : nat -> ext R),
  0 < t ->
  maxTo N f =
  maxTo (ceilDiv N t) (fun o => maxTo t (fun i => if Nat.ltb (o * t + i) N then f (o * t + i) else ninf)).
Proof.
  intros N t f Ht. apply maxTo_tile_guard. apply ceilDiv_ge. exact Ht.
Qed.

(* a tiled generator writes position p as (p / t, p mod t) *)
Theorem gen_tile : forall {A : Type} (f : nat -> A) (t p : nat),
  0 < t -> f (p / t * t + p mod t) = f p.
Proof.
  intros A f t p Ht. f_equal.
  rewrite (Nat.mul_comm (p / t) t). symmetry. apply Nat.div_mod. lia.
Qed.

Theorem tile_cover : forall (p N t : nat),
  p < N -> 0 < t -> p / t < ceilDiv N t /\ p mod t < t.
Proof.
  intros p N t Hp Ht. split.
  - unfold ceilDiv.
    pose proof (Nat.div_mod p t) as H1.
    pose proof (Nat.div_mod (N + t - 1) t) as H2.
    pose proof (Nat.mod_upper_bound (N + t - 1) t) as H3.
    destruct (le_lt_dec ((N + t - 1) / t) (p / t)) as [Hc | Hc].
    + exfalso. pose proof (Nat.mul_le_mono_l _ _ t Hc) as H5.
      pose proof (Nat.mod_upper_bound p t) as H4. lia.
    + exact Hc.
  - apply Nat.mod_upper_bound. lia.
Qed.

Theorem tile_inj : forall (o i o' i' t : nat),
  o * t + i = o' * t + i' -> i < t -> i' < t -> o = o' /\ i = i'.
Proof.
  intros o i o' i' t Heq Hi Hi'.
  assert (Ho : o = o').
  { destruct (lt_eq_lt_dec o o') as [[Hlt | Hoo] | Hgt].
    - exfalso. pose proof (mul_le_mul_r' (S o) o' t Hlt) as Hm.
      rewrite Nat.mul_succ_l in Hm. lia.
    - exact Hoo.
    - exfalso. pose proof (mul_le_mul_r' (S o') o t Hgt) as Hm.
      rewrite Nat.mul_succ_l in Hm. lia. }
  subst o'. split.
  - reflexivity.
  - lia.
Qed.
