(* Rule MASK-DATA: the key tiles of an online-aggregation fold bounded by a span derived from the
   mask's own integer data (document masking Doc[b, i] == Doc[b, j]).

   `h p` says key position p may match some query row of the block (its value lies between the
   least and greatest value of the rows: the exporter builds h from the reads).  The span of h over
   nk positions in tiles of `size` is [firstHit / size, (lastHit - 1) / size + 1) (empty when no
   position hits).  span_cover: a hit's tile lies in the span, so the conjunct `tile in span` the
   rule adds beside the comparison is implied by it (every value unchanged).  foldN_skip_span: a
   fold whose steps outside [lo, hi) leave the state unchanged (the fully masked tiles of an online
   aggregation) equals the fold over [lo, hi) alone: the printers visit only the span's tiles. *)
From Coq Require Import Arith Lia Bool.
Require Import Derivc.Tactics.

(* some r < n has f r *)
Fixpoint anyBelow (n : nat) (f : nat -> bool) : bool :=
  match n with
  | O => false
  | S k => orb (anyBelow k f) (f k)
  end.

Lemma anyBelow_intro : forall n f r, r < n -> f r = true -> anyBelow n f = true.
Proof.
  induction n as [|n IH]; intros f r Hr Hf; [lia|]. cbn [anyBelow].
  destruct (Nat.eq_dec r n) as [->|Hne]; [rewrite Hf, orb_true_r; reflexivity|].
  rewrite (IH f r ltac:(lia) Hf). reflexivity.
Qed.

(* the least hit below n (n when none) *)
Fixpoint firstHit (h : nat -> bool) (n : nat) : nat :=
  match n with
  | O => O
  | S k => if Nat.ltb (firstHit h k) k then firstHit h k else if h k then k else S k
  end.

(* one past the greatest hit below n (0 when none) *)
Fixpoint lastHit (h : nat -> bool) (n : nat) : nat :=
  match n with
  | O => O
  | S k => if h k then S k else lastHit h k
  end.

(* the span's ends: the obligations compare the tile with them as with any index bound *)
Definition spanLo (h : nat -> bool) (nk size : nat) : nat := firstHit h nk / size.
Definition spanHi (h : nat -> bool) (nk size : nat) : nat :=
  match lastHit h nk with O => O | S l => l / size + 1 end.

Definition spanHas (h : nat -> bool) (nk size t : nat) : bool :=
  andb (Nat.leb (spanLo h nk size) t) (Nat.ltb t (spanHi h nk size)).

(* the span of a comparison query == key: h p says key p lies between the least and greatest
   value of the valid rows r < rows (the exported form; `leb` the values' order, Z.leb) *)
Definition spanHit {A : Type} (leb : A -> A -> bool) (q : nat -> A) (ok : nat -> bool) (rows : nat)
    (k : nat -> A) (p : nat) : bool :=
  andb (anyBelow rows (fun r => andb (ok r) (leb (q r) (k p))))
       (anyBelow rows (fun r => andb (ok r) (leb (k p) (q r)))).

Lemma firstHit_le_n : forall h n, firstHit h n <= n.
Proof.
  induction n as [|n IH]; cbn [firstHit]; [lia|].
  destruct (Nat.ltb_spec (firstHit h n) n); [lia|]. destruct (h n); lia.
Qed.

Lemma firstHit_le : forall h n p, p < n -> h p = true -> firstHit h n <= p.
Proof.
  induction n as [|n IH]; intros p Hp Hh; [lia|]. cbn [firstHit].
  destruct (Nat.eq_dec p n) as [->|Hne].
  - destruct (Nat.ltb_spec (firstHit h n) n); [lia|]. rewrite Hh. lia.
  - specialize (IH p ltac:(lia) Hh).
    destruct (Nat.ltb_spec (firstHit h n) n); [lia|]. lia.
Qed.

Lemma lastHit_gt : forall h n p, p < n -> h p = true -> p < lastHit h n.
Proof.
  induction n as [|n IH]; intros p Hp Hh; [lia|]. cbn [lastHit].
  destruct (Nat.eq_dec p n) as [->|Hne]; [rewrite Hh; lia|].
  destruct (h n); [lia|]. apply IH; [lia | exact Hh].
Qed.

Theorem span_cover : forall h nk size p, 0 < size -> p < nk -> h p = true ->
  spanHas h nk size (p / size) = true.
Proof.
  intros h nk size p Hs Hp Hh. unfold spanHas, spanLo, spanHi.
  pose proof (firstHit_le h nk p Hp Hh) as Hf.
  pose proof (lastHit_gt h nk p Hp Hh) as Hl.
  apply andb_true_intro; split.
  - apply Nat.leb_le. apply Nat.div_le_mono; lia.
  - destruct (lastHit h nk) as [|l] eqn:E; [lia|].
    apply Nat.ltb_lt. assert (p / size <= l / size) by (apply Nat.div_le_mono; lia). lia.
Qed.

(* the form the obligations use: a hit at a position of tile t *)
Theorem span_cover_at : forall h nk size t p, size * t <= p -> p < size * t + size -> p < nk ->
  h p = true -> spanHas h nk size t = true.
Proof.
  intros h nk size t p Hlo Hhi Hp Hh.
  assert (Ht : p / size = t).
  { symmetry; apply Nat.div_unique with (r := p - size * t); lia. }
  rewrite <- Ht. apply span_cover; [lia | exact Hp | exact Hh].
Qed.

Lemma foldN_app {S : Type} : forall (f : nat -> S -> S) (s0 : S) a b,
  foldN f s0 (a + b) = foldN (fun k => f (a + k)) (foldN f s0 a) b.
Proof.
  intros f s0 a b. induction b as [|b IH]; cbn [foldN]; [rewrite Nat.add_0_r; reflexivity|].
  rewrite Nat.add_succ_r. cbn [foldN]. rewrite IH. reflexivity.
Qed.

Lemma foldN_identity {S : Type} : forall (f : nat -> S -> S) (s0 : S) n,
  (forall k s, k < n -> f k s = s) -> foldN f s0 n = s0.
Proof.
  intros f s0 n Hid. induction n as [|n IH]; cbn [foldN]; [reflexivity|].
  rewrite Hid by lia. apply IH. intros; apply Hid; lia.
Qed.

Theorem foldN_skip_span {S : Type} : forall (f : nat -> S -> S) (s0 : S) n lo hi,
  lo <= hi -> hi <= n -> (forall k s, k < n -> (k < lo \/ hi <= k) -> f k s = s) ->
  foldN f s0 n = foldN (fun k => f (lo + k)) s0 (hi - lo).
Proof.
  intros f s0 n lo hi Hlh Hhn Hid.
  rewrite (foldN_trunc f s0 n hi (fun k s H1 H2 => Hid k s H2 (or_intror H1)) Hhn).
  replace hi with (lo + (hi - lo)) at 1 by lia.
  rewrite foldN_app, (foldN_identity f s0 lo); [reflexivity|].
  intros k s Hk. apply Hid; lia.
Qed.
