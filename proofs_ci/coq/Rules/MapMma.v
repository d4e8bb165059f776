(* Rule MAP-MMA: a k-extent that is a multiple of 16 maps onto mma.m16n8k16
   fragments; the hardware adds the 16 products of one fragment in the fixed
   grouping mma16 (two k8 halves, each four pairs). *)
Require Import Arith.
Require Import Derivc.Algebra Derivc.Sum Derivc.Rules.Split Derivc.Rules.Tile.

Section MapMma.
Context {R : Type} `{KAlg R}.

Definition mma16 (g : nat -> R) : R :=
  add (add (add (add (g 0) (g 1)) (add (g 2) (g 3)))
           (add (add (g 4) (g 5)) (add (g 6) (g 7))))
      (add (add (add (g 8) (g 9)) (add (g 10) (g 11)))
           (add (add (g 12) (g 13)) (add (g 14) (g 15)))).

Definition quad (g : nat -> R) : R := add (add (g 0) (g 1)) (add (g 2) (g 3)).
Definition oct (g : nat -> R) : R := add (quad g) (quad (fun k => g (4 + k))).

Lemma mma16_oct : forall g, mma16 g = add (oct g) (oct (fun k => g (8 + k))).
Proof. intros g. reflexivity. Qed.

Lemma sum2 : forall g, sumTo 2 g = add (g 0) (g 1).
Proof.
  intros g. change (add (add zero (g 0)) (g 1) = add (g 0) (g 1)).
  rewrite add_0_l. reflexivity.
Qed.

Lemma sum4 : forall g, sumTo 4 g = quad g.
Proof.
  intros g. change (sumTo (2 + 2) g = quad g).
  rewrite sumTo_split, sum2, sum2. reflexivity.
Qed.

Lemma sum8 : forall g, sumTo 8 g = oct g.
Proof.
  intros g. change (sumTo (4 + 4) g = oct g).
  rewrite sumTo_split, sum4, sum4. reflexivity.
Qed.

Lemma sum16 : forall g, sumTo 16 g = mma16 g.
Proof.
  intros g. change (sumTo (8 + 8) g = mma16 g).
  rewrite sumTo_split, sum8, sum8. reflexivity.
Qed.

Theorem mma_tile : forall (n : nat) (f : nat -> R),
  sumTo (n * 16) f = sumTo n (fun o => mma16 (fun k => f (o * 16 + k))).
Proof.
  intros n f. rewrite sumTo_tile. apply sumTo_ext. intros o Ho. apply sum16.
Qed.

End MapMma.
