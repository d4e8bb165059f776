/-
derivc proof library: the abstract element algebra (Lean core only).
Mirrors proofs_ci/coq/Algebra.v. Only the fields of `KAlg` are assumed.
-/
namespace Derivc

class KAlg (R : Type) where
  zero : R
  one : R
  add : R → R → R
  mul : R → R → R
  neg : R → R
  inv : R → R
  exp : R → R
  rmax : R → R → R
  /-- the value of an undefined operation (+inf, NaN): nothing is assumed about it -/
  undef : R
  add_assoc : ∀ a b c : R, add (add a b) c = add a (add b c)
  add_comm : ∀ a b : R, add a b = add b a
  add_zero : ∀ a : R, add a zero = a
  add_neg : ∀ a : R, add a (neg a) = zero
  mul_assoc : ∀ a b c : R, mul (mul a b) c = mul a (mul b c)
  mul_comm : ∀ a b : R, mul a b = mul b a
  mul_one : ∀ a : R, mul a one = a
  mul_add : ∀ a b c : R, mul a (add b c) = add (mul a b) (mul a c)
  one_ne_zero : one ≠ zero
  mul_inv : ∀ a : R, a ≠ zero → mul a (inv a) = one
  inv_mul_distrib : ∀ a b : R, inv (mul a b) = mul (inv a) (inv b)
  exp_add : ∀ a b : R, exp (add a b) = mul (exp a) (exp b)
  exp_zero : exp zero = one
  /-- a total order compatible with + -/
  le : R → R → Prop
  le_total : ∀ a b : R, le a b ∨ le b a
  le_antisym : ∀ a b : R, le a b → le b a → a = b
  le_trans : ∀ a b c : R, le a b → le b c → le a c
  le_add_r : ∀ a b c : R, le a b → le (add a c) (add b c)
  /-- finite max = the larger of the two (the join) -/
  rmax_l : ∀ a b : R, le b a → rmax a b = a
  rmax_r : ∀ a b : R, le a b → rmax a b = b
  /-- exp is monotone and nonnegative (exp a ≠ 0 is derived, so exp a > 0) -/
  exp_mono : ∀ a b : R, le a b → le (exp a) (exp b)
  exp_nonneg : ∀ a : R, le zero (exp a)
  /-- the 0/1 step of the order: gt a b = 1 if a > b else 0 (the derivative of max) -/
  gt : R → R → R
  gt_true : ∀ a b : R, ¬ le a b → gt a b = one
  gt_false : ∀ a b : R, le a b → gt a b = zero

/-- the extended values: finite, or -infinity as its own constructor (Coq: Fin / NInf) -/
inductive Ext (R : Type) where
  | fin : R → Ext R
  | ninf : Ext R

variable {R : Type} [KAlg R]

def sub (a b : R) : R := KAlg.add a (KAlg.neg b)
def div (a b : R) : R := KAlg.mul a (KAlg.inv b)

theorem add_0_l (a : R) : KAlg.add KAlg.zero a = a :=
  (KAlg.add_comm KAlg.zero a).trans (KAlg.add_zero a)

theorem add_cancel_l (a b c : R) (h : KAlg.add a b = KAlg.add a c) : b = c := by
  have e1 : b = KAlg.add (KAlg.add (KAlg.neg a) a) b := by
    rw [KAlg.add_comm (KAlg.neg a) a, KAlg.add_neg, add_0_l]
  have e2 : KAlg.add (KAlg.add (KAlg.neg a) a) c = c := by
    rw [KAlg.add_comm (KAlg.neg a) a, KAlg.add_neg, add_0_l]
  have e3 : KAlg.add (KAlg.add (KAlg.neg a) a) b = KAlg.add (KAlg.add (KAlg.neg a) a) c := by
    rw [KAlg.add_assoc (KAlg.neg a) a b, KAlg.add_assoc (KAlg.neg a) a c, h]
  exact e1.trans (e3.trans e2)

theorem mul_0_r (a : R) : KAlg.mul a KAlg.zero = KAlg.zero :=
  add_cancel_l (KAlg.mul a KAlg.zero) _ _
    (by rw [← KAlg.mul_add, KAlg.add_zero, KAlg.add_zero])

