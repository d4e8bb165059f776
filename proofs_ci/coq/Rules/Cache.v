(* Rule CACHE: a staged tile copy (shared memory / registers) reads back the source. *)
Require Import Arith.
Require Import Derivc.Algebra Derivc.Sum.

Section Cache.
Context {R : Type} `{KAlg R}.

Definition tileCopy (A : nat -> R) (base t : nat) : nat -> R :=
  fun i => if Nat.ltb i t then A (base + i) else zero.

Definition tileCopy2 (A : nat -> nat -> R) (r0 c0 th tw : nat) : nat -> nat -> R :=
  fun i j => if Nat.ltb i th then (if Nat.ltb j tw then A (r0 + i) (c0 + j) else zero)
             else zero.

Theorem cache_read : forall (A : nat -> R) (base t i : nat),
  i < t -> tileCopy A base t i = A (base + i).
Proof. intros A base t i Hi. unfold tileCopy. rewrite (ltb_t i t Hi). reflexivity. Qed.

Theorem cache_read2 : forall (A : nat -> nat -> R) (r0 c0 th tw i j : nat),
  i < th -> j < tw -> tileCopy2 A r0 c0 th tw i j = A (r0 + i) (c0 + j).
Proof.
  intros A r0 c0 th tw i j Hi Hj. unfold tileCopy2.
  rewrite (ltb_t i th Hi), (ltb_t j tw Hj). reflexivity.
Qed.

End Cache.
