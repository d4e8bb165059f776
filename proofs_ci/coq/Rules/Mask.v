(* Masking: a reduction whose terms vanish on [k, n) stops at k
   (skipping fully-masked tiles, e.g. causal tiles above the diagonal). *)
From Coq Require Import Lia.
Require Import Derivc.Algebra Derivc.Sum.

Theorem sumTo_guard_trunc {R : Type} `{KAlg R} : forall (n k : nat) (f : nat -> R),
  (forall j, k <= j -> j < n -> f j = zero) -> k <= n -> sumTo n f = sumTo k f.
Proof. exact sumTo_trunc. Qed.

(* Masking from below: a reduction whose terms vanish on [0, k) starts at k (the fully-masked
   key tiles below a sliding window).  The wgmma fold printer starts its key-tile loop at the
   first tile the mask reaches (codegen.mappings.cexpr.first_tile_c); the kernel IR has no loop start yet,
   so no per-step obligation uses this theorem. *)
Theorem sumTo_guard_skip_low {R : Type} `{KAlg R} : forall (n k : nat) (f : nat -> R),
  (forall j, j < k -> f j = zero) -> k <= n -> sumTo n f = sumTo (n - k) (fun j => f (k + j)).
Proof.
  intros n k f Hz Hk.
  replace n with (k + (n - k)) at 1 by lia.
  rewrite sumTo_app, (sumTo_zero_ext k f Hz), add_0_l. reflexivity.
Qed.
