/- Rule ASSOC: reassociate / factor reductions. Mirrors Rules/Assoc.v. -/
import Derivc.Sum

namespace Derivc
variable {R : Type} [KAlg R]

theorem sumTo_factor (n : Nat) (f : Nat → R) (c : R) :
    sumTo n (fun j => KAlg.mul (f j) c) = KAlg.mul (sumTo n f) c :=
  sumTo_mul_r n f c

theorem sumTo_add (n : Nat) (f g : Nat → R) :
    sumTo n (fun j => KAlg.add (f j) (g j)) = KAlg.add (sumTo n f) (sumTo n g) :=
  sumTo_plus n f g

end Derivc
