/- The softmax vector-Jacobian product, algebraically (GRAD's softmax adjoint), with dual
   numbers a + ε a' (ε² = 0; dexp says exp' = exp).  Mirrors Rules/SoftmaxVjp.v, where Coq's
   `ring` closes the ring identities; here they are spelled out with the ring laws.
   NOT checked in this environment (no Lean toolchain). -/
import Derivc.Tactics

namespace Derivc

structure Dual (R : Type) where
  re : R
  eps : R

section SoftmaxVjp
variable {R : Type} [KAlg R]

def dzero : Dual R := ⟨KAlg.zero, KAlg.zero⟩
def dadd (a b : Dual R) : Dual R := ⟨KAlg.add a.re b.re, KAlg.add a.eps b.eps⟩
def dmul (a b : Dual R) : Dual R :=
  ⟨KAlg.mul a.re b.re, KAlg.add (KAlg.mul a.re b.eps) (KAlg.mul a.eps b.re)⟩
def dinv (a : Dual R) : Dual R :=
  ⟨KAlg.inv a.re, KAlg.neg (KAlg.mul a.eps (KAlg.mul (KAlg.inv a.re) (KAlg.inv a.re)))⟩
def ddiv (a b : Dual R) : Dual R := dmul a (dinv b)
def dexp (a : Dual R) : Dual R := ⟨KAlg.exp a.re, KAlg.mul (KAlg.exp a.re) a.eps⟩

def dsum : Nat → (Nat → Dual R) → Dual R
  | 0, _ => dzero
  | n + 1, f => dadd (dsum n f) (f n)

theorem mul_neg_r (a b : R) : KAlg.mul a (KAlg.neg b) = KAlg.neg (KAlg.mul a b) := by
  apply add_cancel_l (KAlg.mul a b)
  rw [← KAlg.mul_add a b (KAlg.neg b), KAlg.add_neg b, mul_0_r, KAlg.add_neg (KAlg.mul a b)]

theorem mul_neg_swap (a b : R) : KAlg.mul b (KAlg.neg a) = KAlg.mul a (KAlg.neg b) := by
  rw [mul_neg_r b a, mul_neg_r a b, KAlg.mul_comm b a]

/-- dinv is the inverse of the dual numbers with a nonzero real part -/
theorem dmul_dinv (a : Dual R) (ha : a.re ≠ KAlg.zero) :
    dmul a (dinv a) = (⟨KAlg.one, KAlg.zero⟩ : Dual R) := by
  have h : KAlg.add (KAlg.mul a.re (KAlg.neg (KAlg.mul a.eps
      (KAlg.mul (KAlg.inv a.re) (KAlg.inv a.re))))) (KAlg.mul a.eps (KAlg.inv a.re)) = KAlg.zero := by
    rw [mul_neg_r, mul_left_comm a.re a.eps (KAlg.mul (KAlg.inv a.re) (KAlg.inv a.re)),
      ← KAlg.mul_assoc a.re (KAlg.inv a.re) (KAlg.inv a.re), KAlg.mul_inv a.re ha, mul_1_l,
      KAlg.add_comm (KAlg.neg (KAlg.mul a.eps (KAlg.inv a.re))) (KAlg.mul a.eps (KAlg.inv a.re)),
      KAlg.add_neg]
  show (⟨KAlg.mul a.re (KAlg.inv a.re), KAlg.add (KAlg.mul a.re (KAlg.neg (KAlg.mul a.eps
      (KAlg.mul (KAlg.inv a.re) (KAlg.inv a.re))))) (KAlg.mul a.eps (KAlg.inv a.re))⟩ : Dual R)
    = ⟨KAlg.one, KAlg.zero⟩
  rw [h, KAlg.mul_inv a.re ha]

/-- the masked softmax over dual scores (0 at masked keys, as softmaxAtG) -/
def dsoftmaxG (g : Nat → Bool) (n : Nat) (x : Nat → Dual R) (j : Nat) : Dual R :=
  if g j = true then ddiv (dexp (x j)) (dsum n (fun k => if g k = true then dexp (x k) else dzero))
  else dzero

