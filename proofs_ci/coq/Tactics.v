(* derivc proof library: what the compiler's per-step obligations (StepNN_<rule>.v)
   need besides the rule theorems:
   - `sel`, the guard form the exporter emits (an `if` on a bool index condition),
   - `foldN`, the generic sequential fold the IR's Fold is exported to, and its link
     to the library's onlineFoldW / onlineFoldG,
   - `softmaxAtG`, the masked softmax (masked positions give 0), and the shift lemmas,
   - pointwise congruence lemmas with bound hypotheses,
   - `kalg_ring`: the commutative-ring structure of KAlg (for Coq's `ring`),
   - the tactic `derivc_congr`, which closes goals `before = after` that agree up to
     linear nat index arithmetic, guards decided by `lia`, in-bounds producer reads
     (`gen_inline`) and commutative-ring identities,
   - the safety lemmas and the tactic `derivc_safe`, which proves `expd_safe a m` /
     `rescale_safe m m'` (the exp argument is <= 0) when the shift is a max over a set
     containing the other operand: a maxTo over a range,
     a running max max(m_old, maxTo ..), or the final running max of a fold (`ele_foldN`).
   Nothing here is assumed: every lemma is proved from the KAlg fields. *)
From Coq Require Import Arith Lia Bool Ring ZArith.
Require Import Derivc.Algebra Derivc.Sum Derivc.Rules.Fuse Derivc.Rules.Tile
  Derivc.Rules.MapMma Derivc.Rules.SplitSoftmax Derivc.Rules.OnlineAgg.

(* a generic sequential fold: step k is applied to the state after steps 0..k-1 *)
Fixpoint foldN {S : Type} (step : nat -> S -> S) (s0 : S) (n : nat) : S :=
  match n with
  | O => s0
  | Datatypes.S k => step k (foldN step s0 k)
  end.

Lemma foldN_ext {S : Type} : forall (f g : nat -> S -> S) (s0 s1 : S) (n m : nat),
  n = m -> s0 = s1 -> (forall k s, k < n -> f k s = g k s) -> foldN f s0 n = foldN g s1 m.
Proof.
  intros f g s0 s1 n m Hnm Hs Hfg. subst m s1. induction n as [|n IH].
  - reflexivity.
  - simpl. rewrite IH by (intros k s Hk; apply Hfg; lia). apply Hfg. lia.
Qed.

(* iterations k in [K, n) that leave the state unchanged can be dropped *)
Lemma foldN_trunc {S : Type} : forall (f : nat -> S -> S) (s0 : S) (n K : nat),
  (forall k s, K <= k -> k < n -> f k s = s) -> K <= n -> foldN f s0 n = foldN f s0 K.
Proof.
  intros f s0 n K Hid HK. induction n as [|n IH].
  - assert (K = 0) by lia. subst K. reflexivity.
  - destruct (Nat.eq_dec K (Datatypes.S n)) as [E | E].
    + subst K. reflexivity.
    + simpl. rewrite Hid by lia. apply IH; [intros k s Hk1 Hk2; apply Hid; lia | lia].
Qed.

Lemma foldN_trunc_eq {S : Type} : forall (f g : nat -> S -> S) (s0 s1 : S) (n K : nat),
  (forall k s, K <= k -> k < n -> f k s = s) -> K <= n -> s0 = s1 ->
  (forall k s, k < K -> f k s = g k s) -> foldN f s0 n = foldN g s1 K.
Proof.
  intros f g s0 s1 n K Hid HK Hs Hfg. rewrite (foldN_trunc f s0 n K Hid HK).
  apply foldN_ext; [reflexivity | exact Hs | exact Hfg].
Qed.

Lemma app_cong {A B : Type} : forall (f g : A -> B) (a b : A), f = g -> a = b -> f a = g b.
Proof. intros f g a b Hfg Hab. subst g b. reflexivity. Qed.

(* the exporter's guard form, for finite (R) and extended (ext R) values alike *)
Definition sel {A : Type} (b : bool) (x y : A) : A := if b then x else y.

(* congruence through a guard: each branch under its condition (the direct proofs'
   descent, compiler/obligations_direct.py) *)
Lemma sel_congr {A : Type} : forall (c : bool) (x x' y y' : A),
  (c = true -> x = x') -> (c = false -> y = y') -> sel c x y = sel c x' y'.
Proof. intros c x x' y y' Hx Hy. destruct c; unfold sel; [apply Hx | apply Hy]; reflexivity. Qed.

Section Tactics.
Context {R : Type} `{KAlg R}.

Lemma sel_if : forall b (x y : R), sel b x y = if b then x else y.
Proof. reflexivity. Qed.

Lemma sel_and : forall a b (x y : R), sel (andb a b) x y = sel a (sel b x y) y.
Proof. intros a b x y. destruct a; reflexivity. Qed.

Lemma sumTo_ext_eq : forall n m (f g : nat -> R),
  n = m -> (forall i, i < n -> f i = g i) -> sumTo n f = sumTo m g.
Proof. intros n m f g E Hfg. subst m. apply sumTo_ext. exact Hfg. Qed.

Lemma sumTo_ext_lt : forall n (f g : nat -> R),
  (forall i, i < n -> f i = g i) -> sumTo n f = sumTo n g.
Proof. exact sumTo_ext. Qed.

Lemma maxTo_ext_eq : forall n m (f g : nat -> ext R),
  n = m -> (forall i, i < n -> f i = g i) -> maxTo n f = maxTo m g.
Proof. intros n m f g E Hfg. subst m. apply maxTo_ext. exact Hfg. Qed.

Lemma mma16_ext : forall (f g : nat -> R), (forall k, k < 16 -> f k = g k) -> mma16 f = mma16 g.
Proof.
  intros f g Hfg. unfold mma16.
  rewrite !Hfg by lia. reflexivity.
Qed.

Lemma sub_diag : forall a : R, sub a a = zero.
Proof. intros a. unfold sub. apply add_neg. Qed.

Lemma onlineFoldW_foldN : forall (w : nat -> ext R -> R) (v : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 : ext R) (T : nat),
  onlineFoldW w v t mnext m0 T = foldN (onlineStepW w v t mnext) (mkOState m0 zero zero) T.
Proof.
  intros w v t mnext m0 T. induction T as [|T IH].
  - reflexivity.
  - simpl. rewrite IH. reflexivity.
Qed.

Lemma onlineFoldG_foldN : forall (g : nat -> bool) (s v : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 : ext R) (T : nat),
  onlineFoldG g s v t mnext m0 T
  = foldN (onlineStepW (fun j m => if g j then expd (Fin (s j)) m else zero) v t mnext)
          (mkOState m0 zero zero) T.
Proof. intros. unfold onlineFoldG. apply onlineFoldW_foldN. Qed.

(* the (m, l) fold of a row softmax (ONLINE-AGG without V) as the IR's generic fold *)
Lemma onlineFold2_foldN : forall (g : nat -> bool) (s : nat -> R) (t : nat)
    (mnext : nat -> ext R -> ext R) (m0 : ext R) (T : nat),
  onlineFold2 g s t mnext m0 T = foldN (onlineStep2 g s t mnext) (m0, zero) T.
Proof. intros. induction T as [|T IH]; [reflexivity|]. cbn [onlineFold2 foldN]. rewrite IH. reflexivity. Qed.

(* masked softmax: exp(s j) / sum of exp over the unmasked k; masked positions give 0 *)
Definition softmaxAtG (g : nat -> bool) (n : nat) (s : nat -> R) (j : nat) : R :=
  if g j then div (exp (s j)) (sumTo n (fun k => if g k then exp (s k) else zero)) else zero.

(* the stabilising shift M is arbitrary (SPLIT-SOFTMAX, element-wise) as long as it is
   defined: -inf only when every position is masked *)
Lemma softmaxAt_shift : forall (n : nat) (s : nat -> R) (j : nat) (M : ext R),
  j < n -> (forall k, k < n -> M = NInf -> False) ->
  softmaxAt n s j = div (expd (Fin (s j)) M) (sumTo n (fun k => expd (Fin (s k)) M)).
Proof.
  intros n s j [m|] Hj HM; [| exfalso; exact (HM j Hj eq_refl)].
  unfold softmaxAt. cbv [expd].
  rewrite (sumTo_ext n (fun k => exp (sub (s k) m)) (fun k => mul (exp (s k)) (exp (neg m))))
    by (intros k Hk; apply exp_sub).
  rewrite sumTo_mul_r, exp_sub. symmetry. apply div_cancel_r. apply exp_ne_zero.
Qed.

Lemma softmaxAtG_shift : forall (g : nat -> bool) (n : nat) (s : nat -> R) (j : nat) (M : ext R),
  j < n -> (forall k, k < n -> M = NInf -> g k = false) ->
  softmaxAtG g n s j
  = if g j then div (expd (Fin (s j)) M)
                    (sumTo n (fun k => if g k then expd (Fin (s k)) M else zero))
    else zero.
Proof.
  intros g n s j [m|] Hj HM.
  - unfold softmaxAtG. destruct (g j); [|reflexivity]. cbv [expd].
    rewrite (sumTo_ext n (fun k => if g k then exp (sub (s k) m) else zero)
                         (fun k => mul (if g k then exp (s k) else zero) (exp (neg m))))
      by (intros k Hk; apply cond_exp).
    rewrite sumTo_mul_r, exp_sub. symmetry. apply div_cancel_r. apply exp_ne_zero.
  - unfold softmaxAtG. rewrite (HM j Hj eq_refl). reflexivity.
Qed.

Lemma softmaxAtG_true : forall (n : nat) (s : nat -> R) (j : nat),
  softmaxAtG (fun _ => true) n s j = softmaxAt n s j.
Proof. reflexivity. Qed.

(* KAlg is a commutative ring: obligations declare `Add Ring derivc_ring : (@kalg_ring R KA).` *)
Lemma kalg_ring : ring_theory zero one add mul sub neg (@eq R).
Proof.
  constructor; intros; try reflexivity.
  - apply add_0_l.
  - apply add_comm.
  - symmetry; apply add_assoc.
  - apply mul_1_l.
  - apply mul_comm.
  - symmetry; apply mul_assoc.
  - apply add_mul.
  - apply add_neg.
Qed.

End Tactics.

(* ------------------------------------------------------------------ tactics *)

(* hypotheses H : A /\ B are split, so that lia sees the parts *)
Ltac derivc_destruct_conj :=
  repeat match goal with
         | H : _ /\ _ |- _ => destruct H
         | H : exists _, _ |- _ => destruct H
         end.

(* beta/zeta/iota and the exporter's small definitions *)
Ltac derivc_red := cbv beta iota zeta delta [sel andb orb negb div onlineStepW].

(* case on a closed guard (a bool index comparison that mentions no binder).  The guard is
   abstracted by `generalize`, which replaces its syntactic occurrences: `destruct (Nat.ltb_spec
   a b)` abstracts its index by unification, trying every other comparison of the goal against
   it up to conversion (unfolding products by unary literals such as 128 * i), which was most of
   the time of the large ONLINE-AGG / CACHE obligations.  A convertible occurrence that is not
   syntactically the same is left in place and split by a later call. *)
Ltac derivc_split_on spec c :=
  let b := fresh "b" in let Hb := fresh "Hb" in
  generalize spec; generalize c; intros b Hb; destruct Hb.

Ltac derivc_split :=
  match goal with
  | |- context [Nat.ltb ?a ?b] => derivc_split_on (Nat.ltb_spec a b) (Nat.ltb a b)
  | |- context [Nat.leb ?a ?b] => derivc_split_on (Nat.leb_spec a b) (Nat.leb a b)
  | |- context [Nat.eqb ?a ?b] => derivc_split_on (Nat.eqb_spec a b) (Nat.eqb a b)
  end.

(* case on a comparison of integer data (an i32 input read in a condition).  Tried after the index
   cases and after congruence: its facts relate opaque reads (t_Doc b i = t_Doc b j), which lia
   cannot connect to the same read at an index spelt differently (128 * jo + ji, ji + 128 * jo),
   so two sides that differ only there are closed by congruence on the read's indices instead *)
Ltac derivc_zsplit :=
  match goal with
  | |- context [Z.ltb ?a ?b] => destruct (Z.ltb_spec a b)
  | |- context [Z.leb ?a ?b] => destruct (Z.leb_spec a b)
  | |- context [Z.eqb ?a ?b] => destruct (Z.eqb_spec a b)
  end.

(* reads of integer data at indices lia equates, spelt alike (t_Doc b (i + 128 * t) and
   t_Doc b (t * 128 + i) are one atom for lia afterwards): closes a case whose data facts
   contradict each other only up to that spelling.  Only the facts the data cases introduce
   (Z comparisons) are searched: the other hypotheses can be large terms *)
Ltac derivc_zfact P :=
  lazymatch P with
  | @eq Z _ _ => idtac
  | ~ @eq Z _ _ => idtac
  | Z.lt _ _ => idtac
  | Z.le _ _ => idtac
  end.
Ltac derivc_zunify :=
  repeat match goal with
  | H1 : ?P, H2 : ?Q |- _ =>
      derivc_zfact P; derivc_zfact Q;
      match P with context [?f ?i] =>
        let T := type of (f i) in constr_eq T Z;
        match Q with context [f ?j] =>
          tryif constr_eq i j then fail else
          (let E := fresh "E" in assert (E : i = j) by lia; rewrite E in H1; clear E)
        end
      end
  end.
(* a site's hypotheses on data (`Z.eqb a b = true`) as facts lia reads *)
Ltac derivc_zhyps :=
  repeat match goal with
  | H : Z.eqb _ _ = true |- _ => apply Z.eqb_eq in H
  | H : Z.eqb _ _ = false |- _ => apply Z.eqb_neq in H
  | H : Z.leb _ _ = true |- _ => apply Z.leb_le in H
  | H : Z.leb _ _ = false |- _ => apply Z.leb_gt in H
  | H : Z.ltb _ _ = true |- _ => apply Z.ltb_lt in H
  | H : Z.ltb _ _ = false |- _ => apply Z.ltb_ge in H
  end.
Ltac derivc_absurd := exfalso; first [ lia | derivc_zunify; lia ].

(* masked iterations of a fold leave the online-aggregation state unchanged *)
Ltac derivc_kill_masked :=
  derivc_red;
  repeat first
    [ rewrite sumTo_zero_ext by (intros; derivc_red; repeat (derivc_split; derivc_red; try (exfalso; lia)); reflexivity)
    | rewrite maxTo_ninf_ext by (intros; derivc_red; repeat (derivc_split; derivc_red; try (exfalso; lia)); reflexivity) ];
  rewrite ?max_ninf_r, ?rescale_diag, ?mul_one, ?add_zero;
  reflexivity.

Ltac derivc_ring :=
  lazymatch goal with
  | |- @eq nat _ _ => fail
  | |- @eq (OState _) _ _ => fail
  | |- @eq (ext _) _ _ => fail
  | |- @eq (_ -> _) _ _ => fail
  | |- _ => ring
  end.

(* The extensionality branches are taken only on goals whose two sides have that head: `apply`
   on any other goal unifies up to conversion, which unfolds a fixed-extent fold or reduction
   step by step before failing (tens of seconds on an 8192-column softmax obligation). *)
Ltac derivc_congr :=
  derivc_red;
  first
  [ match goal with |- ?x = ?x => reflexivity end
  | match goal with |- @eq nat _ _ => lia end
  | derivc_split; derivc_red; first [ exfalso; lia | derivc_congr ]
  | match goal with |- context [genAt ?n ?f ?i] => rewrite (gen_inline n f i) by lia end;
    derivc_congr
  | match goal with |- context [genAtX ?n ?f ?i] => rewrite (genX_inline n f i) by lia end;
    derivc_congr
  | lazymatch goal with |- sumTo _ _ = sumTo _ _ => idtac end;
    apply sumTo_ext_eq; [ lia | intros ? ?; derivc_congr ]
  | lazymatch goal with |- maxTo _ _ = maxTo _ _ => idtac end;
    apply maxTo_ext_eq; [ lia | intros ? ?; derivc_congr ]
  | lazymatch goal with |- mma16 _ = mma16 _ => idtac end;
    apply mma16_ext; intros ? ?; derivc_congr
  | match goal with |- foldN _ _ _ = foldN _ _ _ => idtac end;
    first
    [ apply foldN_ext; [ lia | derivc_congr | intros ? ? ?; derivc_congr ]
    | apply foldN_trunc_eq;
      [ let s := fresh "s" in
        intros ? s ? ?; destruct s; cbn [st_m st_l st_acc]; derivc_kill_masked
      | lia
      | derivc_congr
      | intros ? ? ?; derivc_congr ] ]
  | match goal with |- ?f ?a = ?g ?b => apply (app_cong f g a b); derivc_congr end
  (* two guards on data that agree by congruence (the same reads at indices lia equates): one case *)
  | match goal with |- (if ?c then _ else _) = (if ?c' then _ else _) =>
      let E := fresh "E" in assert (E : c = c') by derivc_congr; rewrite E; destruct c'; derivc_congr end
  | derivc_zsplit; derivc_red; first [ derivc_absurd | derivc_congr ]
  | derivc_ring ].

(* the guard hypotheses of sel_congr (`c = true` / `c = false` on nat comparisons) as facts
   lia reads *)
Ltac derivc_bhyps :=
  repeat match goal with
  | H : andb _ _ = true |- _ => apply andb_prop in H; destruct H
  | H : orb _ _ = false |- _ => apply orb_false_elim in H; destruct H
  | H : negb _ = true |- _ => apply negb_true_iff in H
  | H : negb _ = false |- _ => apply negb_false_iff in H
  | H : Nat.ltb _ _ = true |- _ => apply Nat.ltb_lt in H
  | H : Nat.ltb _ _ = false |- _ => apply Nat.ltb_ge in H
  | H : Nat.leb _ _ = true |- _ => apply Nat.leb_le in H
  | H : Nat.leb _ _ = false |- _ => apply Nat.leb_gt in H
  | H : Nat.eqb _ _ = true |- _ => apply Nat.eqb_eq in H
  | H : Nat.eqb _ _ = false |- _ => apply Nat.eqb_neq in H
  end.

(* foldN_trunc_eq's first premise in a direct proof: the iterations the shorter fold drops
   leave the online-aggregation state unchanged (none are dropped: the range is empty) *)
Ltac derivc_kill_step :=
  let s := fresh "s" in
  intros ? s ? ?; first [ exfalso; lia | destruct s; derivc_kill_masked ].

(* one differing subterm of a direct proof: search, on that subterm only *)
Ltac derivc_leaf := derivc_bhyps; derivc_congr.

(* a proposition over index arithmetic: bounds, guards, store-index equalities *)
Ltac derivc_props :=
  intros; derivc_destruct_conj; repeat split; lia.

(* ---------------------------------------------------------- -inf is only where it may be *)

Ltac derivc_cases := repeat (first [ derivc_split | derivc_zsplit ]; derivc_red; try derivc_absurd).
Ltac derivc_fin_close := intros; first [ reflexivity | discriminate | derivc_absurd ].

(* goal: `M = NInf -> P` where M is an (inlined) max over a range and P is `g k = false` or
   False: a key k that is live makes M finite (maxTo_NInf_inv at k). *)
Ltac derivc_valid k :=
  cbv beta iota zeta delta [sel andb orb negb genAtX genAt];
  derivc_cases;
  (* the max branch first: derivc_fin_close's discriminate would put `maxTo n f` in head normal
     form, unfolding n steps (minutes for an 8192-column row) before failing *)
  first
  [ let HM := fresh "HM" in let Hc := fresh "Hc" in
    intros HM;
    lazymatch type of HM with maxTo _ _ = NInf => idtac end;
    pose proof (maxTo_NInf_inv _ _ HM k ltac:(lia)) as Hc; clear HM; revert Hc;
    derivc_red; derivc_cases; derivc_fin_close
  | derivc_fin_close ].

(* goal: online_max_ok g t mnext T for the IR's running max max(m, max over the tile):
   it is -inf only if m is and every key of the tile is masked *)
Ltac derivc_mnext :=
  let o := fresh "o" in let m := fresh "m" in let Ho := fresh "Ho" in let E := fresh "E" in
  let Em := fresh "Em" in let Et := fresh "Et" in let i := fresh "i" in let Hi := fresh "Hi" in
  let Hc := fresh "Hc" in
  unfold online_max_ok; intros o m Ho E; cbv beta zeta in E;
  apply max_NInf_inv in E; destruct E as [Em Et]; split; [exact Em |];
  intros i Hi; pose proof (maxTo_NInf_inv _ _ Et i Hi) as Hc; clear Et; revert Hc;
  derivc_red; derivc_cases; derivc_fin_close.

(* ---------------------------------------------------------- safety: exp arguments <= 0 *)

Section Safety.
Context {R : Type} `{KAlg R}.

Lemma ele_max_l_of : forall x a b : ext R, ele x a -> ele x (max a b).
Proof. intros x a b E. exact (ele_trans x a (max a b) E (ele_max_l a b)). Qed.

Lemma ele_max_r_of : forall x a b : ext R, ele x b -> ele x (max a b).
Proof. intros x a b E. exact (ele_trans x b (max a b) E (ele_max_r a b)). Qed.

Lemma ele_maxTo : forall (n : nat) (f : nat -> ext R) (j : nat), j < n -> ele (f j) (maxTo n f).
Proof.
  induction n as [|n IH]; intros f j Hj; [lia|].
  rewrite maxTo_S. destruct (Nat.eq_dec j n) as [E | E].
  - subst j. apply ele_max_r.
  - apply ele_max_l_of. apply IH. lia.
Qed.

(* x is one of the maximised values *)
Lemma ele_maxTo_at : forall (n : nat) (f : nat -> ext R) (x : ext R),
  (exists j, j < n /\ x = f j) -> ele x (maxTo n f).
Proof. intros n f x [j [Hj E]]. subst x. apply ele_maxTo. exact Hj. Qed.

(* x is one of the maximised values of a masked max (a max over the keys g lets through, e.g.
   RECOMPUTE's row max M): x is the value at a live key *)
Lemma ele_maxTo_sel : forall (n : nat) (g : nat -> bool) (f : nat -> ext R) (x : ext R) (j : nat),
  x = f j -> j < n -> g j = true -> ele x (maxTo n (fun k => sel (g k) (f k) ninf)).
Proof.
  intros n g f x j E Hj Hg. apply ele_maxTo_at. exists j. split; [exact Hj |].
  unfold sel. rewrite Hg. exact E.
Qed.

(* a fold whose running max never decreases and that, at step o, takes x into account *)
Lemma ele_foldN : forall {S : Type} (step : nat -> S -> S) (s0 : S) (proj : S -> ext R)
    (n o : nat) (x : ext R),
  (forall k s, k < n -> ele (proj s) (proj (step k s))) -> o < n ->
  (forall s, ele x (proj (step o s))) -> ele x (proj (foldN step s0 n)).
Proof.
  intros S step s0 proj n o x Hmono. induction n as [|n IH]; intros Ho Hx; [lia|].
  cbn [foldN]. destruct (Nat.eq_dec o n) as [E | E].
  - subst o. apply Hx.
  - apply (ele_trans x (proj (foldN step s0 n))).
    + apply IH; [intros k s Hk; apply Hmono; lia | lia | exact Hx].
    + apply Hmono. lia.
Qed.

End Safety.

Lemma div_mod_t : forall i t : nat, 0 < t -> i = i mod t + t * (i / t).
Proof. intros i t Ht. pose proof (Nat.div_mod i t ltac:(lia)). lia. Qed.

Lemma div_lt_ceilDiv : forall i n t : nat, 0 < t -> i < n -> i / t < ceilDiv n t.
Proof.
  intros i n t Ht Hi. apply Nat.div_lt_upper_bound; [lia|].
  pose proof (ceilDiv_ge n t Ht). rewrite Nat.mul_comm. lia.
Qed.

(* goal: ele x m, m a max over a set that contains x *)
Ltac derivc_ele :=
  cbv beta;
  lazymatch goal with
  | |- ele ?x ?x => apply ele_refl
  | |- ele ninf _ => exact I
  | |- ele _ (max _ _) =>
      first [ apply ele_max_r_of; derivc_ele | apply ele_max_l_of; derivc_ele ]
  | |- ele _ (maxTo ?n (fun k => sel (@?g k) (@?f k) ninf)) =>
      first
      [ eapply (ele_maxTo_sel n g f);
        [ reflexivity | lia | cbv beta; derivc_red; derivc_cases; reflexivity ]
      | apply ele_maxTo_at; eexists; split; [ | reflexivity ]; lia ]
  | |- ele _ (maxTo _ _) =>
      apply ele_maxTo_at; eexists; split; [ | reflexivity ]; lia
  | |- ele (Fin (?F ?i)) (?proj (foldN ?st ?s0 ?n)) =>
      lazymatch st with
      | context [maxTo ?t _] =>
          apply (ele_foldN st s0 proj n (i / t) (Fin (F i)));
          [ let k := fresh "k" in let s := fresh "s" in let Hk := fresh "Hk" in
            intros k s Hk; cbv beta; cbn [fst snd st_m]; apply ele_max_l
          | first [ apply Nat.div_lt_upper_bound; lia | apply div_lt_ceilDiv; lia ]
          | let s := fresh "s" in
            intros s; cbv beta; cbn [fst snd st_m]; apply ele_max_r_of; apply ele_maxTo_at;
            exists (i mod t); split;
            [ apply Nat.mod_upper_bound; lia
            | cbv beta; rewrite <- (div_mod_t i t) by lia; reflexivity ] ]
      end
  end.

(* goal: a <> NInf for the score of an exp site, under the site's select conditions *)
Ltac derivc_not_ninf :=
  derivc_red; repeat (first [ derivc_split | derivc_zsplit ]; derivc_red;
                      try (exfalso; first [ lia | derivc_zhyps; derivc_zunify; lia ]));
  let E := fresh "E" in intro E; discriminate E.

(* goal: a safety obligation `... -> let .. in expd_safe a m` (exp site) or `rescale_safe m m'`
   (rescale site) *)
Ltac derivc_safe :=
  cbv zeta; intros;
  lazymatch goal with
  | |- rescale_safe _ _ => apply rescale_safe_of_ele; derivc_ele
  | |- expd_safe _ _ => apply expd_safe_of_ele_ne; [ derivc_ele | derivc_not_ninf ]
  end.
