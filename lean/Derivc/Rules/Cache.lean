/- Rule CACHE: a staged tile copy (shared memory / registers) reads back the
   source. Mirrors Rules/Cache.v. -/
import Derivc.Sum

namespace Derivc
variable {R : Type} [KAlg R]

def tileCopy (A : Nat → R) (base t : Nat) : Nat → R :=
  fun i => if i < t then A (base + i) else KAlg.zero

def tileCopy2 (A : Nat → Nat → R) (r0 c0 th tw : Nat) : Nat → Nat → R :=
  fun i j => if i < th then (if j < tw then A (r0 + i) (c0 + j) else KAlg.zero) else KAlg.zero

theorem cache_read (A : Nat → R) (base t i : Nat) (h : i < t) :
    tileCopy A base t i = A (base + i) := by
  show (if i < t then A (base + i) else KAlg.zero) = A (base + i)
  exact if_pos h

theorem cache_read2 (A : Nat → Nat → R) (r0 c0 th tw i j : Nat) (hi : i < th) (hj : j < tw) :
    tileCopy2 A r0 c0 th tw i j = A (r0 + i) (c0 + j) := by
  show (if i < th then (if j < tw then A (r0 + i) (c0 + j) else KAlg.zero) else KAlg.zero)
    = A (r0 + i) (c0 + j)
  rw [if_pos hi, if_pos hj]

end Derivc