def dual_row (s t : Nat → R) (k : Nat) : Dual R := ⟨s k, t k⟩

theorem dsum_re : ∀ (n : Nat) (f : Nat → Dual R), (dsum n f).re = sumTo n (fun k => (f k).re) := by
  intro n
  induction n with
  | zero => intro f; rfl
  | succ n ih =>
    intro f
    show KAlg.add (dsum n f).re (f n).re = KAlg.add (sumTo n (fun k => (f k).re)) (f n).re
    rw [ih f]

theorem dsum_eps : ∀ (n : Nat) (f : Nat → Dual R), (dsum n f).eps = sumTo n (fun k => (f k).eps) := by
  intro n
  induction n with
  | zero => intro f; rfl
  | succ n ih =>
    intro f
    show KAlg.add (dsum n f).eps (f n).eps = KAlg.add (sumTo n (fun k => (f k).eps)) (f n).eps
    rw [ih f]

theorem dual_row_sum_re (g : Nat → Bool) (n : Nat) (s t : Nat → R) :
    (dsum n (fun k => if g k = true then dexp (dual_row s t k) else dzero)).re
      = sumTo n (fun k => if g k = true then KAlg.exp (s k) else KAlg.zero) := by
  rw [dsum_re]
  apply sumTo_ext
  intro k _
  show (if g k = true then dexp (dual_row s t k) else dzero).re
    = (if g k = true then KAlg.exp (s k) else KAlg.zero)
  by_cases hk : g k = true
  · rw [if_pos hk, if_pos hk]; rfl
  · rw [if_neg hk, if_neg hk]; rfl

theorem dual_row_sum_eps (g : Nat → Bool) (n : Nat) (s t : Nat → R) :
    (dsum n (fun k => if g k = true then dexp (dual_row s t k) else dzero)).eps
      = sumTo n (fun k => if g k = true then KAlg.mul (KAlg.exp (s k)) (t k) else KAlg.zero) := by
  rw [dsum_eps]
  apply sumTo_ext
  intro k _
  show (if g k = true then dexp (dual_row s t k) else dzero).eps
    = (if g k = true then KAlg.mul (KAlg.exp (s k)) (t k) else KAlg.zero)
  by_cases hk : g k = true
  · rw [if_pos hk, if_pos hk]; rfl
  · rw [if_neg hk, if_neg hk]; rfl

/-- the real part is the masked softmax -/
theorem dsoftmaxG_re (g : Nat → Bool) (n : Nat) (s t : Nat → R) (j : Nat) :
    (dsoftmaxG g n (dual_row s t) j).re = softmaxAtG g n s j := by
  unfold dsoftmaxG softmaxAtG
  by_cases hg : g j = true
  · rw [if_pos hg, if_pos hg]
    show KAlg.mul (KAlg.exp (s j))
        (KAlg.inv (dsum n (fun k => if g k = true then dexp (dual_row s t k) else dzero)).re)
      = KAlg.mul (KAlg.exp (s j))
        (KAlg.inv (sumTo n (fun k => if g k = true then KAlg.exp (s k) else KAlg.zero)))
    rw [dual_row_sum_re]
  · rw [if_neg hg, if_neg hg]; rfl

