/- Rule SPLIT-K (split-K GEMM): a sum's tile loop divided among S splits, each adding its own
   tiles into a partial sum; the combine adds the S partial sums in split order.
   Mirrors Rules/SplitK.v (same theorem names).  Not compiled in this repository's CI (no Lean
   toolchain here): the Coq file is the checked one. -/
import Derivc.Sum
import Derivc.Rules.Split
import Derivc.Rules.Tile
import Derivc.Rules.Reorder

namespace Derivc

/-- o < ceilDiv x d exactly when the o-th block of d starts below x. -/
theorem ceilDiv_lt_iff (o x d : Nat) (hd : 0 < d) : o < ceilDiv x d ↔ o * d < x := by
  unfold ceilDiv
  constructor
  · intro ho
    have h : o + 1 ≤ (x + d - 1) / d := ho
    have h2 := (Nat.le_div_iff_mul_le hd).mp h
    rw [Nat.add_mul, Nat.one_mul] at h2
    omega
  · intro hx
    have h : (o + 1) * d ≤ x + d - 1 := by rw [Nat.add_mul, Nat.one_mul]; omega
    exact (Nat.le_div_iff_mul_le hd).mpr h

theorem nat_eq_members (a b : Nat) (hab : ∀ o, o < a ↔ o < b) : a = b := by
  rcases Nat.lt_trichotomy a b with h | h | h
  · exact absurd ((hab a).mpr h) (Nat.lt_irrefl a)
  · exact h
  · exact absurd ((hab b).mp h) (Nat.lt_irrefl b)

theorem ceilDiv_ceilDiv_sub (N t S s : Nat) (ht : 0 < t) (hS : 0 < S) :
    ceilDiv (ceilDiv N t - s) S = ceilDiv (N - t * s) (t * S) := by
  apply nat_eq_members
  intro o
  rw [ceilDiv_lt_iff o _ S hS, ceilDiv_lt_iff o _ (t * S) (Nat.mul_pos ht hS)]
  have e1 : o * S < ceilDiv N t - s ↔ o * S + s < ceilDiv N t := by omega
  rw [e1, ceilDiv_lt_iff (o * S + s) N t ht]
  have e2 : (o * S + s) * t = o * (t * S) + t * s := by
    rw [Nat.add_mul, Nat.mul_comm s t, Nat.mul_assoc, Nat.mul_comm S t]
  rw [e2]
  omega

variable {R : Type} [KAlg R]

/-- S consecutive chunks [b s, b (s + 1)) of any sizes, empty ones included. -/
theorem sumTo_chunks (S : Nat) (b : Nat → Nat) (f : Nat → R) (h0 : b 0 = 0)
    (hmono : ∀ s, s < S → b s ≤ b (s + 1)) :
    sumTo (b S) f = sumTo S (fun s => sumTo (b (s + 1) - b s) (fun i => f (b s + i))) := by
  induction S with
  | zero => rw [h0]; rfl
  | succ S ih =>
    have hle := hmono S (Nat.lt_succ_self S)
    rw [sumTo_S S, ← ih (fun s hs => hmono s (Nat.lt_succ_of_lt hs))]
    have e : b (S + 1) = b S + (b (S + 1) - b S) := by omega
    rw [e]
    have e2 : b S + (b (S + 1) - b S) - b S = b (S + 1) - b S := by omega
    rw [e2]
    exact sumTo_split (b S) (b (S + 1) - b S) f

/-- split s adds the indices S * o + s below n. -/
theorem sumTo_strided (S n : Nat) (f : Nat → R) (hS : 0 < S) :
    sumTo n f = sumTo S (fun s => sumTo (ceilDiv (n - s) S) (fun o => f (S * o + s))) := by
  let g := fun p => if p < n then f p else KAlg.zero
  have h1 : sumTo n f = sumTo (ceilDiv n S * S) g := by
    rw [sumTo_trunc (ceilDiv n S * S) n g (fun j hj _ => if_neg (by omega)) (ceilDiv_ge n S hS)]
    exact sumTo_ext n f g (fun i hi => (if_pos hi).symm)
  rw [h1, sumTo_tile, sumTo_swap (ceilDiv n S) S (fun o i => g (o * S + i))]
  apply sumTo_ext
  intro s _
  have hle : ceilDiv (n - s) S ≤ ceilDiv n S := by
    unfold ceilDiv; exact Nat.div_le_div_right (by omega)
  rw [sumTo_trunc (ceilDiv n S) (ceilDiv (n - s) S) _ ?z hle]
  · apply sumTo_ext
    intro o ho
    have h := (ceilDiv_lt_iff o (n - s) S hS).mp ho
    have e : o * S + s = S * o + s := by rw [Nat.mul_comm]
    show (if o * S + s < n then f (o * S + s) else KAlg.zero) = f (S * o + s)
    rw [if_pos (by omega), e]
  · intro o ho1 _
    have h : ¬ (o * S < n - s) := fun hc => absurd ((ceilDiv_lt_iff o (n - s) S hS).mpr hc) (by omega)
    show (if o * S + s < n then f (o * S + s) else KAlg.zero) = KAlg.zero
    exact if_neg (by omega)

/-- The rule's instance: ceilDiv N t tiles of t; split s adds the tiles S * o + s,
    o < ceilDiv (N - t * s) T with T = t * S (the obligation states T as one number). -/
theorem sumTo_split_k_strided (N t S T : Nat) (f : Nat → R) (ht : 0 < t) (hS : 0 < S)
    (hT : T = t * S) :
    sumTo (ceilDiv N t) f
      = sumTo S (fun s => sumTo (ceilDiv (N - t * s) T) (fun o => f (S * o + s))) := by
  subst hT
  rw [sumTo_strided S (ceilDiv N t) f hS]
  apply sumTo_ext
  intro s _
  rw [ceilDiv_ceilDiv_sub N t S s ht hS]

end Derivc
