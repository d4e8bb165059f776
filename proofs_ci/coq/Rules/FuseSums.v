(* Rule FUSE-SUMS: two sums over the same index become one fold carrying both accumulators
   (one kernel writing two outputs: the attention backward's dV and dK).  The fold of two
   independent accumulators from (0, 0) ends at the pair of the sums; its first component is
   the first sum (the definition's value), its second the second (its further output).
   Sums nested in a shared outer sum (GQA's dV / dK: sum over the query heads g of a query-tile
   sum; the rule's `inner`) are the same theorem: the outer sums are the ones fused, f and g the
   inner sums as functions of g, and the inner sums' shared index is a binder's name only. *)
From Coq Require Import Arith Lia.
Require Import Derivc.Algebra Derivc.Sum Derivc.Tactics.

Theorem fold_pair_sum {R : Type} `{KAlg R} : forall (f g : nat -> R) (n : nat),
  foldN (fun k s => (add (fst s) (f k), add (snd s) (g k))) (zero, zero) n = (sumTo n f, sumTo n g).
Proof.
  intros f g n. induction n as [|n IH].
  - reflexivity.
  - simpl. rewrite IH. reflexivity.
Qed.

(* the form a step's obligation uses: any step equal to the pair update (the exporter's lets) *)
Lemma fold_pair_sum_fst {R : Type} `{KAlg R} : forall (step : nat -> R * R -> R * R) (f g : nat -> R) (n : nat),
  (forall k s, step k s = (add (fst s) (f k), add (snd s) (g k))) ->
  fst (foldN step (zero, zero) n) = sumTo n f.
Proof.
  intros step f g n Hs.
  rewrite (foldN_ext step (fun k s => (add (fst s) (f k), add (snd s) (g k))) (zero, zero) (zero, zero) n n
             eq_refl eq_refl (fun k s _ => Hs k s)).
  rewrite fold_pair_sum. reflexivity.
Qed.

Lemma fold_pair_sum_snd {R : Type} `{KAlg R} : forall (step : nat -> R * R -> R * R) (f g : nat -> R) (n : nat),
  (forall k s, step k s = (add (fst s) (f k), add (snd s) (g k))) ->
  snd (foldN step (zero, zero) n) = sumTo n g.
Proof.
  intros step f g n Hs.
  rewrite (foldN_ext step (fun k s => (add (fst s) (f k), add (snd s) (g k))) (zero, zero) (zero, zero) n n
             eq_refl eq_refl (fun k s _ => Hs k s)).
  rewrite fold_pair_sum. reflexivity.
Qed.
