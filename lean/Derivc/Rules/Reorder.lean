/- Rule REORDER: finite Fubini. Mirrors Rules/Reorder.v. -/
import Derivc.Sum

namespace Derivc
variable {R : Type} [KAlg R]

theorem sumTo_swap (n m : Nat) (f : Nat → Nat → R) :
    sumTo n (fun i => sumTo m (fun j => f i j)) = sumTo m (fun j => sumTo n (fun i => f i j)) := by
  induction n with
  | zero => exact (sumTo_const_zero m).symm
  | succ n ih =>
    rw [sumTo_S n (fun i => sumTo m (fun j => f i j)), ih]
    exact (sumTo_plus m (fun j => sumTo n (fun i => f i j)) (fun j => f n j)).symm

end Derivc
