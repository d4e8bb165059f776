/- Rule ONLINE-AGG: flash-attention style tile-by-tile softmax aggregation with a
   running max m (an extended value, starting at -inf), running denominator l and running
   accumulator acc.  The new running max `mnext` must be defined: -inf only while every key
   seen is masked (`online_max_ok`).  A fully masked row gives 0.
   Mirrors Rules/OnlineAgg.v.  NOT checked here (no Lean toolchain). -/
import Derivc.Rules.SplitSoftmax

namespace Derivc

structure OState (R : Type) where
  st_m : Ext R
  st_l : R
  st_acc : R

variable {R : Type} [KAlg R]

/-- generic step: `w j m'` is the (possibly masked) weight of score j under max m' -/
def onlineStepW (w : Nat → Ext R → R) (v : Nat → R) (t : Nat) (mnext : Nat → Ext R → Ext R)
    (o : Nat) (st : OState R) : OState R :=
  OState.mk (mnext o st.st_m)
    (KAlg.add (KAlg.mul st.st_l (rescale st.st_m (mnext o st.st_m)))
      (sumTo t (fun i => w (o * t + i) (mnext o st.st_m))))
    (KAlg.add (KAlg.mul st.st_acc (rescale st.st_m (mnext o st.st_m)))
      (sumTo t (fun i => KAlg.mul (w (o * t + i) (mnext o st.st_m)) (v (o * t + i)))))

def onlineFoldW (w : Nat → Ext R → R) (v : Nat → R) (t : Nat) (mnext : Nat → Ext R → Ext R)
    (m0 : Ext R) : Nat → OState R
  | 0 => OState.mk m0 KAlg.zero KAlg.zero
  | T + 1 => onlineStepW w v t mnext T (onlineFoldW w v t mnext m0 T)

