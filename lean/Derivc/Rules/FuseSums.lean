/- Rule FUSE-SUMS: two sums over the same index become one fold carrying both accumulators
   (one kernel writing two outputs: the attention backward's dV and dK).  The fold of two
   independent accumulators from (0, 0) ends at the pair of the sums.
   Sums nested in a shared outer sum (the rule's `inner`: GQA's dV / dK under the sum over g) are
   the same theorem, f and g the inner sums as functions of the outer index.
   Mirrors Rules/FuseSums.v.  NOT checked here (no Lean toolchain). -/
import Derivc.Tactics

namespace Derivc

variable {R : Type} [KAlg R]

theorem fold_pair_sum (f g : Nat → R) (n : Nat) :
    foldN (fun k s => (KAlg.add s.1 (f k), KAlg.add s.2 (g k))) (KAlg.zero, KAlg.zero) n
      = (sumTo n f, sumTo n g) := by
  induction n with
  | zero => rfl
  | succ n ih => rw [foldN_succ, ih]; rfl

theorem fold_pair_sum_fst (step : Nat → R × R → R × R) (f g : Nat → R) (n : Nat)
    (hs : ∀ k s, step k s = (KAlg.add s.1 (f k), KAlg.add s.2 (g k))) :
    (foldN step (KAlg.zero, KAlg.zero) n).1 = sumTo n f := by
  rw [foldN_ext step (fun k s => (KAlg.add s.1 (f k), KAlg.add s.2 (g k))) (KAlg.zero, KAlg.zero)
        (KAlg.zero, KAlg.zero) n n rfl rfl (fun k s _ => hs k s), fold_pair_sum]

theorem fold_pair_sum_snd (step : Nat → R × R → R × R) (f g : Nat → R) (n : Nat)
    (hs : ∀ k s, step k s = (KAlg.add s.1 (f k), KAlg.add s.2 (g k))) :
    (foldN step (KAlg.zero, KAlg.zero) n).2 = sumTo n g := by
  rw [foldN_ext step (fun k s => (KAlg.add s.1 (f k), KAlg.add s.2 (g k))) (KAlg.zero, KAlg.zero)
        (KAlg.zero, KAlg.zero) n n rfl rfl (fun k s _ => hs k s), fold_pair_sum]

end Derivc
