/- Rule FOLD-STAT: the ONLINE-AGG fold also writes its row's log-sum-exp m + log l from its
   final state.  By online_invariant, l = exp (-m) * (sum of the live exp (s j)), so for a row
   with a live key m + log l = log (sum of the live exp (s j)); a fully masked row ends with
   m = -inf, l = 0.  log is the algebra's (class KAlgLog).
   Mirrors Rules/OnlineLse.v.  NOT checked here (no Lean toolchain). -/
import Derivc.Rules.OnlineAgg

namespace Derivc

variable {R : Type} [KAlg R] [KAlgLog R]

/-- log (exp a * b) = a + log b for b > 0 -/
theorem log_exp_mul (a b : R) (hb : rlt KAlg.zero b) :
    KAlgLog.log (KAlg.mul (KAlg.exp a) b) = KAlg.add a (KAlgLog.log b) := by
  have e : KAlg.mul (KAlg.exp a) b = KAlg.exp (KAlg.add a (KAlgLog.log b)) := by
    rw [KAlg.exp_add, KAlgLog.exp_log b hb]
  rw [e, KAlgLog.log_exp]

theorem online_lse (g : Nat → Bool) (s v : Nat → R) (t : Nat) (mnext : Nat → Ext R → Ext R)
    (m0 : Ext R) (T : Nat) (hok : online_max_ok g t mnext T) :
    match (onlineFoldG g s v t mnext m0 T).st_m with
    | Ext.fin x => rlt KAlg.zero (sumTo (T * t) (eg g s)) →
        KAlg.add x (KAlgLog.log (onlineFoldG g s v t mnext m0 T).st_l) = KAlgLog.log (sumTo (T * t) (eg g s))
    | Ext.ninf => (onlineFoldG g s v t mnext m0 T).st_l = KAlg.zero ∧ ∀ j, j < T * t → g j = false := by
  have hinv := online_invariant g s v t mnext m0 T hok
  unfold onlineInv at hinv
  cases hm : (onlineFoldG g s v t mnext m0 T).st_m with
  | fin x =>
    simp only [hm] at hinv ⊢
    intro hpos
    rw [hinv.1, log_exp_mul _ _ hpos, ← KAlg.add_assoc, KAlg.add_neg, add_0_l]
  | ninf =>
    simp only [hm] at hinv ⊢
    exact ⟨hinv.1, hinv.2.2⟩

end Derivc
