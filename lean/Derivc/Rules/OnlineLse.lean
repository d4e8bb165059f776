/- Rule FOLD-STAT: the ONLINE-AGG fold also writes its row's log-sum-exp m + log l from its
   final state.  By online_invariant, l = exp (-m) * (sum of the live exp (s j)), so
   m + log l = log (sum of the live exp (s j)); a fully masked row ends with m = -inf, l = 0.
   `log` is an argument with the law log (exp a * b) = a + log b until the algebra has it.
   Mirrors Rules/OnlineLse.v.  NOT checked here (no Lean toolchain). -/
import Derivc.Rules.OnlineAgg

namespace Derivc

variable {R : Type} [KAlg R]

theorem online_lse (log : R → R)
    (hlog : ∀ a b : R, log (KAlg.mul (KAlg.exp a) b) = KAlg.add a (log b))
    (g : Nat → Bool) (s v : Nat → R) (t : Nat) (mnext : Nat → Ext R → Ext R) (m0 : Ext R) (T : Nat)
    (hok : online_max_ok g t mnext T) :
    match (onlineFoldG g s v t mnext m0 T).st_m with
    | Ext.fin x => KAlg.add x (log (onlineFoldG g s v t mnext m0 T).st_l) = log (sumTo (T * t) (eg g s))
    | Ext.ninf => (onlineFoldG g s v t mnext m0 T).st_l = KAlg.zero ∧ ∀ j, j < T * t → g j = false := by
  have hinv := online_invariant g s v t mnext m0 T hok
  unfold onlineInv at hinv
  cases hm : (onlineFoldG g s v t mnext m0 T).st_m with
  | fin x =>
    simp only [hm] at hinv ⊢
    rw [hinv.1, hlog, ← KAlg.add_assoc, KAlg.add_neg, add_0_l]
  | ninf =>
    simp only [hm] at hinv ⊢
    exact ⟨hinv.1, hinv.2.2⟩

end Derivc
