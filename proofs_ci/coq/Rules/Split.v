(* Rule SPLIT: split a reduction range [0, a+b) at a. *)
Require Import Derivc.Algebra Derivc.Sum.

Theorem sumTo_split {R : Type} `{KAlg R} : forall (a b : nat) (f : nat -> R),
  sumTo (a + b) f = add (sumTo a f) (sumTo b (fun j => f (a + j))).
Proof. exact sumTo_app. Qed.
