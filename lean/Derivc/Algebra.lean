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
  rmax_assoc : ∀ a b c : R, rmax (rmax a b) c = rmax a (rmax b c)
  rmax_comm : ∀ a b : R, rmax a b = rmax b a

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

/-! Extended values (Coq: Algebra.v, section Derived): no ring arithmetic on -inf. -/

/-- max on extended values (Coq: `max`); -inf is its unit -/
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
  cases a <;> cases b <;> cases c <;> simp only [emax, KAlg.rmax_assoc]

theorem max_comm (a b : Ext R) : emax a b = emax b a := by
  cases a <;> cases b <;> simp only [emax, KAlg.rmax_comm]

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

end Derivc
