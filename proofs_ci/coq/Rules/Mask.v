(* Masking: a reduction whose terms vanish on [k, n) stops at k
   (skipping fully-masked tiles, e.g. causal tiles above the diagonal). *)
Require Import Derivc.Algebra Derivc.Sum.

Theorem sumTo_guard_trunc {R : Type} `{KAlg R} : forall (n k : nat) (f : nat -> R),
  (forall j, k <= j -> j < n -> f j = zero) -> k <= n -> sumTo n f = sumTo k f.
Proof. exact sumTo_trunc. Qed.
