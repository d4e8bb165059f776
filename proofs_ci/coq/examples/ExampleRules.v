(* One small obligation per remaining rule, in the exact term syntax the exporter
   emits (see proofs_ci/README.md).  Checked by proofs_ci/check_coq.sh. *)
From Coq Require Import Arith Lia.
Require Import Derivc.All.

Section Steps.
Context {R : Type} {KA : KAlg R}.

Theorem step01_REORDER : forall (M N : nat) (A : nat -> nat -> R),
  sumTo M (fun i => sumTo N (fun j => A i j)) = sumTo N (fun j => sumTo M (fun i => A i j)).
Proof. intros. apply sumTo_swap. Qed.

Theorem step02_SPLIT : forall (A : nat -> R),
  sumTo (96 + 32) (fun j => A j) = add (sumTo 96 (fun j => A j)) (sumTo 32 (fun j => A (96 + j))).
Proof. intros. apply sumTo_split. Qed.

(* FUSE under a reduction binder: the consumer reads the producer inside its bounds *)
Theorem step03_FUSE : forall (N : nat) (X W : nat -> R),
  sumTo N (fun j => mul (genAt N (fun p => exp (X p)) j) (W j))
  = sumTo N (fun j => mul (exp (X j)) (W j)).
Proof.
  intros. apply sumTo_ext. intros j Hj. rewrite gen_inline by lia. reflexivity.
Qed.

Theorem step04_ASSOC : forall (N : nat) (A : nat -> R) (c : R),
  sumTo N (fun j => mul (A j) c) = mul (sumTo N (fun j => A j)) c.
Proof. intros. apply sumTo_factor. Qed.

Theorem step05_SPLIT_SOFTMAX : forall (N : nat) (S V : nat -> R) (m : R),
  sumTo N (fun j => mul (softmaxAt N (fun k => S k) j) (V j))
  = div (sumTo N (fun j => mul (exp (sub (S j) m)) (V j))) (sumTo N (fun j => exp (sub (S j) m))).
Proof. intros. apply softmax_split. Qed.

(* causal MASK: for query row i, keys j > i contribute 0, so the sum stops at i+1 *)
Theorem step06_MASK : forall (N i : nat) (P : nat -> R),
  i < N ->
  sumTo N (fun j => if Nat.leb j i then P j else zero) = sumTo (i + 1) (fun j => if Nat.leb j i then P j else zero).
Proof.
  intros N i P Hi. apply sumTo_guard_trunc.
  - intros j Hj1 Hj2. destruct (Nat.leb j i) eqn:E; [apply Nat.leb_le in E; lia | reflexivity].
  - lia.
Qed.

Theorem step07_MAP_MMA : forall (A B : nat -> nat -> R) (i k : nat),
  sumTo (4 * 16) (fun j => mul (A i j) (B j k))
  = sumTo 4 (fun o => mma16 (fun kk => mul (A i (o * 16 + kk)) (B (o * 16 + kk) k))).
Proof. intros. apply mma_tile. Qed.

Theorem step08_CACHE : forall (A : nat -> nat -> R) (r0 c0 i j : nat),
  i < 64 -> j < 32 -> tileCopy2 A r0 c0 64 32 i j = A (r0 + i) (c0 + j).
Proof. intros. apply cache_read2; lia. Qed.

End Steps.
