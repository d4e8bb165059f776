(* Rule REORDER: finite Fubini. *)
Require Import Derivc.Algebra Derivc.Sum.

Theorem sumTo_swap {R : Type} `{KAlg R} : forall (n m : nat) (f : nat -> nat -> R),
  sumTo n (fun i => sumTo m (fun j => f i j)) = sumTo m (fun j => sumTo n (fun i => f i j)).
Proof.
  intros n m f. induction n as [|n IH].
  - rewrite sumTo_O. symmetry. apply sumTo_const_zero.
  - rewrite sumTo_S, IH.
    exact (eq_sym (sumTo_plus m (fun j => sumTo n (fun i => f i j)) (fun j => f n j))).
Qed.
