/- Masking: a reduction whose terms vanish on [k, n) stops at k (skipping
   fully-masked tiles, e.g. causal tiles above the diagonal). Mirrors Rules/Mask.v. -/
import Derivc.Sum

namespace Derivc
variable {R : Type} [KAlg R]

theorem sumTo_guard_trunc (n k : Nat) (f : Nat → R)
    (hz : ∀ j, k ≤ j → j < n → f j = KAlg.zero) (hk : k ≤ n) :
    sumTo n f = sumTo k f :=
  sumTo_trunc n k f hz hk

/- Masking from below: a reduction whose terms vanish on [0, k) starts at k (the fully-masked
   key tiles below a sliding window).  Mirrors Rules/Mask.v; no per-step obligation uses it yet
   (the kernel IR has no loop start).  Not checked here: no Lean toolchain. -/
theorem sumTo_guard_skip_low (n k : Nat) (f : Nat → R)
    (hz : ∀ j, j < k → f j = KAlg.zero) (hk : k ≤ n) :
    sumTo n f = sumTo (n - k) (fun j => f (k + j)) := by
  have e : n = k + (n - k) := by omega
  calc sumTo n f = sumTo (k + (n - k)) f := by rw [← e]
    _ = KAlg.add (sumTo k f) (sumTo (n - k) (fun j => f (k + j))) := sumTo_app k (n - k) f
    _ = sumTo (n - k) (fun j => f (k + j)) := by rw [sumTo_zero_ext k f hz, add_0_l]

end Derivc
