(* Rule SPLIT-KV (flash-decoding): the ONLINE-AGG fold's key tiles divided into consecutive
   ranges, each folded on its own (from (-inf, 0, 0)), the partial states (m, l, acc) merged by
   the fold's merge
       m = max m1 m2,   l = l1 e^(m1 - m) + l2 e^(m2 - m),   acc = acc1 e^(m1 - m) + acc2 e^(m2 - m)
   (e^(a - m) is the IR's rescale a m: 0 for a = -inf below a finite m, 1 for -inf = -inf).
   The merged state satisfies the invariant of the fold over the concatenated range (onlineInv of
   OnlineAgg.v), so its acc / l is the concatenated fold's, ranges that are fully masked included
   (their state is (-inf, 0, 0): the merge leaves the other state unchanged).  For S ranges the
   merge is a left fold (mergeN), and it equals the combine with one global max:
       m = max_k m_k,  l = sum_k l_k e^(m_k - m),  acc = sum_k acc_k e^(m_k - m)
   (online_merge_global), which is what a combine kernel computes. *)
Require Import Arith Lia.
Require Import Derivc.Algebra Derivc.Sum Derivc.Rules.SplitSoftmax Derivc.Rules.OnlineAgg.
Require Import Derivc.Rules.Reorder Derivc.Rules.Tile.

Section OnlineMerge.
Context {R : Type} `{KAlg R}.

Definition oMerge (a b : OState R) : OState R :=
  mkOState (max (st_m a) (st_m b))
    (add (mul (st_l a) (rescale (st_m a) (max (st_m a) (st_m b))))
         (mul (st_l b) (rescale (st_m b) (max (st_m a) (st_m b)))))
    (add (mul (st_acc a) (rescale (st_m a) (max (st_m a) (st_m b))))
         (mul (st_acc b) (rescale (st_m b) (max (st_m a) (st_m b))))).

Definition oInit : OState R := mkOState NInf zero zero.

(* the S partial states merged left to right *)
Fixpoint mergeN (part : nat -> OState R) (n : nat) : OState R :=
  match n with
  | O => oInit
  | S k => oMerge (mergeN part k) (part k)
  end.

Lemma merge_rescale : forall x z S : R,
  mul (mul (exp (neg x)) S) (exp (sub x z)) = mul (exp (neg z)) S.
Proof. intros x z S. rewrite mul_rot, exp_rescale. reflexivity. Qed.

(* two consecutive key ranges [0, n1) and [n1, n1 + n2) *)
Theorem online_merge : forall (g : nat -> bool) (s v : nat -> R) (n1 n2 : nat) (a b : OState R),
  onlineInv g s v n1 a ->
  onlineInv (fun j => g (n1 + j)) (fun j => s (n1 + j)) (fun j => v (n1 + j)) n2 b ->
  onlineInv g s v (n1 + n2) (oMerge a b).
Proof.
  intros g s v n1 n2 [ma la aa] [mb lb ab] Ha Hb.
  unfold onlineInv, oMerge in *. cbn [st_m st_l st_acc] in *.
  rewrite !sumTo_app.
  destruct ma as [x|]; destruct mb as [y|]; cbn [max].
  - (* both ranges have a live key *)
    destruct Ha as [Hla Haa]. destruct Hb as [Hlb Hab].
    rewrite Hla, Haa, Hlb, Hab, !rescale_fin, !merge_rescale, <- !mul_add.
    split; reflexivity.
  - (* the second range is fully masked *)
    destruct Ha as [Hla Haa]. destruct Hb as [Hlb [Hab Hg]].
    rewrite Hla, Haa, Hlb, Hab, rescale_diag, !mul_one, !mul_0_l, !add_zero.
    rewrite (sumTo_zero_ext n2 (fun j => eg g s (n1 + j)))
      by (intros j Hj; unfold eg; rewrite (Hg j Hj); reflexivity).
    rewrite (sumTo_zero_ext n2 (fun j => mul (eg g s (n1 + j)) (v (n1 + j))))
      by (intros j Hj; unfold eg; rewrite (Hg j Hj); apply mul_0_l).
    rewrite !add_zero. split; reflexivity.
  - (* the first range is fully masked *)
    destruct Ha as [Hla [Haa Hg]]. destruct Hb as [Hlb Hab].
    rewrite Hla, Haa, Hlb, Hab, rescale_diag, !mul_one, !mul_0_l, !add_0_l.
    rewrite (sumTo_zero_ext n1 (eg g s))
      by (intros j Hj; unfold eg; rewrite (Hg j Hj); reflexivity).
    rewrite (sumTo_zero_ext n1 (fun j => mul (eg g s j) (v j)))
      by (intros j Hj; unfold eg; rewrite (Hg j Hj); apply mul_0_l).
    rewrite !add_0_l. split; reflexivity.
  - (* both fully masked: the merge stays (-inf, 0, 0) *)
    destruct Ha as [Hla [Haa Hg1]]. destruct Hb as [Hlb [Hab Hg2]].
    rewrite Hla, Haa, Hlb, Hab, !mul_0_l, !add_zero.
    split; [reflexivity | split; [reflexivity |]].
    intros j Hj. destruct (Nat.lt_ge_cases j n1) as [Hlt | Hge].
    + exact (Hg1 j Hlt).
    + replace j with (n1 + (j - n1)) by lia. apply Hg2. lia.
Qed.

(* S consecutive ranges of C keys each: the left-to-right merge *)
Theorem online_merge_splits : forall (g : nat -> bool) (s v : nat -> R) (C : nat)
    (part : nat -> OState R) (n : nat),
  (forall k, k < n -> onlineInv (fun j => g (k * C + j)) (fun j => s (k * C + j))
                                (fun j => v (k * C + j)) C (part k)) ->
  onlineInv g s v (n * C) (mergeN part n).
Proof.
  intros g s v C part n Hp. induction n as [|n IH].
  - apply onlineInv_init.
  - cbn [mergeN]. rewrite Nat.mul_succ_l.
    apply online_merge.
    + apply IH. intros k Hk. apply Hp. lia.
    + apply Hp. lia.
Qed.

(* two states with the invariant of one key range have the same quotient acc / l *)
Lemma onlineInv_quotient : forall (g : nat -> bool) (s v : nat -> R) (n : nat) (a b : OState R),
  onlineInv g s v n a -> onlineInv g s v n b ->
  div (st_acc a) (st_l a) = div (st_acc b) (st_l b).
Proof.
  intros g s v n [ma la aa] [mb lb ab] Ha Hb. unfold onlineInv in *. cbn [st_m st_l st_acc] in *.
  assert (Hz : forall x : R, (forall j, j < n -> g j = false) ->
            div (mul (exp (neg x)) (sumTo n (fun j => mul (eg g s j) (v j))))
                (mul (exp (neg x)) (sumTo n (eg g s))) = zero).
  { intros x Hg.
    rewrite (sumTo_zero_ext n (eg g s)) by (intros j Hj; unfold eg; rewrite (Hg j Hj); reflexivity).
    rewrite (sumTo_zero_ext n (fun j => mul (eg g s j) (v j)))
      by (intros j Hj; unfold eg; rewrite (Hg j Hj); apply mul_0_l).
    rewrite mul_0_r. apply div_zero_zero. }
  destruct ma as [x|]; destruct mb as [y|].
  - destruct Ha as [Hla Haa]. destruct Hb as [Hlb Hab]. rewrite Hla, Haa, Hlb, Hab.
    rewrite !div_cancel_l by apply exp_ne_zero. reflexivity.
  - destruct Ha as [Hla Haa]. destruct Hb as [Hlb [Hab Hg]]. rewrite Hla, Haa, Hlb, Hab.
    rewrite (Hz x Hg). symmetry. apply div_zero_zero.
  - destruct Ha as [Hla [Haa Hg]]. destruct Hb as [Hlb Hab]. rewrite Hla, Haa, Hlb, Hab.
    rewrite (Hz y Hg). apply div_zero_zero.
  - destruct Ha as [Hla [Haa _]]. destruct Hb as [Hlb [Hab _]]. rewrite Hla, Haa, Hlb, Hab.
    reflexivity.
Qed.

(* merging the folds of two consecutive tile ranges (A tiles, then B tiles, each from
   (-inf, 0, 0) with its own valid running max) equals folding their concatenation *)
Theorem online_merge_fold : forall (g : nat -> bool) (s v : nat -> R) (t A B : nat)
    (mnext1 mnext2 mnext : nat -> ext R -> ext R),
  online_max_ok g t mnext1 A ->
  online_max_ok (fun j => g (A * t + j)) t mnext2 B ->
  online_max_ok g t mnext (A + B) ->
  let st := oMerge (onlineFoldG g s v t mnext1 NInf A)
                   (onlineFoldG (fun j => g (A * t + j)) (fun j => s (A * t + j))
                                (fun j => v (A * t + j)) t mnext2 NInf B) in
  div (st_acc st) (st_l st)
  = div (st_acc (onlineFoldG g s v t mnext NInf (A + B)))
        (st_l (onlineFoldG g s v t mnext NInf (A + B))).
Proof.
  intros g s v t A B mnext1 mnext2 mnext H1 H2 H12 st.
  apply (onlineInv_quotient g s v ((A + B) * t)).
  - rewrite Nat.mul_add_distr_r. apply online_merge.
    + apply online_invariant. exact H1.
    + apply online_invariant. exact H2.
  - apply online_invariant. exact H12.
Qed.

(* the rule's theorem: n splits of C tiles each (split k starts at tile k * C, folds from
   (-inf, 0, 0) with its own running max), merged, give the quotient of the whole masked
   softmax-weighted sum for any valid shift M; splits past the live keys are fully masked *)
Theorem online_split_kv : forall (g : nat -> bool) (s v : nat -> R) (t C n : nat)
    (mnext : nat -> nat -> ext R -> ext R) (M : ext R),
  (forall k, k < n -> online_max_ok (fun j => g (k * (C * t) + j)) t (mnext k) C) ->
  (forall j, j < n * (C * t) -> M = NInf -> g j = false) ->
  let st := mergeN (fun k => onlineFoldG (fun j => g (k * (C * t) + j)) (fun j => s (k * (C * t) + j))
                                          (fun j => v (k * (C * t) + j)) t (mnext k) NInf C) n in
  div (st_acc st) (st_l st)
  = div (sumTo (n * (C * t)) (fun j => mul (if g j then expd (Fin (s j)) M else zero) (v j)))
        (sumTo (n * (C * t)) (fun j => if g j then expd (Fin (s j)) M else zero)).
Proof.
  intros g s v t C n mnext M Hok HM st.
  (* the whole range as one fold of n * C tiles of one key: its quotient is the right side *)
  set (one := fun (_ : nat) (m : ext R) =>
                max m (maxTo (n * (C * t)) (fun j => if g j then Fin (s j) else NInf))).
  assert (Hone : online_max_ok g 1 one (n * (C * t))).
  { intros o m Ho E. unfold one in E. apply max_NInf_inv in E. destruct E as [E1 E2].
    split; [exact E1 |]. intros i Hi. replace (o * 1 + i) with o by lia.
    pose proof (maxTo_NInf_inv _ _ E2 o Ho) as Eo. cbv beta in Eo.
    destruct (g o); [discriminate Eo | reflexivity]. }
  destruct (online_agg_guard g s v 1 one NInf M (n * (C * t)) Hone) as [Eq _].
  { intros j Hj. apply HM. lia. }
  rewrite Nat.mul_1_r in Eq. rewrite <- Eq.
  apply (onlineInv_quotient g s v (n * (C * t))).
  - apply online_merge_splits. intros k Hk. apply online_invariant. exact (Hok k Hk).
  - pose proof (online_invariant g s v 1 one NInf (n * (C * t)) Hone) as I.
    rewrite Nat.mul_1_r in I. exact I.
Qed.

(* ---------------------------------------------------------------- the combine's one max *)

Lemma rescale_trans : forall a b c : ext R, ele a b -> ele b c ->
  mul (rescale a b) (rescale b c) = rescale a c.
Proof.
  intros [a|] [b|] [c|]; cbn; intros E F; try contradiction.
  - rewrite <- exp_add. unfold sub.
    rewrite add_assoc, <- (add_assoc (neg b) b (neg c)), (add_comm (neg b) b), add_neg, add_0_l.
    reflexivity.
  - apply mul_0_l.
  - apply mul_1_l.
  - apply mul_one.
Qed.

Lemma ele_maxTo : forall (n k : nat) (f : nat -> ext R), k < n -> ele (f k) (maxTo n f).
Proof.
  intros n k f Hk. induction n as [|n IH]; [lia |].
  rewrite maxTo_S. destruct (Nat.eq_dec k n) as [-> | Hne].
  - apply ele_max_r.
  - apply (ele_trans _ (maxTo n f)); [apply IH; lia | apply ele_max_l].
Qed.

Theorem online_merge_global : forall (part : nat -> OState R) (n : nat),
  mergeN part n
  = mkOState (maxTo n (fun k => st_m (part k)))
      (sumTo n (fun k => mul (st_l (part k)) (rescale (st_m (part k)) (maxTo n (fun k => st_m (part k))))))
      (sumTo n (fun k => mul (st_acc (part k)) (rescale (st_m (part k)) (maxTo n (fun k => st_m (part k)))))).
Proof.
  intros part n. induction n as [|n IH].
  - reflexivity.
  - cbn [mergeN]. rewrite IH. unfold oMerge. cbn [st_m st_l st_acc].
    change (max (maxTo n (fun k => st_m (part k))) (st_m (part n)))
      with (maxTo (S n) (fun k => st_m (part k))).
    rewrite !sumTo_S, <- !sumTo_mul_r. cbv beta.
    set (Mn := maxTo n (fun k => st_m (part k))).
    set (M := maxTo (S n) (fun k => st_m (part k))).
    assert (HMn : ele Mn M) by (unfold Mn, M; rewrite maxTo_S; apply ele_max_l).
    assert (Hr : forall k, k < n -> mul (mul (st_l (part k)) (rescale (st_m (part k)) Mn)) (rescale Mn M)
                                  = mul (st_l (part k)) (rescale (st_m (part k)) M)
                                /\ mul (mul (st_acc (part k)) (rescale (st_m (part k)) Mn)) (rescale Mn M)
                                  = mul (st_acc (part k)) (rescale (st_m (part k)) M)).
    { intros k Hk. rewrite !mul_assoc, rescale_trans; [split; reflexivity | | exact HMn].
      unfold Mn. apply (ele_maxTo n k (fun k => st_m (part k)) Hk). }
    rewrite (sumTo_ext n (fun k => mul (mul (st_l (part k)) (rescale (st_m (part k)) Mn)) (rescale Mn M))
               (fun k => mul (st_l (part k)) (rescale (st_m (part k)) M)))
      by (intros k Hk; exact (proj1 (Hr k Hk))).
    rewrite (sumTo_ext n (fun k => mul (mul (st_acc (part k)) (rescale (st_m (part k)) Mn)) (rescale Mn M))
               (fun k => mul (st_acc (part k)) (rescale (st_m (part k)) M)))
      by (intros k Hk; exact (proj2 (Hr k Hk))).
    reflexivity.
Qed.

(* ------------------------------------------------ any assignment of keys to splits *)

(* one partial state rescaled to a finite merged max z: exp (-z) times its live sums *)
Lemma part_rescaled : forall (g : nat -> bool) (s v : nat -> R) (n : nat) (st : OState R) (z : R),
  onlineInv g s v n st ->
  mul (st_l st) (rescale (st_m st) (Fin z)) = mul (exp (neg z)) (sumTo n (eg g s))
  /\ mul (st_acc st) (rescale (st_m st) (Fin z))
     = mul (exp (neg z)) (sumTo n (fun j => mul (eg g s j) (v j))).
Proof.
  intros g s v n [m l acc] z Hinv. unfold onlineInv in Hinv. cbn [st_m st_l st_acc] in *.
  destruct m as [x|].
  - destruct Hinv as [Hl Ha]. rewrite Hl, Ha, rescale_fin, !merge_rescale. split; reflexivity.
  - destruct Hinv as [Hl [Ha Hg]]. rewrite Hl, Ha, !mul_0_l.
    rewrite (sumTo_zero_ext n (eg g s)) by (intros j Hj; unfold eg; rewrite (Hg j Hj); reflexivity).
    rewrite (sumTo_zero_ext n (fun j => mul (eg g s j) (v j)))
      by (intros j Hj; unfold eg; rewrite (Hg j Hj); apply mul_0_l).
    rewrite mul_0_r. split; reflexivity.
Qed.

(* S partial states, split k over the keys key k j (j < n), the splits covering N keys once
   (as sums: every function sums the same over the splits as over [0, N)): the merge's acc / l
   is the softmax-weighted average of v over the live keys of [0, N) (0 when none is live) *)
Theorem online_merge_cover : forall (g : nat -> bool) (s v : nat -> R) (S n N : nat)
    (key : nat -> nat -> nat) (part : nat -> OState R),
  (forall k, k < S -> onlineInv (fun j => g (key k j)) (fun j => s (key k j)) (fun j => v (key k j)) n (part k)) ->
  (forall f : nat -> R, sumTo S (fun k => sumTo n (fun j => f (key k j))) = sumTo N f) ->
  div (st_acc (mergeN part S)) (st_l (mergeN part S))
  = div (sumTo N (fun j => mul (eg g s j) (v j))) (sumTo N (eg g s)).
Proof.
  intros g s v S n N key part Hp Hcover.
  rewrite online_merge_global. cbn [st_acc st_l].
  rewrite <- (Hcover (eg g s)), <- (Hcover (fun j => mul (eg g s j) (v j))).
  destruct (maxTo S (fun k => st_m (part k))) as [z|] eqn:EM.
  - rewrite (sumTo_ext S (fun k => mul (st_l (part k)) (rescale (st_m (part k)) (Fin z)))
               (fun k => mul (exp (neg z)) (sumTo n (fun j => eg g s (key k j)))))
      by (intros k Hk; exact (proj1 (part_rescaled _ _ _ n (part k) z (Hp k Hk)))).
    rewrite (sumTo_ext S (fun k => mul (st_acc (part k)) (rescale (st_m (part k)) (Fin z)))
               (fun k => mul (exp (neg z)) (sumTo n (fun j => mul (eg g s (key k j)) (v (key k j))))))
      by (intros k Hk; exact (proj2 (part_rescaled _ _ _ n (part k) z (Hp k Hk)))).
    rewrite !sumTo_mul_l. apply div_cancel_l. apply exp_ne_zero.
  - (* every split fully masked: 0 / 0 on both sides *)
    assert (Hm : forall k, k < S -> st_m (part k) = NInf)
      by (intros k Hk; exact (maxTo_NInf_inv S _ EM k Hk)).
    assert (Hz : forall k, k < S -> st_l (part k) = zero /\ st_acc (part k) = zero
                                    /\ forall j, j < n -> g (key k j) = false).
    { intros k Hk. pose proof (Hp k Hk) as I. unfold onlineInv in I. rewrite (Hm k Hk) in I. exact I. }
    rewrite (sumTo_zero_ext S (fun k => mul (st_l (part k)) (rescale (st_m (part k)) NInf)))
      by (intros k Hk; rewrite (proj1 (Hz k Hk)); apply mul_0_l).
    rewrite (sumTo_zero_ext S (fun k => mul (st_acc (part k)) (rescale (st_m (part k)) NInf)))
      by (intros k Hk; rewrite (proj1 (proj2 (Hz k Hk))); apply mul_0_l).
    rewrite (sumTo_zero_ext S (fun k => sumTo n (fun j => eg g s (key k j)))).
    2: { intros k Hk. apply sumTo_zero_ext. intros j Hj. unfold eg.
         rewrite (proj2 (proj2 (Hz k Hk)) j Hj). reflexivity. }
    rewrite (sumTo_zero_ext S (fun k => sumTo n (fun j => mul (eg g s (key k j)) (v (key k j))))).
    2: { intros k Hk. apply sumTo_zero_ext. intros j Hj. unfold eg.
         rewrite (proj2 (proj2 (Hz k Hk)) j Hj). apply mul_0_l. }
    reflexivity.
Qed.

(* the rule's assignment: split k folds the tiles S * o + k (o < C) of t keys each *)
Definition skey (S t k j : nat) : nat := (S * (j / t) + k) * t + j mod t.

Lemma tile_div_mod : forall o i t : nat, i < t -> (o * t + i) / t = o /\ (o * t + i) mod t = i.
Proof.
  intros o i t Hi. split.
  - symmetry. apply (Nat.div_unique (o * t + i) t o i Hi). lia.
  - symmetry. apply (Nat.mod_unique (o * t + i) t o i Hi). lia.
Qed.

Lemma skey_cover : forall (S C t : nat) (f : nat -> R),
  sumTo S (fun k => sumTo (C * t) (fun j => f (skey S t k j))) = sumTo (C * S * t) f.
Proof.
  intros S C t f.
  rewrite (sumTo_tile (C * S) t f), (sumTo_tile C S).
  rewrite (sumTo_ext S _ (fun k => sumTo C (fun o => sumTo t (fun i => f ((S * o + k) * t + i))))).
  2: { intros k Hk. rewrite sumTo_tile. apply sumTo_ext. intros o Ho. apply sumTo_ext. intros i Hi.
       unfold skey. destruct (tile_div_mod o i t Hi) as [E1 E2]. rewrite E1, E2. reflexivity. }
  rewrite sumTo_swap. apply sumTo_ext. intros o Ho. apply sumTo_ext. intros k Hk.
  rewrite (Nat.mul_comm S o). reflexivity.
Qed.

(* the rule's theorem as the rule assigns tiles: S splits, split k folding the C tiles
   S * o + k from (-inf, 0, 0) with its own valid running max; merged, the quotient is the
   softmax-weighted average over all C * S tiles (tiles past the keys are masked by g) *)
Theorem online_split_kv_strided : forall (g : nat -> bool) (s v : nat -> R) (t C S : nat)
    (mnext : nat -> nat -> ext R -> ext R),
  (forall k, k < S -> online_max_ok (fun j => g (skey S t k j)) t (mnext k) C) ->
  let st := mergeN (fun k => onlineFoldG (fun j => g (skey S t k j)) (fun j => s (skey S t k j))
                                          (fun j => v (skey S t k j)) t (mnext k) NInf C) S in
  div (st_acc st) (st_l st)
  = div (sumTo (C * S * t) (fun j => mul (eg g s j) (v j))) (sumTo (C * S * t) (eg g s)).
Proof.
  intros g s v t C S mnext Hok st.
  apply (online_merge_cover g s v S (C * t) (C * S * t) (skey S t)).
  - intros k Hk. apply online_invariant. exact (Hok k Hk).
  - intros f. apply skey_cover.
Qed.

End OnlineMerge.
