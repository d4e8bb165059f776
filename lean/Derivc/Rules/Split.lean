/- Rule SPLIT: split a reduction range [0, a+b) at a. Mirrors Rules/Split.v. -/
import Derivc.Sum

namespace Derivc
variable {R : Type} [KAlg R]

theorem sumTo_split (a b : Nat) (f : Nat → R) :
    sumTo (a + b) f = KAlg.add (sumTo a f) (sumTo b (fun j => f (a + j))) :=
  sumTo_app a b f

end Derivc
