(* Rule FUSE: reading a producer's buffer inside its bounds is the producer's expression. *)
Require Import Arith.
Require Import Derivc.Algebra Derivc.Sum.

Theorem gen_inline {R : Type} `{KAlg R} : forall (n : nat) (f : nat -> R) (i : nat),
  i < n -> genAt n f i = f i.
Proof. intros n f i Hi. unfold genAt. rewrite (ltb_t i n Hi). reflexivity. Qed.

Lemma gen_outside {R : Type} `{KAlg R} : forall (n : nat) (f : nat -> R) (i : nat),
  n <= i -> genAt n f i = zero.
Proof. intros n f i Hi. unfold genAt. rewrite (ltb_f i n Hi). reflexivity. Qed.

Theorem genX_inline {R : Type} `{KAlg R} : forall (n : nat) (f : nat -> ext R) (i : nat),
  i < n -> genAtX n f i = f i.
Proof. intros n f i Hi. unfold genAtX. rewrite (ltb_t i n Hi). reflexivity. Qed.
