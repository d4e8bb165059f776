(* Rule PARALLEL: if the write index is injective on the iteration range, the
   order in which the iterations' writes land does not matter. *)
Require Import Arith Lia List.
Require Import FunctionalExtensionality.
Import ListNotations.

Section Parallel.
Context {A : Type}.

(* memory: nat -> A; a point update *)
Definition upd (m : nat -> A) (a : nat) (v : A) : nat -> A :=
  fun x => if Nat.eqb x a then v else m x.

(* iteration list l, iteration i writes val i at idx i; applied left to right *)
Fixpoint applyWrites (m : nat -> A) (idx : nat -> nat) (val : nat -> A) (l : list nat)
  : nat -> A :=
  match l with
  | [] => m
  | i :: l' => applyWrites (upd m (idx i) (val i)) idx val l'
  end.

End Parallel.

(* our own permutation relation and membership (mirrors the Lean library) *)
Inductive Perm : list nat -> list nat -> Prop :=
  | perm_nil : Perm [] []
  | perm_skip : forall (x : nat) (l l' : list nat), Perm l l' -> Perm (x :: l) (x :: l')
  | perm_swap : forall (x y : nat) (l : list nat), Perm (y :: x :: l) (x :: y :: l)
  | perm_trans : forall (l l' l'' : list nat), Perm l l' -> Perm l' l'' -> Perm l l''.

Fixpoint InL (x : nat) (l : list nat) : Prop :=
  match l with
  | [] => False
  | y :: l' => y = x \/ InL x l'
  end.

Lemma perm_in : forall l l', Perm l l' -> forall x, InL x l -> InL x l'.
Proof.
  intros l l' HP. induction HP as [ | x l l' HP IH | x y l | l l' l'' H1 IH1 H2 IH2 ];
    intros z Hz.
  - exact Hz.
  - destruct Hz as [Hz | Hz].
    + left. exact Hz.
    + right. exact (IH z Hz).
  - destruct Hz as [Hz | [Hz | Hz]].
    + right. left. exact Hz.
    + left. exact Hz.
    + right. right. exact Hz.
  - exact (IH2 z (IH1 z Hz)).
Qed.

Lemma perm_sym : forall l l', Perm l l' -> Perm l' l.
Proof.
  intros l l' HP. induction HP as [ | x l l' HP IH | x y l | l l' l'' H1 IH1 H2 IH2 ].
  - exact perm_nil.
  - exact (perm_skip x l' l IH).
  - exact (perm_swap y x l).
  - exact (perm_trans l'' l' l IH2 IH1).
Qed.

Lemma upd_comm {A : Type} : forall (m : nat -> A) (a b : nat) (v w : A),
  a <> b -> upd (upd m a v) b w = upd (upd m b w) a v.
Proof.
  intros m a b v w Hab. apply functional_extensionality. intros x. unfold upd.
  destruct (Nat.eqb_spec x b) as [Hb | Hb]; destruct (Nat.eqb_spec x a) as [Ha | Ha].
  - exfalso. apply Hab. rewrite <- Ha, <- Hb. reflexivity.
  - reflexivity.
  - reflexivity.
  - reflexivity.
Qed.

Theorem parallel_writes {A : Type} : forall (idx : nat -> nat) (val : nat -> A) (l l' : list nat),
  Perm l l' ->
  forall (m : nat -> A),
  (forall i j, InL i l -> InL j l -> idx i = idx j -> i = j) ->
  applyWrites m idx val l = applyWrites m idx val l'.
Proof.
  intros idx val l l' HP.
  induction HP as [ | x l l' HP IH | x y l | l l' l'' H1 IH1 H2 IH2 ]; intros m Hinj.
  - reflexivity.
  - simpl. apply IH. intros i j Hi Hj. apply Hinj; right; assumption.
  - simpl. destruct (Nat.eq_dec (idx x) (idx y)) as [E | E].
    + assert (Hxy : x = y).
      { apply Hinj.
        - right. left. reflexivity.
        - left. reflexivity.
        - exact E. }
      rewrite Hxy. reflexivity.
    + rewrite (upd_comm m (idx y) (idx x) (val y) (val x)).
      * reflexivity.
      * intros Hyx. apply E. rewrite Hyx. reflexivity.
  - rewrite (IH1 m Hinj). apply IH2.
    intros i j Hi Hj. apply Hinj.
    + exact (perm_in l' l (perm_sym l l' H1) i Hi).
    + exact (perm_in l' l (perm_sym l l' H1) j Hj).
Qed.

(* A grid axis carrying several loops (PARALLEL of a second loop to a used axis): the axis
   enumerates x * E + i for the loops before (x < X, flattened) and the joining loop (i < E).
   The printers decode i = block mod E and x = block / E: both directions of the bijection. *)
Theorem grid_axis_product : forall (X E x i : nat),
  x < X -> i < E ->
  x * E + i < X * E /\ (x * E + i) / E = x /\ (x * E + i) mod E = i.
Proof.
  intros X E x i Hx Hi.
  assert (HE : E <> 0) by lia.
  split; [| split].
  - nia.
  - rewrite Nat.div_add_l by exact HE. rewrite Nat.div_small by exact Hi. lia.
  - rewrite Nat.add_comm. rewrite Nat.mod_add by exact HE. apply Nat.mod_small. exact Hi.
Qed.

Theorem grid_axis_cover : forall (X E b : nat),
  b < X * E ->
  b / E < X /\ b mod E < E /\ b = (b / E) * E + b mod E.
Proof.
  intros X E b Hb.
  assert (HE : E <> 0) by (intro H0; subst E; lia).
  split; [| split].
  - apply Nat.div_lt_upper_bound; [exact HE | rewrite Nat.mul_comm; exact Hb].
  - apply Nat.mod_upper_bound. exact HE.
  - rewrite Nat.mul_comm. apply Nat.div_mod. exact HE.
Qed.