/-- the ring identity of the ε part: e (-(Z' / Z²)) + e t / Z = (e / Z) (t - Z' / Z) -/
theorem vjp_eps_alg (e t Z Z' : R) :
    KAlg.add (KAlg.mul e (KAlg.neg (KAlg.mul Z' (KAlg.mul (KAlg.inv Z) (KAlg.inv Z)))))
        (KAlg.mul (KAlg.mul e t) (KAlg.inv Z))
      = KAlg.mul (KAlg.mul e (KAlg.inv Z)) (sub t (KAlg.mul Z' (KAlg.inv Z))) := by
  have h1 : KAlg.mul e (KAlg.neg (KAlg.mul Z' (KAlg.mul (KAlg.inv Z) (KAlg.inv Z))))
      = KAlg.mul (KAlg.mul e (KAlg.inv Z)) (KAlg.neg (KAlg.mul Z' (KAlg.inv Z))) := by
    rw [mul_neg_r e, mul_neg_r (KAlg.mul e (KAlg.inv Z)),
      KAlg.mul_assoc e (KAlg.inv Z) (KAlg.mul Z' (KAlg.inv Z)),
      mul_left_comm (KAlg.inv Z) Z' (KAlg.inv Z)]
  rw [h1, mul_rot e t (KAlg.inv Z)]
  show KAlg.add (KAlg.mul (KAlg.mul e (KAlg.inv Z)) (KAlg.neg (KAlg.mul Z' (KAlg.inv Z))))
      (KAlg.mul (KAlg.mul e (KAlg.inv Z)) t)
    = KAlg.mul (KAlg.mul e (KAlg.inv Z)) (KAlg.add t (KAlg.neg (KAlg.mul Z' (KAlg.inv Z))))
  rw [KAlg.mul_add]
  exact KAlg.add_comm _ _

/-- the ε part is the directional derivative: P_j (t_j - Σ_k P_k t_k) -/
theorem dsoftmaxG_eps (g : Nat → Bool) (n : Nat) (s t : Nat → R) (j : Nat) :
    (dsoftmaxG g n (dual_row s t) j).eps
      = KAlg.mul (softmaxAtG g n s j)
          (sub (t j) (sumTo n (fun k => KAlg.mul (softmaxAtG g n s k) (t k)))) := by
  have hP : sumTo n (fun k => KAlg.mul (softmaxAtG g n s k) (t k))
      = KAlg.mul (sumTo n (fun k => if g k = true then KAlg.mul (KAlg.exp (s k)) (t k) else KAlg.zero))
          (KAlg.inv (sumTo n (fun k => if g k = true then KAlg.exp (s k) else KAlg.zero))) := by
    rw [← sumTo_mul_r]
    apply sumTo_ext
    intro k _
    show KAlg.mul (softmaxAtG g n s k) (t k)
      = KAlg.mul (if g k = true then KAlg.mul (KAlg.exp (s k)) (t k) else KAlg.zero)
          (KAlg.inv (sumTo n (fun k => if g k = true then KAlg.exp (s k) else KAlg.zero)))
    unfold softmaxAtG
    by_cases hk : g k = true
    · rw [if_pos hk, if_pos hk]
      exact mul_rot _ _ _
    · rw [if_neg hk, if_neg hk, mul_0_l, mul_0_l]
  rw [hP]
  unfold dsoftmaxG softmaxAtG
  by_cases hg : g j = true
  · rw [if_pos hg, if_pos hg]
    show KAlg.add (KAlg.mul (KAlg.exp (s j)) (KAlg.neg (KAlg.mul
          (dsum n (fun k => if g k = true then dexp (dual_row s t k) else dzero)).eps
          (KAlg.mul (KAlg.inv (dsum n (fun k => if g k = true then dexp (dual_row s t k) else dzero)).re)
            (KAlg.inv (dsum n (fun k => if g k = true then dexp (dual_row s t k) else dzero)).re)))))
        (KAlg.mul (KAlg.mul (KAlg.exp (s j)) (t j))
          (KAlg.inv (dsum n (fun k => if g k = true then dexp (dual_row s t k) else dzero)).re))
      = KAlg.mul (KAlg.mul (KAlg.exp (s j))
          (KAlg.inv (sumTo n (fun k => if g k = true then KAlg.exp (s k) else KAlg.zero))))
          (sub (t j) (KAlg.mul
            (sumTo n (fun k => if g k = true then KAlg.mul (KAlg.exp (s k)) (t k) else KAlg.zero))
            (KAlg.inv (sumTo n (fun k => if g k = true then KAlg.exp (s k) else KAlg.zero)))))
    rw [dual_row_sum_re, dual_row_sum_eps]
    exact vjp_eps_alg _ _ _ _
  · rw [if_neg hg, if_neg hg]
    show KAlg.zero = KAlg.mul KAlg.zero _
    rw [mul_0_l]

theorem vjp_term_l (c p t a : R) :
    KAlg.mul c (KAlg.mul p (sub t a))
      = KAlg.add (KAlg.mul t (KAlg.mul p c)) (KAlg.mul (KAlg.mul p c) (KAlg.neg a)) := by
  show KAlg.mul c (KAlg.mul p (KAlg.add t (KAlg.neg a))) = _
  rw [KAlg.mul_add p, KAlg.mul_add c]
  have h1 : KAlg.mul c (KAlg.mul p t) = KAlg.mul t (KAlg.mul p c) := by
    rw [← KAlg.mul_assoc c p t, KAlg.mul_comm (KAlg.mul c p) t, KAlg.mul_comm c p]
  have h2 : KAlg.mul c (KAlg.mul p (KAlg.neg a)) = KAlg.mul (KAlg.mul p c) (KAlg.neg a) := by
    rw [← KAlg.mul_assoc c p (KAlg.neg a), KAlg.mul_comm c p]
  rw [h1, h2]

theorem vjp_term_r (t p c b : R) :
    KAlg.mul t (KAlg.mul p (sub c b))
      = KAlg.add (KAlg.mul t (KAlg.mul p c)) (KAlg.mul (KAlg.mul p t) (KAlg.neg b)) := by
  show KAlg.mul t (KAlg.mul p (KAlg.add c (KAlg.neg b))) = _
  rw [KAlg.mul_add p, KAlg.mul_add t]
  have h : KAlg.mul t (KAlg.mul p (KAlg.neg b)) = KAlg.mul (KAlg.mul p t) (KAlg.neg b) := by
    rw [← KAlg.mul_assoc t p (KAlg.neg b), KAlg.mul_comm t p]
  rw [h]

/-- the vector-Jacobian product of the masked softmax row -/
theorem softmax_vjp_row (g : Nat → Bool) (n : Nat) (s t c : Nat → R) :
    sumTo n (fun j => KAlg.mul (c j) (dsoftmaxG g n (dual_row s t) j).eps)
      = sumTo n (fun j => KAlg.mul (t j) (KAlg.mul (softmaxAtG g n s j)
          (sub (c j) (sumTo n (fun k => KAlg.mul (softmaxAtG g n s k) (c k)))))) := by
  have hl : sumTo n (fun j => KAlg.mul (c j) (dsoftmaxG g n (dual_row s t) j).eps)
      = sumTo n (fun j => KAlg.add (KAlg.mul (t j) (KAlg.mul (softmaxAtG g n s j) (c j)))
          (KAlg.mul (KAlg.mul (softmaxAtG g n s j) (c j))
            (KAlg.neg (sumTo n (fun k => KAlg.mul (softmaxAtG g n s k) (t k)))))) := by
    apply sumTo_ext
    intro j _
    show KAlg.mul (c j) (dsoftmaxG g n (dual_row s t) j).eps = _
    rw [dsoftmaxG_eps]
    exact vjp_term_l _ _ _ _
  have hr : sumTo n (fun j => KAlg.mul (t j) (KAlg.mul (softmaxAtG g n s j)
          (sub (c j) (sumTo n (fun k => KAlg.mul (softmaxAtG g n s k) (c k))))))
      = sumTo n (fun j => KAlg.add (KAlg.mul (t j) (KAlg.mul (softmaxAtG g n s j) (c j)))
          (KAlg.mul (KAlg.mul (softmaxAtG g n s j) (t j))
            (KAlg.neg (sumTo n (fun k => KAlg.mul (softmaxAtG g n s k) (c k)))))) := by
    apply sumTo_ext
    intro j _
    exact vjp_term_r _ _ _ _
  rw [hl, hr, sumTo_plus, sumTo_plus, sumTo_mul_r, sumTo_mul_r, mul_neg_swap]

end SoftmaxVjp

end Derivc