/-- masked: weight (if g j then exp (s j - m') else 0) -/
def onlineFoldG (g : Nat → Bool) (s v : Nat → R) (t : Nat) (mnext : Nat → Ext R → Ext R)
    (m0 : Ext R) (T : Nat) : OState R :=
  onlineFoldW (fun j m => if g j = true then expd (Ext.fin (s j)) m else KAlg.zero) v t mnext m0 T

/-- unmasked -/
def onlineFold (s v : Nat → R) (t : Nat) (mnext : Nat → Ext R → Ext R) (m0 : Ext R) (T : Nat) :
    OState R :=
  onlineFoldG (fun _ => true) s v t mnext m0 T

/-- the running max is defined: -inf only after fully masked tiles, never back to -inf -/
def online_max_ok (g : Nat → Bool) (t : Nat) (mnext : Nat → Ext R → Ext R) (T : Nat) : Prop :=
  ∀ o m, o < T → mnext o m = Ext.ninf → m = Ext.ninf ∧ ∀ i, i < t → g (o * t + i) = false

def eg (g : Nat → Bool) (s : Nat → R) (j : Nat) : R :=
  if g j = true then KAlg.exp (s j) else KAlg.zero

/-- the invariant: scale exp (-x) under running max fin x; all zero while it is -inf -/
def onlineInv (g : Nat → Bool) (s v : Nat → R) (n : Nat) (st : OState R) : Prop :=
  match st.st_m with
  | Ext.ninf => st.st_l = KAlg.zero ∧ st.st_acc = KAlg.zero ∧ ∀ j, j < n → g j = false
  | Ext.fin x => st.st_l = KAlg.mul (KAlg.exp (KAlg.neg x)) (sumTo n (eg g s))
      ∧ st.st_acc = KAlg.mul (KAlg.exp (KAlg.neg x)) (sumTo n (fun j => KAlg.mul (eg g s j) (v j)))

theorem rescale_step (m m' S X : R) :
    KAlg.add (KAlg.mul (KAlg.mul (KAlg.exp (KAlg.neg m)) S) (KAlg.exp (sub m m')))
        (KAlg.mul X (KAlg.exp (KAlg.neg m')))
      = KAlg.mul (KAlg.exp (KAlg.neg m')) (KAlg.add S X) := by
  rw [mul_rot (KAlg.exp (KAlg.neg m)) S (KAlg.exp (sub m m')), exp_rescale m m',
    KAlg.mul_comm X (KAlg.exp (KAlg.neg m')), ← KAlg.mul_add (KAlg.exp (KAlg.neg m')) S X]

theorem step_sum (a b : Nat → R) (t T : Nat) (m m' x : R)
    (ha : ∀ j, a j = KAlg.mul (b j) (KAlg.exp (KAlg.neg m')))
    (hx : x = KAlg.mul (KAlg.exp (KAlg.neg m)) (sumTo (T * t) b)) :
    KAlg.add (KAlg.mul x (KAlg.exp (sub m m'))) (sumTo t (fun i => a (T * t + i)))
      = KAlg.mul (KAlg.exp (KAlg.neg m')) (sumTo ((T + 1) * t) b) := by
  have h1 : sumTo t (fun i => a (T * t + i))
      = sumTo t (fun i => KAlg.mul (b (T * t + i)) (KAlg.exp (KAlg.neg m'))) :=
    sumTo_ext t _ _ (fun i _ => ha (T * t + i))
  have h2 : sumTo t (fun i => KAlg.mul (b (T * t + i)) (KAlg.exp (KAlg.neg m')))
      = KAlg.mul (sumTo t (fun i => b (T * t + i))) (KAlg.exp (KAlg.neg m')) :=
    sumTo_mul_r t (fun i => b (T * t + i)) (KAlg.exp (KAlg.neg m'))
  have h3 : sumTo ((T + 1) * t) b = KAlg.add (sumTo (T * t) b) (sumTo t (fun i => b (T * t + i))) := by
    rw [succ_mul' T t]
    exact sumTo_app (T * t) t b
  rw [h1, h2, hx, h3]
  exact rescale_step m m' (sumTo (T * t) b) (sumTo t (fun i => b (T * t + i)))

theorem cond_exp (b : Bool) (x m : R) :
    (if b = true then KAlg.exp (sub x m) else KAlg.zero)
      = KAlg.mul (if b = true then KAlg.exp x else KAlg.zero) (KAlg.exp (KAlg.neg m)) := by
  cases b with
  | false => exact (mul_0_l (KAlg.exp (KAlg.neg m))).symm
  | true => exact exp_sub x m

theorem weight_fin (g : Nat → Bool) (s : Nat → R) (j : Nat) (y : R) :
    (if g j = true then expd (Ext.fin (s j)) (Ext.fin y) else KAlg.zero)
      = KAlg.mul (eg g s j) (KAlg.exp (KAlg.neg y)) := by
  unfold eg
  cases g j with
  | false => exact (mul_0_l (KAlg.exp (KAlg.neg y))).symm
  | true => exact exp_sub (s j) y

theorem sumTo_masked (g : Nat → Bool) (f : Nat → R) (n : Nat) (hg : ∀ j, j < n → g j = false) :
    sumTo n (fun j => if g j = true then f j else KAlg.zero) = KAlg.zero :=
  sumTo_zero_ext n _ (fun j hj => by simp only [hg j hj] <;> rfl)

theorem onlineFoldG_S (g : Nat → Bool) (s v : Nat → R) (t : Nat) (mnext : Nat → Ext R → Ext R)
    (m0 : Ext R) (T : Nat) :
    onlineFoldG g s v t mnext m0 (T + 1)
      = onlineStepW (fun j m => if g j = true then expd (Ext.fin (s j)) m else KAlg.zero) v t mnext T
          (onlineFoldG g s v t mnext m0 T) := rfl

theorem eg_masked_sum (g : Nat → Bool) (s v : Nat → R) (n : Nat) (hg : ∀ j, j < n → g j = false) :
    sumTo n (eg g s) = KAlg.zero ∧ sumTo n (fun j => KAlg.mul (eg g s j) (v j)) = KAlg.zero := by
  constructor
  · exact sumTo_zero_ext n _ (fun j hj => by unfold eg; simp only [hg j hj] <;> rfl)
  · exact sumTo_zero_ext n _ (fun j hj => by unfold eg; simp only [hg j hj] <;> exact mul_0_l (v j))

/-- the tile sums under a finite new max y -/
theorem tile_sums (g : Nat → Bool) (s v : Nat → R) (t T : Nat) (y : R) :
    sumTo t (fun i => (fun j m => if g j = true then expd (Ext.fin (s j)) m else KAlg.zero)
        (T * t + i) (Ext.fin y))
      = KAlg.mul (sumTo t (fun i => eg g s (T * t + i))) (KAlg.exp (KAlg.neg y))
    ∧ sumTo t (fun i => KAlg.mul ((fun j m => if g j = true then expd (Ext.fin (s j)) m else KAlg.zero)
        (T * t + i) (Ext.fin y)) (v (T * t + i)))
      = KAlg.mul (sumTo t (fun i => KAlg.mul (eg g s (T * t + i)) (v (T * t + i))))
          (KAlg.exp (KAlg.neg y)) := by
  constructor
  · rw [← sumTo_mul_r]
    exact sumTo_ext t _ _ (fun i _ => weight_fin g s (T * t + i) y)
  · rw [← sumTo_mul_r]
    exact sumTo_ext t _ _ (fun i _ => by
      show KAlg.mul (if g (T * t + i) = true then expd (Ext.fin (s (T * t + i))) (Ext.fin y)
          else KAlg.zero) (v (T * t + i)) = _
      rw [weight_fin]; exact mul_rot _ _ _)

theorem online_invariant_g (g : Nat → Bool) (s v : Nat → R) (t : Nat)
    (mnext : Nat → Ext R → Ext R) (m0 : Ext R) (T : Nat) (hok : online_max_ok g t mnext T)
    (h0 : onlineInv g s v 0 (OState.mk m0 KAlg.zero KAlg.zero)) :
    ∀ T', T' ≤ T → onlineInv g s v (T' * t) (onlineFoldG g s v t mnext m0 T') := by
  intro T' hT'
  induction T' with
  | zero => rw [Nat.zero_mul]; exact h0
  | succ T' ih =>
    have ih := ih (by omega)
    rw [onlineFoldG_S]
    generalize hst : onlineFoldG g s v t mnext m0 T' = st at ih ⊢
    have hsum := tile_sums g s v t T'
    rw [succ_mul' T' t]
    unfold onlineInv at ih ⊢
    unfold onlineStepW
    cases hm : mnext T' st.st_m with
    | fin y =>
      cases hx : st.st_m with
      | fin x =>
        -- finite -> finite: the usual rescale
        simp only [hx] at ih
        obtain ⟨hl, ha⟩ := ih
        dsimp only
        rw [rescale_fin, hl, ha, (hsum y).1, (hsum y).2, sumTo_app, sumTo_app,
          rescale_step, rescale_step]
        exact ⟨rfl, rfl⟩
      | ninf =>
        -- -inf -> finite: nothing live so far, the first live tile
        simp only [hx] at ih
        obtain ⟨hl, ha, hmask⟩ := ih
        have hz := eg_masked_sum g s v (T' * t) hmask
        dsimp only
        rw [rescale_ninf_l, hl, ha, mul_0_l, add_0_l, add_0_l, (hsum y).1, (hsum y).2,
          sumTo_app, sumTo_app, hz.1, hz.2, add_0_l, add_0_l]
        exact ⟨KAlg.mul_comm _ _, KAlg.mul_comm _ _⟩
    | ninf =>
      -- -> -inf: only from -inf, over a fully masked tile (online_max_ok)
      have hk := hok T' st.st_m (by omega) hm
      simp only [hk.1] at ih
      obtain ⟨hl, ha, hmask⟩ := ih
      dsimp only
      refine ⟨?_, ?_, ?_⟩
      · rw [hl, mul_0_l, add_0_l]
        exact sumTo_zero_ext t _ (fun i hi => by simp only [hk.2 i hi] <;> rfl)
      · rw [ha, mul_0_l, add_0_l]
        exact sumTo_zero_ext t _ (fun i hi => by simp only [hk.2 i hi] <;> exact mul_0_l _)
      · intro j hj
        by_cases hlt : j < T' * t
        · exact hmask j hlt
        · have e : j = T' * t + (j - T' * t) := by omega
          rw [e]
          exact hk.2 (j - T' * t) (by omega)

theorem onlineInv_init (g : Nat → Bool) (s v : Nat → R) (m0 : Ext R) :
    onlineInv g s v 0 (OState.mk m0 KAlg.zero KAlg.zero) := by
  cases m0 with
  | fin x =>
    show KAlg.zero = KAlg.mul (KAlg.exp (KAlg.neg x)) (sumTo 0 (eg g s))
      ∧ KAlg.zero = KAlg.mul (KAlg.exp (KAlg.neg x)) (sumTo 0 (fun j => KAlg.mul (eg g s j) (v j)))
    rw [sumTo_O, sumTo_O, mul_0_r]; exact ⟨rfl, rfl⟩
  | ninf => exact ⟨rfl, rfl, fun j hj => absurd hj (Nat.not_lt_zero j)⟩

theorem online_invariant (g : Nat → Bool) (s v : Nat → R) (t : Nat)
    (mnext : Nat → Ext R → Ext R) (m0 : Ext R) (T : Nat) (hok : online_max_ok g t mnext T) :
    onlineInv g s v (T * t) (onlineFoldG g s v t mnext m0 T) :=
  online_invariant_g g s v t mnext m0 T hok (onlineInv_init g s v m0) T (Nat.le_refl T)

theorem div_zero_zero : div (KAlg.zero : R) KAlg.zero = KAlg.zero := mul_0_l _

/-- ONLINE-AGG, masked: acc / l is the shifted quotient for any valid shift M (-inf only when
    every key is masked), and a row with every key masked gives 0. -/
theorem online_agg_guard (g : Nat → Bool) (s v : Nat → R) (t : Nat)
    (mnext : Nat → Ext R → Ext R) (m0 M : Ext R) (T : Nat) (hok : online_max_ok g t mnext T)
    (hM : ∀ j, j < T * t → M = Ext.ninf → g j = false) :
    div (onlineFoldG g s v t mnext m0 T).st_acc (onlineFoldG g s v t mnext m0 T).st_l
      = div (sumTo (T * t) (fun j =>
              KAlg.mul (if g j = true then expd (Ext.fin (s j)) M else KAlg.zero) (v j)))
            (sumTo (T * t) (fun j => if g j = true then expd (Ext.fin (s j)) M else KAlg.zero))
    ∧ ((∀ j, j < T * t → g j = false) →
      div (onlineFoldG g s v t mnext m0 T).st_acc (onlineFoldG g s v t mnext m0 T).st_l
        = KAlg.zero) := by
  have hinv := online_invariant g s v t mnext m0 T hok
  unfold onlineInv at hinv
  generalize hF : onlineFoldG g s v t mnext m0 T = F at hinv ⊢
  have hmasked : (∀ j, j < T * t → g j = false) → div F.st_acc F.st_l = KAlg.zero := by
    intro hg
    have hz := eg_masked_sum g s v (T * t) hg
    cases hm : F.st_m with
    | fin x =>
      simp only [hm] at hinv
      rw [hinv.1, hinv.2, hz.1, hz.2, mul_0_r]
      exact div_zero_zero
    | ninf =>
      simp only [hm] at hinv
      rw [hinv.1, hinv.2.1]
      exact div_zero_zero
  refine ⟨?_, hmasked⟩
  cases M with
  | fin mu =>
    have h1 : sumTo (T * t) (fun j =>
          KAlg.mul (if g j = true then expd (Ext.fin (s j)) (Ext.fin mu) else KAlg.zero) (v j))
        = sumTo (T * t) (fun j => KAlg.mul (KAlg.mul (eg g s j) (KAlg.exp (KAlg.neg mu))) (v j)) :=
      sumTo_ext _ _ _ (fun j _ => by rw [weight_fin])
    have h2 : sumTo (T * t) (fun j => if g j = true then expd (Ext.fin (s j)) (Ext.fin mu) else KAlg.zero)
        = sumTo (T * t) (fun j => KAlg.mul (eg g s j) (KAlg.exp (KAlg.neg mu))) :=
      sumTo_ext _ _ _ (fun j _ => weight_fin g s j mu)
    rw [h1, h2, ratio_scale (T * t) (eg g s) v (KAlg.exp (KAlg.neg mu)) (exp_ne_zero _)]
    cases hm : F.st_m with
    | fin x =>
      simp only [hm] at hinv
      rw [hinv.1, hinv.2]
      exact div_cancel_l _ _ _ (exp_ne_zero _)
    | ninf =>
      simp only [hm] at hinv
      obtain ⟨hl, ha, hmask⟩ := hinv
      have hz := eg_masked_sum g s v (T * t) hmask
      rw [hl, ha, hz.1, hz.2]
  | ninf =>
    have hg : ∀ j, j < T * t → g j = false := fun j hj => hM j hj rfl
    rw [hmasked hg]
    have e1 : sumTo (T * t) (fun j =>
          KAlg.mul (if g j = true then expd (Ext.fin (s j)) Ext.ninf else KAlg.zero) (v j)) = KAlg.zero :=
      sumTo_zero_ext _ _ (fun j hj => by simp only [hg j hj] <;> exact mul_0_l (v j))
    have e2 : sumTo (T * t) (fun j => if g j = true then expd (Ext.fin (s j)) Ext.ninf else KAlg.zero)
        = KAlg.zero :=
      sumTo_zero_ext _ _ (fun j hj => by simp only [hg j hj] <;> rfl)
    rw [e1, e2]; exact div_zero_zero.symm

/-- ONLINE-AGG, unmasked: every tile has live keys, so the running max must be finite -/
theorem online_agg (s v : Nat → R) (t : Nat) (mnext : Nat → Ext R → Ext R) (m0 : Ext R) (M : R)
    (T : Nat) (hm : ∀ o m, o < T → mnext o m ≠ Ext.ninf) :
    div (onlineFold s v t mnext m0 T).st_acc (onlineFold s v t mnext m0 T).st_l
      = div (sumTo (T * t) (fun j => KAlg.mul (KAlg.exp (sub (s j) M)) (v j)))
            (sumTo (T * t) (fun j => KAlg.exp (sub (s j) M))) :=
  (online_agg_guard (fun _ => true) s v t mnext m0 (Ext.fin M) T
    (fun o m ho e => absurd e (hm o m ho)) (fun _ _ e => by cases e)).1

/-- ONLINE-AGG without the V product (row softmax in one streaming pass): the (m, l) half of
    onlineStepW as a step on pairs -/
def onlineStep2 (g : Nat → Bool) (s : Nat → R) (t : Nat) (mnext : Nat → Ext R → Ext R)
    (o : Nat) (st : Ext R × R) : Ext R × R :=
  (mnext o st.1,
   KAlg.add (KAlg.mul st.2 (rescale st.1 (mnext o st.1)))
     (sumTo t (fun i => if g (o * t + i) = true then expd (Ext.fin (s (o * t + i))) (mnext o st.1)
                        else KAlg.zero)))

def onlineFold2 (g : Nat → Bool) (s : Nat → R) (t : Nat) (mnext : Nat → Ext R → Ext R)
    (m0 : Ext R) : Nat → Ext R × R
  | 0 => (m0, KAlg.zero)
  | T + 1 => onlineStep2 g s t mnext T (onlineFold2 g s t mnext m0 T)

theorem onlineFoldG_pair (g : Nat → Bool) (s v : Nat → R) (t : Nat)
    (mnext : Nat → Ext R → Ext R) (m0 : Ext R) (T : Nat) :
    onlineFold2 g s t mnext m0 T
      = ((onlineFoldG g s v t mnext m0 T).st_m, (onlineFoldG g s v t mnext m0 T).st_l) := by
  induction T with
  | zero => rfl
  | succ T ih => simp only [onlineFold2, ih, onlineFoldG_S]; rfl

/-- one element of the softmax, any numerator score a: exp (a - m) / l of the fold equals
    exp (a - M) / Σ exp (s - M) for any defined shift M, given one live key -/
theorem online_softmax (g : Nat → Bool) (s : Nat → R) (t : Nat) (mnext : Nat → Ext R → Ext R)
    (m0 M : Ext R) (T j0 : Nat) (a : R) (hok : online_max_ok g t mnext T)
    (hM : ∀ j, j < T * t → M = Ext.ninf → g j = false) (hj0 : j0 < T * t) (hg0 : g j0 = true) :
    div (expd (Ext.fin a) (onlineFold2 g s t mnext m0 T).1) (onlineFold2 g s t mnext m0 T).2
      = div (expd (Ext.fin a) M)
            (sumTo (T * t) (fun j => if g j = true then expd (Ext.fin (s j)) M else KAlg.zero)) := by
  rw [onlineFoldG_pair g s (fun _ => KAlg.zero) t mnext m0 T]
  have hinv := online_invariant g s (fun _ => KAlg.zero) t mnext m0 T hok
  unfold onlineInv at hinv
  generalize hF : onlineFoldG g s (fun _ => KAlg.zero) t mnext m0 T = F at hinv ⊢
  cases M with
  | ninf => exact absurd (hM j0 hj0 rfl) (by rw [hg0]; decide)
  | fin mu =>
    have h2 : sumTo (T * t) (fun j => if g j = true then expd (Ext.fin (s j)) (Ext.fin mu) else KAlg.zero)
        = sumTo (T * t) (fun j => KAlg.mul (eg g s j) (KAlg.exp (KAlg.neg mu))) :=
      sumTo_ext _ _ _ (fun j _ => weight_fin g s j mu)
    rw [h2, sumTo_mul_r]
    cases hm : F.st_m with
    | fin x =>
      simp only [hm] at hinv
      simp only [expd]
      rw [hinv.1, exp_sub, exp_sub, KAlg.mul_comm (sumTo (T * t) (eg g s)) (KAlg.exp (KAlg.neg mu)),
        KAlg.mul_comm (KAlg.exp a) (KAlg.exp (KAlg.neg x)), KAlg.mul_comm (KAlg.exp a) (KAlg.exp (KAlg.neg mu)),
        div_cancel_l _ _ _ (exp_ne_zero _), div_cancel_l _ _ _ (exp_ne_zero _)]
    | ninf =>
      simp only [hm] at hinv
      exact absurd (hinv.2.2 j0 hj0) (by rw [hg0]; decide)

end Derivc
