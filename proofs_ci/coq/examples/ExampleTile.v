(* Worked example of a per-step obligation (what the compiler's exporter emits
   as StepNN_TILE.v): tile the reduction of a GEMM-like body by 64 with a
   guarded tail, for a dynamic extent N. *)
From Coq Require Import Arith Lia.
Require Import Derivc.All.

Section Step03.
Context {R : Type} {KA : KAlg R}.

(* before:  C[i,k] = sum_{j<N} A[i,j] * B[j,k]
   after :  C[i,k] = sum_{o<ceil(N/64)} sum_{jj<64} (o*64+jj < N ? A[i,o*64+jj]*B[o*64+jj,k] : 0) *)
Theorem step03_TILE : forall (N : nat) (A B : nat -> nat -> R) (i k : nat),
  sumTo N (fun j => mul (A i j) (B j k))
  = sumTo (ceilDiv N 64)
      (fun o => sumTo 64 (fun jj =>
         if Nat.ltb (o * 64 + jj) N
         then mul (A i (o * 64 + jj)) (B (o * 64 + jj) k)
         else zero)).
Proof.
  intros N A B i k.
  apply sumTo_tile_guard.
  apply ceilDiv_ge. lia.
Qed.

(* the same with the pre-packaged ceilDiv form *)
Theorem step03_TILE' : forall (N : nat) (A B : nat -> nat -> R) (i k : nat),
  sumTo N (fun j => mul (A i j) (B j k))
  = sumTo (ceilDiv N 64)
      (fun o => sumTo 64 (fun jj =>
         if Nat.ltb (o * 64 + jj) N
         then mul (A i (o * 64 + jj)) (B (o * 64 + jj) k)
         else zero)).
Proof.
  intros N A B i k. apply sumTo_tile_ceil. lia.
Qed.

(* a static extent that is a multiple of the tile: no guard *)
Theorem step04_TILE : forall (A B : nat -> nat -> R) (i k : nat),
  sumTo (8 * 64) (fun j => mul (A i j) (B j k))
  = sumTo 8 (fun o => sumTo 64 (fun jj => mul (A i (o * 64 + jj)) (B (o * 64 + jj) k))).
Proof.
  intros A B i k. apply sumTo_tile.
Qed.

(* a row max (softmax statistics) tiled with the -inf guard *)
Theorem step05_TILE : forall (N : nat) (S : nat -> nat -> R) (i : nat),
  maxTo N (fun j => Fin (S i j))
  = maxTo (ceilDiv N 64)
      (fun o => maxTo 64 (fun jj => if Nat.ltb (o * 64 + jj) N then Fin (S i (o * 64 + jj)) else ninf)).
Proof.
  intros N S i. apply maxTo_tile_ceil. lia.
Qed.

End Step03.
