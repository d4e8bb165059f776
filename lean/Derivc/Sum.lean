/-
derivc proof library: finite sums / maxima over index ranges, generated
tensors, ceilDiv, and the core lemmas the rule theorems are built from.
Mirrors proofs_ci/coq/Sum.v.
-/
import Derivc.Algebra

namespace Derivc

def ceilDiv (n t : Nat) : Nat := (n + t - 1) / t

/-! Small Nat facts, proved here so that we depend on few core lemma names. -/

theorem succ_mul' (n t : Nat) : (n + 1) * t = n * t + t := Nat.succ_mul n t

theorem mul_le_mul_r' (a b t : Nat) (h : a ≤ b) : a * t ≤ b * t := by
  induction t with
  | zero => omega
  | succ t ih =>
    have e1 : a * (t + 1) = a * t + a := Nat.mul_succ a t
    have e2 : b * (t + 1) = b * t + b := Nat.mul_succ b t
    omega

theorem mul_le_mul_l' (t a b : Nat) (h : a ≤ b) : t * a ≤ t * b := by
  have e1 : t * a = a * t := Nat.mul_comm t a
  have e2 : t * b = b * t := Nat.mul_comm t b
  have h3 := mul_le_mul_r' a b t h
  omega

theorem ceilDiv_ge (N t : Nat) (ht : 0 < t) : N ≤ ceilDiv N t * t := by
  have h1 := Nat.mod_add_div (N + t - 1) t
  have h2 := Nat.mod_lt (N + t - 1) ht
  have h3 : ceilDiv N t * t = t * ((N + t - 1) / t) := Nat.mul_comm _ _
  omega

variable {R : Type} [KAlg R]

def sumTo : Nat → (Nat → R) → R
  | 0, _ => KAlg.zero
  | n + 1, f => KAlg.add (sumTo n f) (f n)

/-- max over a range: an extended value, -inf when the range is empty -/
def maxTo : Nat → (Nat → Ext R) → Ext R
  | 0, _ => Ext.ninf
  | n + 1, f => emax (maxTo n f) (f n)

/-- a generated (producer) tensor of extent n -/
def genAt (n : Nat) (f : Nat → R) (i : Nat) : R :=
  if i < n then f i else KAlg.zero

/-- a generated tensor of extended values (e.g. a row max): -inf outside its extent -/
def genAtX (n : Nat) (f : Nat → Ext R) (i : Nat) : Ext R :=
  if i < n then f i else Ext.ninf

theorem sumTo_O (f : Nat → R) : sumTo 0 f = KAlg.zero := rfl

theorem sumTo_S (n : Nat) (f : Nat → R) : sumTo (n + 1) f = KAlg.add (sumTo n f) (f n) := rfl

theorem maxTo_O (f : Nat → Ext R) : maxTo 0 f = Ext.ninf := rfl

theorem maxTo_S (n : Nat) (f : Nat → Ext R) : maxTo (n + 1) f = emax (maxTo n f) (f n) := rfl

theorem sumTo_ext : ∀ (n : Nat) (f g : Nat → R),
    (∀ i, i < n → f i = g i) → sumTo n f = sumTo n g := by
  intro n
  induction n with
  | zero => intro f g _; rfl
  | succ n ih =>
    intro f g hfg
    rw [sumTo_S, sumTo_S, ih f g (fun i hi => hfg i (by omega)), hfg n (by omega)]

theorem maxTo_ext : ∀ (n : Nat) (f g : Nat → Ext R),
    (∀ i, i < n → f i = g i) → maxTo n f = maxTo n g := by
  intro n
  induction n with
  | zero => intro f g _; rfl
  | succ n ih =>
    intro f g hfg
    rw [maxTo_S, maxTo_S, ih f g (fun i hi => hfg i (by omega)), hfg n (by omega)]

theorem sumTo_zero_ext : ∀ (n : Nat) (f : Nat → R),
    (∀ i, i < n → f i = KAlg.zero) → sumTo n f = KAlg.zero := by
  intro n
  induction n with
  | zero => intro f _; rfl
  | succ n ih =>
    intro f hf
    rw [sumTo_S, ih f (fun i hi => hf i (by omega)), hf n (by omega), KAlg.add_zero]

theorem sumTo_const_zero (n : Nat) : sumTo n (fun _ => (KAlg.zero : R)) = KAlg.zero :=
  sumTo_zero_ext n _ (fun _ _ => rfl)

