/- Rule SPLIT-SOFTMAX: softmax(s) · v computed with any stabilising shift m.
   Mirrors Rules/SplitSoftmax.v. -/
import Derivc.Sum

namespace Derivc
variable {R : Type} [KAlg R]

def softmaxAt (n : Nat) (s : Nat → R) (j : Nat) : R :=
  div (KAlg.exp (s j)) (sumTo n (fun k => KAlg.exp (s k)))

theorem exp_sub_mul_r (a m b : R) :
    KAlg.mul (KAlg.exp (sub a m)) b = KAlg.mul (KAlg.mul (KAlg.exp a) (KAlg.exp (KAlg.neg m))) b := by
  rw [exp_sub]

/-- Σ (e_j c) v_j / Σ (e_j c) = Σ e_j v_j / Σ e_j  for c ≠ 0 -/
theorem ratio_scale (n : Nat) (e v : Nat → R) (c : R) (hc : c ≠ KAlg.zero) :
    div (sumTo n (fun j => KAlg.mul (KAlg.mul (e j) c) (v j))) (sumTo n (fun j => KAlg.mul (e j) c))
      = div (sumTo n (fun j => KAlg.mul (e j) (v j))) (sumTo n e) := by
  have h1 : sumTo n (fun j => KAlg.mul (KAlg.mul (e j) c) (v j))
      = sumTo n (fun j => KAlg.mul (KAlg.mul (e j) (v j)) c) :=
    sumTo_ext n _ _ (fun j _ => mul_rot (e j) c (v j))
  have h2 : sumTo n (fun j => KAlg.mul (KAlg.mul (e j) (v j)) c)
      = KAlg.mul (sumTo n (fun j => KAlg.mul (e j) (v j))) c :=
    sumTo_mul_r n (fun j => KAlg.mul (e j) (v j)) c
  have h3 : sumTo n (fun j => KAlg.mul (e j) c) = KAlg.mul (sumTo n e) c :=
    sumTo_mul_r n e c
  rw [h1, h2, h3]
  exact div_cancel_r c _ _ hc

/-- the shifted form Σ exp(s_j - m) v_j / Σ exp(s_j - m) does not depend on m -/
theorem shift_ratio (n : Nat) (s v : Nat → R) (m : R) :
    div (sumTo n (fun j => KAlg.mul (KAlg.exp (sub (s j) m)) (v j)))
        (sumTo n (fun j => KAlg.exp (sub (s j) m)))
      = div (sumTo n (fun j => KAlg.mul (KAlg.exp (s j)) (v j)))
            (sumTo n (fun j => KAlg.exp (s j))) := by
  have h1 : sumTo n (fun j => KAlg.mul (KAlg.exp (sub (s j) m)) (v j))
      = sumTo n (fun j => KAlg.mul (KAlg.mul (KAlg.exp (s j)) (KAlg.exp (KAlg.neg m))) (v j)) :=
    sumTo_ext n _ _ (fun j _ => exp_sub_mul_r (s j) m (v j))
  have h2 : sumTo n (fun j => KAlg.exp (sub (s j) m))
      = sumTo n (fun j => KAlg.mul (KAlg.exp (s j)) (KAlg.exp (KAlg.neg m))) :=
    sumTo_ext n _ _ (fun j _ => exp_sub (s j) m)
  rw [h1, h2]
  exact ratio_scale n (fun j => KAlg.exp (s j)) v (KAlg.exp (KAlg.neg m)) (exp_ne_zero _)

theorem softmax_split (n : Nat) (s v : Nat → R) (m : R) :
    sumTo n (fun j => KAlg.mul (softmaxAt n s j) (v j))
      = div (sumTo n (fun j => KAlg.mul (KAlg.exp (sub (s j) m)) (v j)))
            (sumTo n (fun j => KAlg.exp (sub (s j) m))) := by
  rw [shift_ratio n s v m]
  have h1 : sumTo n (fun j => KAlg.mul (softmaxAt n s j) (v j))
      = sumTo n (fun j => KAlg.mul (KAlg.mul (KAlg.exp (s j)) (v j))
          (KAlg.inv (sumTo n (fun k => KAlg.exp (s k))))) :=
    sumTo_ext n _ _ (fun j _ =>
      mul_rot (KAlg.exp (s j)) (KAlg.inv (sumTo n (fun k => KAlg.exp (s k)))) (v j))
  have h2 : sumTo n (fun j => KAlg.mul (KAlg.mul (KAlg.exp (s j)) (v j))
          (KAlg.inv (sumTo n (fun k => KAlg.exp (s k)))))
      = KAlg.mul (sumTo n (fun j => KAlg.mul (KAlg.exp (s j)) (v j)))
          (KAlg.inv (sumTo n (fun k => KAlg.exp (s k)))) :=
    sumTo_mul_r n (fun j => KAlg.mul (KAlg.exp (s j)) (v j))
      (KAlg.inv (sumTo n (fun k => KAlg.exp (s k))))
  exact h1.trans h2

end Derivc
