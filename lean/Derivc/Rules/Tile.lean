/- Rule TILE: strip-mine a range into (outer, inner); guarded tails for dynamic
   extents; index arithmetic facts for tiled generators. Mirrors Rules/Tile.v. -/
import Derivc.Sum

namespace Derivc
variable {R : Type} [KAlg R]

theorem sumTo_tile (n t : Nat) (f : Nat → R) :
    sumTo (n * t) f = sumTo n (fun o => sumTo t (fun i => f (o * t + i))) := by
  induction n with
  | zero => rw [Nat.zero_mul, sumTo_O f, sumTo_O (fun o => sumTo t (fun i => f (o * t + i)))]
  | succ n ih =>
    rw [succ_mul' n t, sumTo_app (n * t) t f, ih,
      sumTo_S n (fun o => sumTo t (fun i => f (o * t + i)))]

theorem maxTo_tile (n t : Nat) (f : Nat → Ext R) :
    maxTo (n * t) f = maxTo n (fun o => maxTo t (fun i => f (o * t + i))) := by
  induction n with
  | zero => rw [Nat.zero_mul, maxTo_O f, maxTo_O (fun o => maxTo t (fun i => f (o * t + i)))]
  | succ n ih =>
    rw [succ_mul' n t, maxTo_app (n * t) t f, ih,
      maxTo_S n (fun o => maxTo t (fun i => f (o * t + i)))]

theorem sumTo_tile_guard (N n t : Nat) (f : Nat → R) (hN : N ≤ n * t) :
    sumTo N f
      = sumTo n (fun o => sumTo t (fun i =>
          if o * t + i < N then f (o * t + i) else KAlg.zero)) := by
  have h1 : sumTo (n * t) (fun p => if p < N then f p else KAlg.zero)
      = sumTo N (fun p => if p < N then f p else KAlg.zero) :=
    sumTo_trunc (n * t) N (fun p => if p < N then f p else KAlg.zero)
      (fun j hj _ => if_neg (by omega)) hN
  have h2 : sumTo N (fun p => if p < N then f p else KAlg.zero) = sumTo N f :=
    sumTo_ext N (fun p => if p < N then f p else KAlg.zero) f (fun i hi => if_pos hi)
  have h3 := sumTo_tile n t (fun p => if p < N then f p else KAlg.zero)
  exact (h2.symm.trans h1.symm).trans h3

theorem maxTo_tile_guard (N n t : Nat) (f : Nat → Ext R) (hN : N ≤ n * t) :
    maxTo N f
      = maxTo n (fun o => maxTo t (fun i =>
          if o * t + i < N then f (o * t + i) else Ext.ninf)) := by
  have h1 : maxTo (n * t) (fun p => if p < N then f p else Ext.ninf)
      = maxTo N (fun p => if p < N then f p else Ext.ninf) :=
    maxTo_trunc (n * t) N (fun p => if p < N then f p else Ext.ninf)
      (fun j hj _ => if_neg (by omega)) hN
  have h2 : maxTo N (fun p => if p < N then f p else Ext.ninf) = maxTo N f :=
    maxTo_ext N (fun p => if p < N then f p else Ext.ninf) f (fun i hi => if_pos hi)
  have h3 := maxTo_tile n t (fun p => if p < N then f p else Ext.ninf)
  exact (h2.symm.trans h1.symm).trans h3

/-- the usual instance: ceilDiv N t outer iterations -/
theorem sumTo_tile_ceil (N t : Nat) (f : Nat → R) (ht : 0 < t) :
    sumTo N f
      = sumTo (ceilDiv N t) (fun o => sumTo t (fun i =>
          if o * t + i < N then f (o * t + i) else KAlg.zero)) :=
  sumTo_tile_guard N (ceilDiv N t) t f (ceilDiv_ge N t ht)

theorem maxTo_tile_ceil (N t : Nat) (f : Nat → Ext R) (ht : 0 < t) :
    maxTo N f
      = maxTo (ceilDiv N t) (fun o => maxTo t (fun i =>
          if o * t + i < N then f (o * t + i) else Ext.ninf)) :=
  maxTo_tile_guard N (ceilDiv N t) t f (ceilDiv_ge N t ht)

/-- a tiled generator writes position p as (p / t, p % t) -/
theorem gen_tile {A : Type} (f : Nat → A) (t p : Nat) (_ht : 0 < t) :
    f (p / t * t + p % t) = f p := by
  have h1 := Nat.mod_add_div p t
  have h2 : p / t * t = t * (p / t) := Nat.mul_comm _ _
  have e : p / t * t + p % t = p := by omega
  rw [e]

theorem tile_cover (p N t : Nat) (hp : p < N) (ht : 0 < t) :
    p / t < ceilDiv N t ∧ p % t < t := by
  have h1 := Nat.mod_add_div p t
  have h2 := Nat.mod_add_div (N + t - 1) t
  have h3 := Nat.mod_lt (N + t - 1) ht
  have h4 := Nat.mod_lt p ht
  refine ⟨?_, h4⟩
  show p / t < (N + t - 1) / t
  by_cases hc : (N + t - 1) / t ≤ p / t
  · have h5 := mul_le_mul_l' t ((N + t - 1) / t) (p / t) hc
    omega
  · omega

theorem tile_inj (o i o' i' t : Nat) (h : o * t + i = o' * t + i') (hi : i < t) (hi' : i' < t) :
    o = o' ∧ i = i' := by
  have ho : o = o' := by
    by_cases h1 : o < o'
    · have h2 := mul_le_mul_r' (o + 1) o' t (by omega)
      rw [succ_mul' o t] at h2
      omega
    · by_cases h3 : o' < o
      · have h4 := mul_le_mul_r' (o' + 1) o t (by omega)
        rw [succ_mul' o' t] at h4
        omega
      · omega
  subst ho
  exact ⟨rfl, by omega⟩

end Derivc