theorem mul_0_l (a : R) : KAlg.mul KAlg.zero a = KAlg.zero :=
  (KAlg.mul_comm KAlg.zero a).trans (mul_0_r a)

theorem mul_1_l (a : R) : KAlg.mul KAlg.one a = a :=
  (KAlg.mul_comm KAlg.one a).trans (KAlg.mul_one a)

theorem add_mul (a b c : R) :
    KAlg.mul (KAlg.add a b) c = KAlg.add (KAlg.mul a c) (KAlg.mul b c) := by
  rw [KAlg.mul_comm (KAlg.add a b) c, KAlg.mul_add, KAlg.mul_comm c a, KAlg.mul_comm c b]

theorem add_swap4 (a b c d : R) :
    KAlg.add (KAlg.add a b) (KAlg.add c d) = KAlg.add (KAlg.add a c) (KAlg.add b d) := by
  rw [KAlg.add_assoc a b (KAlg.add c d), KAlg.add_assoc a c (KAlg.add b d),
    ← KAlg.add_assoc b c d, KAlg.add_comm b c, KAlg.add_assoc c b d]

theorem mul_swap4 (a b c d : R) :
    KAlg.mul (KAlg.mul a b) (KAlg.mul c d) = KAlg.mul (KAlg.mul a c) (KAlg.mul b d) := by
  rw [KAlg.mul_assoc a b (KAlg.mul c d), KAlg.mul_assoc a c (KAlg.mul b d),
    ← KAlg.mul_assoc b c d, KAlg.mul_comm b c, KAlg.mul_assoc c b d]

theorem mul_rot (a b c : R) : KAlg.mul (KAlg.mul a b) c = KAlg.mul (KAlg.mul a c) b := by
  rw [KAlg.mul_assoc a b c, KAlg.mul_comm b c, ← KAlg.mul_assoc a c b]

theorem neg_cancel (a b : R) : KAlg.add (KAlg.neg a) (KAlg.add a b) = b := by
  rw [← KAlg.add_assoc (KAlg.neg a) a b, KAlg.add_comm (KAlg.neg a) a, KAlg.add_neg, add_0_l]

theorem exp_ne_zero (a : R) : KAlg.exp a ≠ KAlg.zero := by
  intro ha
  have e : (KAlg.one : R) = KAlg.mul (KAlg.exp a) (KAlg.exp (KAlg.neg a)) := by
    rw [← KAlg.exp_add, KAlg.add_neg, KAlg.exp_zero]
  rw [ha, mul_0_l] at e
  exact KAlg.one_ne_zero e

theorem exp_sub (a b : R) : KAlg.exp (sub a b) = KAlg.mul (KAlg.exp a) (KAlg.exp (KAlg.neg b)) :=
  KAlg.exp_add a (KAlg.neg b)

