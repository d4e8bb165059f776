/- Rule SOFTMAX-BWD-ROWTERM (FlashAttention-2's row term D_i): Σ_j P_j (Σ_d g_d V_{j,d})
   = Σ_d g_d (Σ_j P_j V_{j,d}), a finite-sum exchange for any weights P.
   Mirrors Rules/SoftmaxBwd.v.  NOT checked in this environment (no Lean toolchain). -/
import Derivc.Rules.Reorder
import Derivc.Tactics

namespace Derivc
variable {R : Type} [KAlg R]

theorem softmax_bwd_rowterm (n m : Nat) (P g : Nat → R) (V : Nat → Nat → R) :
    sumTo n (fun j => KAlg.mul (P j) (sumTo m (fun d => KAlg.mul (g d) (V j d))))
      = sumTo m (fun d => KAlg.mul (g d) (sumTo n (fun j => KAlg.mul (P j) (V j d)))) := by
  have h1 : sumTo n (fun j => KAlg.mul (P j) (sumTo m (fun d => KAlg.mul (g d) (V j d))))
      = sumTo n (fun j => sumTo m (fun d => KAlg.mul (g d) (KAlg.mul (P j) (V j d)))) := by
    apply sumTo_ext
    intro j _
    show KAlg.mul (P j) (sumTo m (fun d => KAlg.mul (g d) (V j d)))
      = sumTo m (fun d => KAlg.mul (g d) (KAlg.mul (P j) (V j d)))
    rw [← sumTo_mul_l m (fun d => KAlg.mul (g d) (V j d)) (P j)]
    exact sumTo_ext m _ _ (fun d _ => mul_left_comm (P j) (g d) (V j d))
  rw [h1, sumTo_swap n m (fun j d => KAlg.mul (g d) (KAlg.mul (P j) (V j d)))]
  exact sumTo_ext m _ _ (fun d _ => sumTo_mul_l n (fun j => KAlg.mul (P j) (V j d)) (g d))

end Derivc
