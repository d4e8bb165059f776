(* Rule SPLIT-K (split-K GEMM): a sum's tile loop divided among S splits, each adding its own
   tiles into a partial sum; the combine adds the S partial sums in split order.
   sumTo_chunks: S consecutive chunks of any sizes (empty ones included) cover the range;
   sumTo_strided: split s adds the indices S * o + s (o < ceilDiv (n - s) S);
   sumTo_split_k_strided: the rule's instance over ceilDiv N t tiles of t: split s adds the
   tiles S * o + s, o < ceilDiv (N - t * s) (t * S) (the per-step obligation). *)
Require Import Arith Lia.
Require Import Derivc.Algebra Derivc.Sum Derivc.Rules.Split Derivc.Rules.Tile Derivc.Rules.Reorder.

(* o < ceilDiv x d exactly when the o-th block of d starts below x *)
Lemma ceilDiv_lt_iff : forall o x d : nat, 0 < d -> (o < ceilDiv x d <-> o * d < x).
Proof.
  intros o x d Hd. unfold ceilDiv. split.
  - intros Ho. destruct (le_lt_dec x (o * d)) as [Hx | Hx]; [exfalso | exact Hx].
    assert (Hq : (x + d - 1) / d < S o).
    { apply Nat.div_lt_upper_bound; [lia | ]. rewrite Nat.mul_succ_r. lia. }
    lia.
  - intros Hx. apply (Nat.div_le_lower_bound (x + d - 1) d (S o)); [lia | ].
    rewrite Nat.mul_succ_r. lia.
Qed.

(* two extents with the same members are equal *)
Lemma nat_eq_members : forall a b : nat, (forall o, o < a <-> o < b) -> a = b.
Proof.
  intros a b Hab. destruct (lt_eq_lt_dec a b) as [[H1 | H1] | H1].
  - exfalso. apply (proj2 (Hab a)) in H1. lia.
  - exact H1.
  - exfalso. apply (proj1 (Hab b)) in H1. lia.
Qed.

Lemma ceilDiv_ceilDiv_sub : forall N t S s : nat, 0 < t -> 0 < S ->
  ceilDiv (ceilDiv N t - s) S = ceilDiv (N - t * s) (t * S).
Proof.
  intros N t S s Ht HS. apply nat_eq_members. intros o.
  rewrite (ceilDiv_lt_iff o _ S HS), (ceilDiv_lt_iff o _ (t * S)) by lia.
  assert (E : o * S < ceilDiv N t - s <-> o * S + s < ceilDiv N t) by lia.
  rewrite E, (ceilDiv_lt_iff (o * S + s) N t Ht).
  replace ((o * S + s) * t) with (o * (t * S) + t * s) by ring. lia.
Qed.

Section SplitK.
Context {R : Type} `{KAlg R}.

(* S consecutive chunks [b s, b (s + 1)) of any sizes, empty ones included *)
Theorem sumTo_chunks : forall (S : nat) (b : nat -> nat) (f : nat -> R),
  b 0 = 0 -> (forall s, s < S -> b s <= b (s + 1)) ->
  sumTo (b S) f = sumTo S (fun s => sumTo (b (s + 1) - b s) (fun i => f (b s + i))).
Proof.
  intros S b f H0 Hmono. induction S as [|S IH].
  - rewrite H0. reflexivity.
  - rewrite sumTo_S, <- IH by (intros s Hs; apply Hmono; lia).
    replace (b (Datatypes.S S)) with (b S + (b (S + 1) - b S))
      by (pose proof (Hmono S (Nat.lt_succ_diag_r S)); replace (S + 1) with (Datatypes.S S) in * by lia; lia).
    apply sumTo_split.
Qed.

(* split s adds the indices S * o + s below n *)
Theorem sumTo_strided : forall (S n : nat) (f : nat -> R), 0 < S ->
  sumTo n f = sumTo S (fun s => sumTo (ceilDiv (n - s) S) (fun o => f (S * o + s))).
Proof.
  intros S n f HS.
  set (g := fun p => if Nat.ltb p n then f p else zero).
  transitivity (sumTo (ceilDiv n S * S) g).
  { rewrite (sumTo_trunc (ceilDiv n S * S) n g).
    - apply sumTo_ext. intros i Hi. unfold g. rewrite (ltb_t i n Hi). reflexivity.
    - intros j Hj1 Hj2. unfold g. rewrite (ltb_f j n Hj1). reflexivity.
    - apply ceilDiv_ge. exact HS. }
  rewrite sumTo_tile, (sumTo_swap (ceilDiv n S) S (fun o i => g (o * S + i))).
  apply sumTo_ext. intros s Hs.
  assert (Hle : ceilDiv (n - s) S <= ceilDiv n S) by (unfold ceilDiv; apply Nat.div_le_mono; lia).
  rewrite (sumTo_trunc (ceilDiv n S) (ceilDiv (n - s) S)).
  - apply sumTo_ext. intros o Ho. unfold g.
    apply (ceilDiv_lt_iff o (n - s) S HS) in Ho.
    rewrite ltb_t by lia. f_equal. ring.
  - intros o Ho1 Ho2. unfold g. rewrite ltb_f; [reflexivity | ].
    destruct (le_lt_dec (n - s) (o * S)) as [Hc | Hc]; [lia | ].
    apply (ceilDiv_lt_iff o (n - s) S HS) in Hc. lia.
  - exact Hle.
Qed.

(* the rule's instance: ceilDiv N t tiles of t; split s adds the tiles S * o + s,
   o < ceilDiv (N - t * s) T with T = t * S (the obligation states T as one number) *)
Theorem sumTo_split_k_strided : forall (N t S T : nat) (f : nat -> R), 0 < t -> 0 < S -> T = t * S ->
  sumTo (ceilDiv N t) f
  = sumTo S (fun s => sumTo (ceilDiv (N - t * s) T) (fun o => f (S * o + s))).
Proof.
  intros N t S T f Ht HS HT. subst T. rewrite (sumTo_strided S (ceilDiv N t) f HS).
  apply sumTo_ext. intros s Hs. rewrite ceilDiv_ceilDiv_sub by assumption. reflexivity.
Qed.

End SplitK.