/-- exp (-m) * exp (m - m') = exp (-m'): the online-softmax rescale. -/
theorem exp_rescale (m m' : R) :
    KAlg.mul (KAlg.exp (KAlg.neg m)) (KAlg.exp (sub m m')) = KAlg.exp (KAlg.neg m') := by
  rw [← KAlg.exp_add]
  show KAlg.exp (KAlg.add (KAlg.neg m) (KAlg.add m (KAlg.neg m'))) = KAlg.exp (KAlg.neg m')
  rw [neg_cancel]

theorem div_cancel_l (e a b : R) (he : e ≠ KAlg.zero) :
    div (KAlg.mul e a) (KAlg.mul e b) = div a b := by
  show KAlg.mul (KAlg.mul e a) (KAlg.inv (KAlg.mul e b)) = KAlg.mul a (KAlg.inv b)
  rw [KAlg.inv_mul_distrib, mul_swap4, KAlg.mul_inv e he, mul_1_l]

theorem div_cancel_r (c a b : R) (hc : c ≠ KAlg.zero) :
    div (KAlg.mul a c) (KAlg.mul b c) = div a b := by
  rw [KAlg.mul_comm a c, KAlg.mul_comm b c]
  exact div_cancel_l c a b hc

/-! The order (Coq: Algebra.v): rmax is the join, exp is monotone. -/

theorem le_refl (a : R) : KAlg.le a a := by
  cases KAlg.le_total a a with
  | inl h => exact h
  | inr h => exact h

theorem le_rmax_l (a b : R) : KAlg.le a (KAlg.rmax a b) := by
  cases KAlg.le_total a b with
  | inl h => rw [KAlg.rmax_r a b h]; exact h
  | inr h => rw [KAlg.rmax_l a b h]; exact le_refl a

theorem le_rmax_r (a b : R) : KAlg.le b (KAlg.rmax a b) := by
  cases KAlg.le_total a b with
  | inl h => rw [KAlg.rmax_r a b h]; exact le_refl b
  | inr h => rw [KAlg.rmax_l a b h]; exact h

theorem rmax_lub (a b x : R) (ha : KAlg.le a x) (hb : KAlg.le b x) : KAlg.le (KAlg.rmax a b) x := by
  cases KAlg.le_total a b with
  | inl h => rw [KAlg.rmax_r a b h]; exact hb
  | inr h => rw [KAlg.rmax_l a b h]; exact ha

theorem rmax_comm (a b : R) : KAlg.rmax a b = KAlg.rmax b a :=
  KAlg.le_antisym _ _ (rmax_lub a b _ (le_rmax_r b a) (le_rmax_l b a))
    (rmax_lub b a _ (le_rmax_r a b) (le_rmax_l a b))

theorem rmax_assoc (a b c : R) :
    KAlg.rmax (KAlg.rmax a b) c = KAlg.rmax a (KAlg.rmax b c) :=
  KAlg.le_antisym _ _
    (rmax_lub _ _ _
      (rmax_lub _ _ _ (le_rmax_l a (KAlg.rmax b c))
        (KAlg.le_trans _ _ _ (le_rmax_l b c) (le_rmax_r a (KAlg.rmax b c))))
      (KAlg.le_trans _ _ _ (le_rmax_r b c) (le_rmax_r a (KAlg.rmax b c))))
    (rmax_lub _ _ _ (KAlg.le_trans _ _ _ (le_rmax_l a b) (le_rmax_l (KAlg.rmax a b) c))
      (rmax_lub _ _ _ (KAlg.le_trans _ _ _ (le_rmax_r a b) (le_rmax_l (KAlg.rmax a b) c))
        (le_rmax_r (KAlg.rmax a b) c)))

/-- the exp argument a - b is <= 0 exactly when a <= b -/
theorem le_sub_0 (a b : R) (h : KAlg.le a b) : KAlg.le (sub a b) KAlg.zero := by
  have e := KAlg.le_add_r a b (KAlg.neg b) h
  rw [KAlg.add_neg] at e
  exact e

theorem exp_le_one (a : R) (h : KAlg.le a KAlg.zero) : KAlg.le (KAlg.exp a) KAlg.one := by
  have e := KAlg.exp_mono a KAlg.zero h
  rw [KAlg.exp_zero] at e
  exact e

/-- the strict order (Coq: `rlt`); exp is positive -/
def rlt (a b : R) : Prop := KAlg.le a b ∧ a ≠ b

theorem exp_pos (a : R) : rlt KAlg.zero (KAlg.exp a) :=
  ⟨KAlg.exp_nonneg a, fun h => exp_ne_zero a h.symm⟩

theorem rlt_ne_zero (a : R) (h : rlt KAlg.zero a) : a ≠ KAlg.zero := fun e => h.2 e.symm

theorem le_add_nonneg_l (a b : R) (h : KAlg.le KAlg.zero a) : KAlg.le b (KAlg.add a b) := by
  have e := KAlg.le_add_r KAlg.zero a b h
  rw [add_0_l] at e
  exact e

theorem add_nonneg (a b : R) (ha : KAlg.le KAlg.zero a) (hb : KAlg.le KAlg.zero b) :
    KAlg.le KAlg.zero (KAlg.add a b) :=
  KAlg.le_trans _ _ _ hb (le_add_nonneg_l a b ha)

theorem add_nonneg_pos (a b : R) (ha : KAlg.le KAlg.zero a) (hb : rlt KAlg.zero b) :
    rlt KAlg.zero (KAlg.add a b) := by
  refine ⟨add_nonneg a b ha hb.1, ?_⟩
  intro z
  apply hb.2
  apply KAlg.le_antisym _ _ hb.1
  rw [z]
  exact le_add_nonneg_l a b ha

theorem add_pos_nonneg (a b : R) (ha : rlt KAlg.zero a) (hb : KAlg.le KAlg.zero b) :
    rlt KAlg.zero (KAlg.add a b) := by
  rw [KAlg.add_comm a b]
  exact add_nonneg_pos b a hb ha

theorem neg_add (a b : R) : KAlg.neg (KAlg.add a b) = KAlg.add (KAlg.neg a) (KAlg.neg b) := by
  apply add_cancel_l (KAlg.add a b)
  rw [KAlg.add_neg, add_swap4, KAlg.add_neg a, KAlg.add_neg b, KAlg.add_zero]

/-- x - (m + l) = (x - m) - l -/
theorem sub_add_r (x m l : R) : sub x (KAlg.add m l) = sub (sub x m) l := by
  show KAlg.add x (KAlg.neg (KAlg.add m l)) = KAlg.add (KAlg.add x (KAlg.neg m)) (KAlg.neg l)
  rw [neg_add, KAlg.add_assoc]

/-- a left inverse of a nonzero element is its inverse -/
theorem inv_of_mul_one (a b : R) (ha : a ≠ KAlg.zero) (h : KAlg.mul b a = KAlg.one) :
    b = KAlg.inv a := by
  rw [← KAlg.mul_one b, ← KAlg.mul_inv a ha, ← KAlg.mul_assoc, h, mul_1_l]

/-- the step function gt at equal arguments is 0 -/
theorem gt_refl (a : R) : KAlg.gt a a = KAlg.zero := KAlg.gt_false a a (le_refl a)

/-! Extended values (Coq: Algebra.v, section Derived): no ring arithmetic on -inf. -/

/-- max on extended values (Coq: `max`); -inf is its unit -/
/-- Comparisons of integer data (an i32 input tensor read in a condition, `Doc[b, i] == Doc[b, j]`),
the Coq export's Z.ltb / Z.leb / Z.eqb. -/
def zltb (a b : Int) : Bool := decide (a < b)
def zleb (a b : Int) : Bool := decide (a ≤ b)
def zeqb (a b : Int) : Bool := decide (a = b)

def emax : Ext R → Ext R → Ext R
  | Ext.ninf, y => y
  | Ext.fin x, Ext.ninf => Ext.fin x
  | Ext.fin x, Ext.fin y => Ext.fin (KAlg.rmax x y)

def eexp : Ext R → R
  | Ext.fin x => KAlg.exp x
  | Ext.ninf => KAlg.zero

/-- exp (a - b) on extended values -/
def expd : Ext R → Ext R → R
  | Ext.fin x, Ext.fin y => KAlg.exp (sub x y)
  | Ext.ninf, Ext.fin _ => KAlg.zero
  | _, Ext.ninf => KAlg.undef

/-- the IR's rescale(a, b) = exp (a - b), exactly one when both are -inf -/
def rescale : Ext R → Ext R → R
  | Ext.ninf, Ext.ninf => KAlg.one
  | a, b => expd a b

theorem max_assoc (a b c : Ext R) : emax (emax a b) c = emax a (emax b c) := by
  cases a <;> cases b <;> cases c <;> simp only [emax, rmax_assoc]

theorem max_comm (a b : Ext R) : emax a b = emax b a := by
  cases a <;> cases b <;> simp only [emax, rmax_comm]

theorem max_ninf (a : Ext R) : emax Ext.ninf a = a := by
  cases a <;> rfl

theorem max_ninf_r (a : Ext R) : emax a Ext.ninf = a := by
  cases a <;> rfl

theorem max_NInf_inv (a b : Ext R) (h : emax a b = Ext.ninf) : a = Ext.ninf ∧ b = Ext.ninf := by
  cases a <;> cases b <;> simp only [emax] at h <;> first | exact ⟨rfl, rfl⟩ | cases h

theorem max_fin_l (x : R) (b : Ext R) : emax (Ext.fin x) b ≠ Ext.ninf := by
  cases b <;> simp only [emax] <;> intro h <;> cases h

theorem eexp_ninf : eexp (Ext.ninf : Ext R) = KAlg.zero := rfl

theorem expd_fin (x y : R) : expd (Ext.fin x) (Ext.fin y) = KAlg.exp (sub x y) := rfl

theorem expd_ninf_l (y : R) : expd Ext.ninf (Ext.fin y) = KAlg.zero := rfl

theorem rescale_diag (a : Ext R) : rescale a a = KAlg.one := by
  cases a with
  | fin x =>
    show KAlg.exp (KAlg.add x (KAlg.neg x)) = KAlg.one
    rw [KAlg.add_neg, KAlg.exp_zero]
  | ninf => rfl

theorem rescale_fin (x y : R) : rescale (Ext.fin x) (Ext.fin y) = KAlg.exp (sub x y) := rfl

theorem rescale_ninf_l (y : R) : rescale Ext.ninf (Ext.fin y) = KAlg.zero := rfl

/-- the order on extended values: -inf below everything (Coq: `ele`) -/
def ele : Ext R → Ext R → Prop
  | Ext.ninf, _ => True
  | Ext.fin _, Ext.ninf => False
  | Ext.fin x, Ext.fin y => KAlg.le x y

theorem ele_ninf (a : Ext R) : ele Ext.ninf a := by
  cases a <;> exact True.intro

theorem ele_refl (a : Ext R) : ele a a := by
  cases a with
  | fin x => exact le_refl x
  | ninf => exact True.intro

theorem ele_trans (a b c : Ext R) (h1 : ele a b) (h2 : ele b c) : ele a c := by
  cases a with
  | ninf => exact True.intro
  | fin x =>
    cases b with
    | ninf => exact False.elim h1
    | fin y =>
      cases c with
      | ninf => exact False.elim h2
      | fin z => exact KAlg.le_trans x y z h1 h2

theorem ele_max_l (a b : Ext R) : ele a (emax a b) := by
  cases a with
  | ninf => exact True.intro
  | fin x =>
    cases b with
    | ninf => exact le_refl x
    | fin y => exact le_rmax_l x y

theorem ele_max_r (a b : Ext R) : ele b (emax a b) := by
  cases a with
  | ninf => exact ele_refl b
  | fin x =>
    cases b with
    | ninf => exact True.intro
    | fin y => exact le_rmax_r x y

/-- max is the join: the larger of the two -/
theorem max_l (a b : Ext R) (h : ele b a) : emax a b = a := by
  cases a with
  | ninf =>
    cases b with
    | ninf => rfl
    | fin y => exact False.elim h
  | fin x =>
    cases b with
    | ninf => rfl
    | fin y =>
      show Ext.fin (KAlg.rmax x y) = Ext.fin x
      rw [KAlg.rmax_l x y h]

theorem max_r (a b : Ext R) (h : ele a b) : emax a b = b := by
  cases a with
  | ninf => rfl
  | fin x =>
    cases b with
    | ninf => exact False.elim h
    | fin y =>
      show Ext.fin (KAlg.rmax x y) = Ext.fin y
      rw [KAlg.rmax_r x y h]

/-- the safety of the IR's rescale(a, b) = exp (a - b): the argument is <= 0
    (rescale(-inf, -inf) = 1 by convention) (Coq: `rescale_safe`) -/
def rescale_safe : Ext R → Ext R → Prop
  | Ext.ninf, _ => True
  | Ext.fin _, Ext.ninf => False
  | Ext.fin x, Ext.fin y => KAlg.le (sub x y) KAlg.zero

/-- the safety of a plain exp (a - b): as rescale, except that -inf - (-inf) is NaN
    (Coq: `expd_safe`) -/
def expd_safe : Ext R → Ext R → Prop
  | Ext.fin x, Ext.fin y => KAlg.le (sub x y) KAlg.zero
  | Ext.ninf, Ext.fin _ => True
  | _, Ext.ninf => False

theorem rescale_safe_of_ele (a b : Ext R) (h : ele a b) : rescale_safe a b := by
  cases a with
  | ninf => exact True.intro
  | fin x =>
    cases b with
    | ninf => exact False.elim h
    | fin y => exact le_sub_0 x y h

theorem expd_safe_of_ele_ne (a b : Ext R) (h : ele a b) (hn : a ≠ Ext.ninf) : expd_safe a b := by
  cases a with
  | ninf => exact absurd rfl hn
  | fin x =>
    cases b with
    | ninf => exact False.elim h
    | fin y => exact le_sub_0 x y h

theorem expd_safe_le_one (x y : R) (h : expd_safe (Ext.fin x) (Ext.fin y)) :
    KAlg.le (expd (Ext.fin x) (Ext.fin y)) KAlg.one :=
  exp_le_one (sub x y) h

theorem rescale_safe_max_l (a b : Ext R) : rescale_safe a (emax a b) :=
  rescale_safe_of_ele a (emax a b) (ele_max_l a b)

/-- on safe arguments exp (a - b) never meets `undef`: its value is one of these -/
def expd_def : Ext R → Ext R → R
  | Ext.fin x, Ext.fin y => KAlg.exp (sub x y)
  | _, _ => KAlg.zero

def rescale_def : Ext R → Ext R → R
  | Ext.fin x, Ext.fin y => KAlg.exp (sub x y)
  | Ext.ninf, Ext.ninf => KAlg.one
  | _, _ => KAlg.zero

theorem expd_safe_defined (a b : Ext R) (h : expd_safe a b) : expd a b = expd_def a b := by
  cases a with
  | ninf =>
    cases b with
    | ninf => exact False.elim h
    | fin y => rfl
  | fin x =>
    cases b with
    | ninf => exact False.elim h
    | fin y => rfl

theorem rescale_safe_defined (a b : Ext R) (h : rescale_safe a b) :
    rescale a b = rescale_def a b := by
  cases a with
  | ninf =>
    cases b with
    | ninf => rfl
    | fin y => rfl
  | fin x =>
    cases b with
    | ninf => exact False.elim h
    | fin y => rfl

/-- exp (-inf - (-inf)) is NaN: never safe -/
theorem expd_safe_ninf_ninf : ¬ expd_safe (Ext.ninf : Ext R) Ext.ninf := fun h => h

end Derivc

/-! The logarithm (Coq: `Class KAlgLog`): a separate class, since its laws make exp a bijection
onto the positive elements, which the rational model (exp := 1) cannot satisfy.  Only the
theorems that mention log assume it. -/
namespace Derivc

class KAlgLog (R : Type) [KAlg R] where
  log : R → R
  exp_log : ∀ a : R, rlt KAlg.zero a → KAlg.exp (log a) = a
  log_exp : ∀ a : R, log (KAlg.exp a) = a

section LogDerived
variable {R : Type} [KAlg R] [KAlgLog R]

/-- `KAlg.log`: the obligations' spelling of the class KAlgLog's log (Coq: `log`) -/
abbrev KAlg.log (a : R) : R := KAlgLog.log a

/-- exp (- log a) = 1 / a for a > 0 -/
theorem exp_neg_log (a : R) (ha : rlt KAlg.zero a) :
    KAlg.exp (KAlg.neg (KAlgLog.log a)) = KAlg.inv a := by
  apply inv_of_mul_one a _ (rlt_ne_zero a ha)
  have e : KAlg.mul (KAlg.exp (KAlg.neg (KAlgLog.log a))) (KAlg.exp (KAlgLog.log a)) = KAlg.one := by
    rw [← KAlg.exp_add, KAlg.add_comm (KAlg.neg (KAlgLog.log a)) (KAlgLog.log a), KAlg.add_neg,
      KAlg.exp_zero]
  rw [KAlgLog.exp_log a ha] at e
  exact e

/-- exp (x - log l) = exp x / l for l > 0 -/
theorem exp_sub_log (x l : R) (hl : rlt KAlg.zero l) :
    KAlg.exp (sub x (KAlgLog.log l)) = div (KAlg.exp x) l := by
  show KAlg.exp (sub x (KAlgLog.log l)) = KAlg.mul (KAlg.exp x) (KAlg.inv l)
  rw [exp_sub, exp_neg_log l hl]

end LogDerived

end Derivc