theorem maxTo_ninf_ext : ∀ (n : Nat) (f : Nat → Ext R),
    (∀ i, i < n → f i = Ext.ninf) → maxTo n f = Ext.ninf := by
  intro n
  induction n with
  | zero => intro f _; rfl
  | succ n ih =>
    intro f hf
    rw [maxTo_S, ih f (fun i hi => hf i (by omega)), hf n (by omega), max_ninf_r]

/-- splitting a range [0, a+b) into [0, a) and [a, a+b) -/
theorem sumTo_app (a b : Nat) (f : Nat → R) :
    sumTo (a + b) f = KAlg.add (sumTo a f) (sumTo b (fun j => f (a + j))) := by
  induction b with
  | zero => rw [Nat.add_zero, sumTo_O, KAlg.add_zero]
  | succ b ih =>
    have e : a + (b + 1) = a + b + 1 := by omega
    rw [e, sumTo_S (a + b) f, sumTo_S b (fun j => f (a + j)), ih, KAlg.add_assoc]

theorem maxTo_app (a b : Nat) (f : Nat → Ext R) :
    maxTo (a + b) f = emax (maxTo a f) (maxTo b (fun j => f (a + j))) := by
  induction b with
  | zero => rw [Nat.add_zero, maxTo_O, max_ninf_r]
  | succ b ih =>
    have e : a + (b + 1) = a + b + 1 := by omega
    rw [e, maxTo_S (a + b) f, maxTo_S b (fun j => f (a + j)), ih, max_assoc]

theorem sumTo_plus (n : Nat) (f g : Nat → R) :
    sumTo n (fun j => KAlg.add (f j) (g j)) = KAlg.add (sumTo n f) (sumTo n g) := by
  induction n with
  | zero => exact (KAlg.add_zero KAlg.zero).symm
  | succ n ih =>
    rw [sumTo_S n (fun j => KAlg.add (f j) (g j)), sumTo_S n f, sumTo_S n g, ih, add_swap4]

theorem sumTo_mul_r (n : Nat) (f : Nat → R) (c : R) :
    sumTo n (fun j => KAlg.mul (f j) c) = KAlg.mul (sumTo n f) c := by
  induction n with
  | zero => exact (mul_0_l c).symm
  | succ n ih =>
    rw [sumTo_S n (fun j => KAlg.mul (f j) c), sumTo_S n f, ih, add_mul]

theorem sumTo_mul_l (n : Nat) (f : Nat → R) (c : R) :
    sumTo n (fun j => KAlg.mul c (f j)) = KAlg.mul c (sumTo n f) := by
  have h : sumTo n (fun j => KAlg.mul c (f j)) = sumTo n (fun j => KAlg.mul (f j) c) :=
    sumTo_ext n _ _ (fun j _ => KAlg.mul_comm c (f j))
  rw [h, sumTo_mul_r n f c, KAlg.mul_comm (sumTo n f) c]

/-- dropping a tail of zero terms -/
theorem sumTo_trunc (n k : Nat) (f : Nat → R)
    (hz : ∀ j, k ≤ j → j < n → f j = KAlg.zero) (hk : k ≤ n) :
    sumTo n f = sumTo k f := by
  have e : n = k + (n - k) := by omega
  have hz' : sumTo (n - k) (fun j => f (k + j)) = KAlg.zero :=
    sumTo_zero_ext (n - k) (fun j => f (k + j)) (fun j hj => hz (k + j) (by omega) (by omega))
  rw [e, sumTo_app k (n - k) f, hz', KAlg.add_zero]

theorem maxTo_trunc (n k : Nat) (f : Nat → Ext R)
    (hz : ∀ j, k ≤ j → j < n → f j = Ext.ninf) (hk : k ≤ n) :
    maxTo n f = maxTo k f := by
  have e : n = k + (n - k) := by omega
  have hz' : maxTo (n - k) (fun j => f (k + j)) = Ext.ninf :=
    maxTo_ninf_ext (n - k) (fun j => f (k + j)) (fun j hj => hz (k + j) (by omega) (by omega))
  rw [e, maxTo_app k (n - k) f, hz', max_ninf_r]

/-- a max that is -inf has only -inf terms -/
theorem maxTo_NInf_inv : ∀ (n : Nat) (f : Nat → Ext R),
    maxTo n f = Ext.ninf → ∀ k, k < n → f k = Ext.ninf := by
  intro n
  induction n with
  | zero => intro f _ k hk; exact absurd hk (Nat.not_lt_zero k)
  | succ n ih =>
    intro f e k hk
    rw [maxTo_S] at e
    have h := max_NInf_inv (maxTo n f) (f n) e
    by_cases hkn : k = n
    · rw [hkn]; exact h.2
    · exact ih f h.1 k (by omega)

end Derivc
