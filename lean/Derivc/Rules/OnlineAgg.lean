/- Rule ONLINE-AGG: flash-attention style tile-by-tile softmax aggregation with a
   running max m, running denominator l and running accumulator acc. The new
   running max is an arbitrary function `mnext` of (tile index, old max).
   Mirrors Rules/OnlineAgg.v. -/
import Derivc.Rules.SplitSoftmax

namespace Derivc

structure OState (R : Type) where
  st_m : R
  st_l : R
  st_acc : R

variable {R : Type} [KAlg R]

/-- generic step: `w j m'` is the (possibly masked) weight of score j under max m' -/
def onlineStepW (w : Nat → R → R) (v : Nat → R) (t : Nat) (mnext : Nat → R → R) (o : Nat)
    (st : OState R) : OState R :=
  OState.mk (mnext o st.st_m)
    (KAlg.add (KAlg.mul st.st_l (KAlg.exp (sub st.st_m (mnext o st.st_m))))
      (sumTo t (fun i => w (o * t + i) (mnext o st.st_m))))
    (KAlg.add (KAlg.mul st.st_acc (KAlg.exp (sub st.st_m (mnext o st.st_m))))
      (sumTo t (fun i => KAlg.mul (w (o * t + i) (mnext o st.st_m)) (v (o * t + i)))))

def onlineFoldW (w : Nat → R → R) (v : Nat → R) (t : Nat) (mnext : Nat → R → R) (m0 : R) :
    Nat → OState R
  | 0 => OState.mk m0 KAlg.zero KAlg.zero
  | T + 1 => onlineStepW w v t mnext T (onlineFoldW w v t mnext m0 T)

