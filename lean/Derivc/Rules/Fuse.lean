/- Rule FUSE: reading a producer's buffer inside its bounds is the producer's
   expression. Mirrors Rules/Fuse.v. -/
import Derivc.Sum

namespace Derivc
variable {R : Type} [KAlg R]

theorem gen_inline (n : Nat) (f : Nat → R) (i : Nat) (h : i < n) : genAt n f i = f i := by
  show (if i < n then f i else KAlg.zero) = f i
  exact if_pos h

theorem gen_outside (n : Nat) (f : Nat → R) (i : Nat) (h : n ≤ i) :
    genAt n f i = KAlg.zero := by
  show (if i < n then f i else KAlg.zero) = KAlg.zero
  exact if_neg (by omega)

theorem genX_inline (n : Nat) (f : Nat → Ext R) (i : Nat) (h : i < n) : genAtX n f i = f i := by
  show (if i < n then f i else Ext.ninf) = f i
  exact if_pos h

end Derivc
