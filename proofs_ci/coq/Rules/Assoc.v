(* Rule ASSOC: reassociate / factor reductions. *)
Require Import Derivc.Algebra Derivc.Sum.

Theorem sumTo_factor {R : Type} `{KAlg R} : forall (n : nat) (f : nat -> R) (c : R),
  sumTo n (fun j => mul (f j) c) = mul (sumTo n f) c.
Proof. exact sumTo_mul_r. Qed.

Theorem sumTo_add {R : Type} `{KAlg R} : forall (n : nat) (f g : nat -> R),
  sumTo n (fun j => add (f j) (g j)) = add (sumTo n f) (sumTo n g).
Proof. exact sumTo_plus. Qed.
