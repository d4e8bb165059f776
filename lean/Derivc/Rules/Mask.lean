/- Masking: a reduction whose terms vanish on [k, n) stops at k (skipping
   fully-masked tiles, e.g. causal tiles above the diagonal). Mirrors Rules/Mask.v. -/
import Derivc.Sum

namespace Derivc
variable {R : Type} [KAlg R]

theorem sumTo_guard_trunc (n k : Nat) (f : Nat → R)
    (hz : ∀ j, k ≤ j → j < n → f j = KAlg.zero) (hk : k ≤ n) :
    sumTo n f = sumTo k f :=
  sumTo_trunc n k f hz hk

end Derivc
