/- Rule MAP-MMA: a k-extent that is a multiple of 16 maps onto mma.m16n8k16
   fragments; the hardware adds the 16 products of one fragment in the fixed
   grouping `mma16` (two k8 halves, each four pairs). Mirrors Rules/MapMma.v. -/
import Derivc.Rules.Tile

namespace Derivc
variable {R : Type} [KAlg R]

def mma16 (g : Nat → R) : R :=
  KAlg.add
    (KAlg.add (KAlg.add (KAlg.add (g 0) (g 1)) (KAlg.add (g 2) (g 3)))
              (KAlg.add (KAlg.add (g 4) (g 5)) (KAlg.add (g 6) (g 7))))
    (KAlg.add (KAlg.add (KAlg.add (g 8) (g 9)) (KAlg.add (g 10) (g 11)))
              (KAlg.add (KAlg.add (g 12) (g 13)) (KAlg.add (g 14) (g 15))))

def quad (g : Nat → R) : R := KAlg.add (KAlg.add (g 0) (g 1)) (KAlg.add (g 2) (g 3))

def oct (g : Nat → R) : R := KAlg.add (quad g) (quad (fun k => g (4 + k)))

theorem sum2 (g : Nat → R) : sumTo 2 g = KAlg.add (g 0) (g 1) := by
  show KAlg.add (KAlg.add KAlg.zero (g 0)) (g 1) = KAlg.add (g 0) (g 1)
  rw [add_0_l (g 0)]

theorem sum4 (g : Nat → R) : sumTo 4 g = quad g := by
  show sumTo (2 + 2) g = quad g
  rw [sumTo_app 2 2 g, sum2 g, sum2 (fun j => g (2 + j))] <;> rfl

theorem sum8 (g : Nat → R) : sumTo 8 g = oct g := by
  show sumTo (4 + 4) g = oct g
  rw [sumTo_app 4 4 g, sum4 g, sum4 (fun j => g (4 + j))] <;> rfl

theorem sum16 (g : Nat → R) : sumTo 16 g = mma16 g := by
  show sumTo (8 + 8) g = mma16 g
  rw [sumTo_app 8 8 g, sum8 g, sum8 (fun j => g (8 + j))] <;> rfl

theorem mma_tile (n : Nat) (f : Nat → R) :
    sumTo (n * 16) f = sumTo n (fun o => mma16 (fun k => f (o * 16 + k))) :=
  (sumTo_tile n 16 f).trans
    (sumTo_ext n _ _ (fun o _ => sum16 (fun k => f (o * 16 + k))))

end Derivc
