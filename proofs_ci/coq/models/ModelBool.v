(* A second, finite model of the algebra (the field with two elements, exp := 1, max := or),
   in two variants that differ only in `undef`.  It shows that the algebra's hypotheses are
   consistent without any axiom, and that the undefined operations on -infinity are not
   provable facts:  exp (-inf - -inf) = 1 fails in one model, and so does every other
   statement about `undef`.  exp (-inf - m) = 0 holds by definition (never <> 0). *)
From Coq Require Import Bool.
Require Import Derivc.All.

Definition gf2 (u : bool) : KAlg bool.
Proof.
  refine {| zero := false; one := true; add := xorb; mul := andb; neg := fun a => a;
            inv := fun a => a; exp := fun _ => true; rmax := orb; undef := u |}.
  all: intros; repeat match goal with b : bool |- _ => destruct b end; try reflexivity.
  all: try discriminate.
  all: match goal with H : _ <> _ |- _ => exfalso; apply H; reflexivity end.
Defined.

(* -inf - -inf is not 0: exp (-inf - -inf) = 1 is false when undef = 0 *)
Lemma ninf_minus_ninf_not_provable :
  ~ (forall (A : Type) (K : KAlg A), expd (R := A) ninf ninf = one).
Proof. intros H. specialize (H bool (gf2 false)). discriminate H. Qed.

(* exp (x - (-inf)) (a never-updated running max) is not a value either *)
Lemma exp_minus_ninf_not_provable :
  ~ (forall (A : Type) (K : KAlg A) (x : A), expd (Fin x) ninf = exp x).
Proof. intros H. specialize (H bool (gf2 false) true). discriminate H. Qed.

(* exp (-inf - m) = 0 in every model, so exp (-inf - m) <> 0 is refutable *)
Lemma exp_ninf_minus_is_zero : forall (A : Type) (K : KAlg A) (m : A), expd ninf (Fin m) = zero.
Proof. reflexivity. Qed.

(* the rescale convention rescale(-inf, -inf) = 1 is what masked tiles use *)
Lemma rescale_ninf_ninf : forall (A : Type) (K : KAlg A), rescale (R := A) ninf ninf = one.
Proof. reflexivity. Qed.
