/- Rule RECOMPUTE (the backward pass's softmax from the saved row statistic LSE).
   Mirrors Rules/Recompute.v: the masked softmax equals exp (s_j - LSE) at unmasked j,
   LSE = M + log L, L = Σ_{k | mask} exp (s_k - M), for any defined shift M (the masked max is
   one: softmax_recompute_max); both sides are 0 at masked j (fully masked rows included).
   Assumes KAlgLog.  NOT checked in this environment (no Lean toolchain). -/
import Derivc.Tactics

namespace Derivc

section Recompute
variable {R : Type} [KAlg R]

/-- the IR's a + b with a possibly -inf and b finite (LSE = M + log L): -inf + b = -inf -/
def eadd : Ext R → R → Ext R
  | Ext.fin x, b => Ext.fin (KAlg.add x b)
  | Ext.ninf, _ => Ext.ninf

theorem sumTo_nonneg : ∀ (n : Nat) (f : Nat → R),
    (∀ k, k < n → KAlg.le KAlg.zero (f k)) → KAlg.le KAlg.zero (sumTo n f) := by
  intro n
  induction n with
  | zero => intro f _; exact le_refl KAlg.zero
  | succ n ih =>
    intro f hf
    rw [sumTo_S]
    exact add_nonneg _ _ (ih f (fun k hk => hf k (by omega))) (hf n (by omega))

/-- a sum of nonnegative terms with one positive term is positive -/
theorem sumTo_pos : ∀ (n : Nat) (f : Nat → R) (j : Nat),
    (∀ k, k < n → KAlg.le KAlg.zero (f k)) → j < n → rlt KAlg.zero (f j) →
    rlt KAlg.zero (sumTo n f) := by
  intro n
  induction n with
  | zero => intro f j _ hj _; exact absurd hj (Nat.not_lt_zero j)
  | succ n ih =>
    intro f j hf hj hp
    rw [sumTo_S]
    by_cases e : j = n
    · rw [e] at hp
      exact add_nonneg_pos _ _ (sumTo_nonneg n f (fun k hk => hf k (by omega))) hp
    · exact add_pos_nonneg _ _ (ih f j (fun k hk => hf k (by omega)) (by omega) hp)
        (hf n (by omega))

/-- the masked row sum is positive when the row has a live key -/
theorem masked_exp_sum_pos (g : Nat → Bool) (n : Nat) (s : Nat → R) (m : R) (j : Nat)
    (hj : j < n) (hg : g j = true) :
    rlt KAlg.zero (sumTo n (fun k => if g k = true then KAlg.exp (sub (s k) m) else KAlg.zero)) := by
  refine sumTo_pos n _ j ?_ hj ?_
  · intro k _
    show KAlg.le KAlg.zero (if g k = true then KAlg.exp (sub (s k) m) else KAlg.zero)
    by_cases hk : g k = true
    · rw [if_pos hk]; exact KAlg.exp_nonneg _
    · rw [if_neg hk]; exact le_refl _
  · show rlt KAlg.zero (if g j = true then KAlg.exp (sub (s j) m) else KAlg.zero)
    rw [if_pos hg]
    exact exp_pos _

/-- the masked max is -inf only on fully masked rows: it is a valid shift -/
theorem masked_max_valid (g : Nat → Bool) (n : Nat) (s : Nat → R) (k : Nat) (hk : k < n)
    (e : maxTo n (fun k' => if g k' = true then Ext.fin (s k') else Ext.ninf) = Ext.ninf) :
    g k = false := by
  cases hb : g k with
  | false => rfl
  | true =>
    have f' : (if g k = true then Ext.fin (s k) else Ext.ninf) = (Ext.ninf : Ext R) :=
      maxTo_NInf_inv n _ e k hk
    rw [if_pos hb] at f'
    cases f'

variable [KAlgLog R]

/-- RECOMPUTE, any defined shift M -/
theorem softmax_recompute (g : Nat → Bool) (n : Nat) (s : Nat → R) (M : Ext R) (j : Nat)
    (hj : j < n) (hM : ∀ k, k < n → M = Ext.ninf → g k = false) :
    softmaxAtG g n s j
      = if g j = true
        then expd (Ext.fin (s j)) (eadd M (KAlgLog.log
               (sumTo n (fun k => if g k = true then expd (Ext.fin (s k)) M else KAlg.zero))))
        else KAlg.zero := by
  rw [softmaxAtG_shift g n s j M hj hM]
  by_cases hg : g j = true
  · rw [if_pos hg, if_pos hg]
    cases M with
    | ninf =>
      have hf := hM j hj rfl
      rw [hf] at hg
      cases hg
    | fin m =>
      show div (KAlg.exp (sub (s j) m))
          (sumTo n (fun k => if g k = true then KAlg.exp (sub (s k) m) else KAlg.zero))
        = KAlg.exp (sub (s j) (KAlg.add m (KAlgLog.log
            (sumTo n (fun k => if g k = true then KAlg.exp (sub (s k) m) else KAlg.zero)))))
      rw [sub_add_r, exp_sub_log _ _ (masked_exp_sum_pos g n s m j hj hg)]
  · rw [if_neg hg, if_neg hg]

/-- RECOMPUTE with the masked row max as the shift (the FlashAttention-2 LSE) -/
theorem softmax_recompute_max (g : Nat → Bool) (n : Nat) (s : Nat → R) (j : Nat) (hj : j < n) :
    softmaxAtG g n s j
      = if g j = true
        then expd (Ext.fin (s j))
          (eadd (maxTo n (fun k => if g k = true then Ext.fin (s k) else Ext.ninf))
            (KAlgLog.log (sumTo n (fun k => if g k = true
              then expd (Ext.fin (s k))
                (maxTo n (fun k' => if g k' = true then Ext.fin (s k') else Ext.ninf))
              else KAlg.zero))))
        else KAlg.zero :=
  softmax_recompute g n s _ j hj (fun k hk e => masked_max_valid g n s k hk e)

end Recompute

end Derivc