/-- unmasked: weight exp (s j - m') -/
def onlineFold (s v : Nat → R) (t : Nat) (mnext : Nat → R → R) (m0 : R) (T : Nat) : OState R :=
  onlineFoldW (fun j m => KAlg.exp (sub (s j) m)) v t mnext m0 T

/-- masked: weight (g j ? exp (s j - m') : 0) -/
def onlineFoldG (g : Nat → Bool) (s v : Nat → R) (t : Nat) (mnext : Nat → R → R) (m0 : R)
    (T : Nat) : OState R :=
  onlineFoldW (fun j m => cond (g j) (KAlg.exp (sub (s j) m)) KAlg.zero) v t mnext m0 T

theorem rescale_step (m m' S X : R) :
    KAlg.add (KAlg.mul (KAlg.mul (KAlg.exp (KAlg.neg m)) S) (KAlg.exp (sub m m')))
        (KAlg.mul X (KAlg.exp (KAlg.neg m')))
      = KAlg.mul (KAlg.exp (KAlg.neg m')) (KAlg.add S X) := by
  rw [mul_rot (KAlg.exp (KAlg.neg m)) S (KAlg.exp (sub m m')), exp_rescale m m',
    KAlg.mul_comm X (KAlg.exp (KAlg.neg m')), ← KAlg.mul_add (KAlg.exp (KAlg.neg m')) S X]

theorem step_sum (a b : Nat → R) (t T : Nat) (m m' x : R)
    (ha : ∀ j, a j = KAlg.mul (b j) (KAlg.exp (KAlg.neg m')))
    (hx : x = KAlg.mul (KAlg.exp (KAlg.neg m)) (sumTo (T * t) b)) :
    KAlg.add (KAlg.mul x (KAlg.exp (sub m m'))) (sumTo t (fun i => a (T * t + i)))
      = KAlg.mul (KAlg.exp (KAlg.neg m')) (sumTo ((T + 1) * t) b) := by
  have h1 : sumTo t (fun i => a (T * t + i))
      = sumTo t (fun i => KAlg.mul (b (T * t + i)) (KAlg.exp (KAlg.neg m'))) :=
    sumTo_ext t _ _ (fun i _ => ha (T * t + i))
  have h2 : sumTo t (fun i => KAlg.mul (b (T * t + i)) (KAlg.exp (KAlg.neg m')))
      = KAlg.mul (sumTo t (fun i => b (T * t + i))) (KAlg.exp (KAlg.neg m')) :=
    sumTo_mul_r t (fun i => b (T * t + i)) (KAlg.exp (KAlg.neg m'))
  have h3 : sumTo ((T + 1) * t) b = KAlg.add (sumTo (T * t) b) (sumTo t (fun i => b (T * t + i))) := by
    rw [succ_mul' T t]
    exact sumTo_app (T * t) t b
  rw [h1, h2, hx, h3]
  exact rescale_step m m' (sumTo (T * t) b) (sumTo t (fun i => b (T * t + i)))

theorem online_invariant_w (w : Nat → R → R) (e v : Nat → R) (t : Nat) (mnext : Nat → R → R)
    (m0 : R) (hw : ∀ j mm, w j mm = KAlg.mul (e j) (KAlg.exp (KAlg.neg mm))) (T : Nat) :
    (onlineFoldW w v t mnext m0 T).st_l
        = KAlg.mul (KAlg.exp (KAlg.neg (onlineFoldW w v t mnext m0 T).st_m)) (sumTo (T * t) e)
      ∧ (onlineFoldW w v t mnext m0 T).st_acc
        = KAlg.mul (KAlg.exp (KAlg.neg (onlineFoldW w v t mnext m0 T).st_m))
            (sumTo (T * t) (fun j => KAlg.mul (e j) (v j))) := by
  induction T with
  | zero =>
    constructor
    · show KAlg.zero = KAlg.mul (KAlg.exp (KAlg.neg m0)) (sumTo (0 * t) e)
      rw [Nat.zero_mul, sumTo_O e, mul_0_r]
    · show KAlg.zero
        = KAlg.mul (KAlg.exp (KAlg.neg m0)) (sumTo (0 * t) (fun j => KAlg.mul (e j) (v j)))
      rw [Nat.zero_mul, sumTo_O (fun j => KAlg.mul (e j) (v j)), mul_0_r]
  | succ T ih =>
    constructor
    · exact step_sum (fun j => w j (mnext T (onlineFoldW w v t mnext m0 T).st_m)) e t T
        (onlineFoldW w v t mnext m0 T).st_m (mnext T (onlineFoldW w v t mnext m0 T).st_m)
        (onlineFoldW w v t mnext m0 T).st_l
        (fun j => hw j (mnext T (onlineFoldW w v t mnext m0 T).st_m)) ih.1
    · exact step_sum
        (fun j => KAlg.mul (w j (mnext T (onlineFoldW w v t mnext m0 T).st_m)) (v j))
        (fun j => KAlg.mul (e j) (v j)) t T
        (onlineFoldW w v t mnext m0 T).st_m (mnext T (onlineFoldW w v t mnext m0 T).st_m)
        (onlineFoldW w v t mnext m0 T).st_acc
        (fun j => (congrArg (fun z => KAlg.mul z (v j))
            (hw j (mnext T (onlineFoldW w v t mnext m0 T).st_m))).trans (mul_rot _ _ _))
        ih.2

theorem online_invariant (s v : Nat → R) (t : Nat) (mnext : Nat → R → R) (m0 : R) (T : Nat) :
    (onlineFold s v t mnext m0 T).st_l
        = KAlg.mul (KAlg.exp (KAlg.neg (onlineFold s v t mnext m0 T).st_m))
            (sumTo (T * t) (fun j => KAlg.exp (s j)))
      ∧ (onlineFold s v t mnext m0 T).st_acc
        = KAlg.mul (KAlg.exp (KAlg.neg (onlineFold s v t mnext m0 T).st_m))
            (sumTo (T * t) (fun j => KAlg.mul (KAlg.exp (s j)) (v j))) :=
  online_invariant_w (fun j m => KAlg.exp (sub (s j) m)) (fun j => KAlg.exp (s j)) v t mnext m0
    (fun j mm => exp_sub (s j) mm) T

theorem online_ratio_w (w : Nat → R → R) (e v : Nat → R) (t : Nat) (mnext : Nat → R → R)
    (m0 : R) (T : Nat) (hw : ∀ j mm, w j mm = KAlg.mul (e j) (KAlg.exp (KAlg.neg mm))) :
    div (onlineFoldW w v t mnext m0 T).st_acc (onlineFoldW w v t mnext m0 T).st_l
      = div (sumTo (T * t) (fun j => KAlg.mul (e j) (v j))) (sumTo (T * t) e) := by
  rw [(online_invariant_w w e v t mnext m0 hw T).1, (online_invariant_w w e v t mnext m0 hw T).2]
  exact div_cancel_l _ _ _ (exp_ne_zero _)

theorem online_agg (s v : Nat → R) (t : Nat) (mnext : Nat → R → R) (m0 M : R) (T : Nat) :
    div (onlineFold s v t mnext m0 T).st_acc (onlineFold s v t mnext m0 T).st_l
      = div (sumTo (T * t) (fun j => KAlg.mul (KAlg.exp (sub (s j) M)) (v j)))
            (sumTo (T * t) (fun j => KAlg.exp (sub (s j) M))) := by
  rw [shift_ratio (T * t) s v M]
  exact online_ratio_w (fun j m => KAlg.exp (sub (s j) m)) (fun j => KAlg.exp (s j)) v t mnext
    m0 T (fun j mm => exp_sub (s j) mm)

theorem cond_exp (b : Bool) (x m : R) :
    cond b (KAlg.exp (sub x m)) KAlg.zero
      = KAlg.mul (cond b (KAlg.exp x) KAlg.zero) (KAlg.exp (KAlg.neg m)) := by
  cases b with
  | false => exact (mul_0_l (KAlg.exp (KAlg.neg m))).symm
  | true => exact exp_sub x m

theorem online_agg_guard (g : Nat → Bool) (s v : Nat → R) (t : Nat) (mnext : Nat → R → R)
    (m0 M : R) (T : Nat) :
    div (onlineFoldG g s v t mnext m0 T).st_acc (onlineFoldG g s v t mnext m0 T).st_l
      = div (sumTo (T * t) (fun j => KAlg.mul (cond (g j) (KAlg.exp (sub (s j) M)) KAlg.zero) (v j)))
            (sumTo (T * t) (fun j => cond (g j) (KAlg.exp (sub (s j) M)) KAlg.zero)) := by
  have h1 : sumTo (T * t) (fun j => KAlg.mul (cond (g j) (KAlg.exp (sub (s j) M)) KAlg.zero) (v j))
      = sumTo (T * t) (fun j =>
          KAlg.mul (KAlg.mul (cond (g j) (KAlg.exp (s j)) KAlg.zero) (KAlg.exp (KAlg.neg M))) (v j)) :=
    sumTo_ext (T * t) _ _ (fun j _ => congrArg (fun z => KAlg.mul z (v j)) (cond_exp (g j) (s j) M))
  have h2 : sumTo (T * t) (fun j => cond (g j) (KAlg.exp (sub (s j) M)) KAlg.zero)
      = sumTo (T * t) (fun j => KAlg.mul (cond (g j) (KAlg.exp (s j)) KAlg.zero) (KAlg.exp (KAlg.neg M))) :=
    sumTo_ext (T * t) _ _ (fun j _ => cond_exp (g j) (s j) M)
  have h3 := ratio_scale (T * t) (fun j => cond (g j) (KAlg.exp (s j)) KAlg.zero) v
    (KAlg.exp (KAlg.neg M)) (exp_ne_zero _)
  rw [h1, h2]
  exact (online_ratio_w (fun j m => cond (g j) (KAlg.exp (sub (s j) m)) KAlg.zero)
    (fun j => cond (g j) (KAlg.exp (s j)) KAlg.zero) v t mnext m0 T
    (fun j mm => cond_exp (g j) (s j) mm)).trans h3.symm

end Derivc
