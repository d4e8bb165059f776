/-
derivc proof library: what the compiler's per-step obligations (StepNN_<rule>.lean) use
besides the rule theorems.  Mirrors proofs_ci/coq/Tactics.v (definitions `sel`, `foldN`,
`softmaxAtG`; the Coq side also has the congruence tactic `derivc_congr`, which is what
`derivc verify` checks).  NOTE: this file has never been compiled in this environment (no
Lean toolchain); CI (`lake build`) is its first check.
-/
import Derivc.Sum
import Derivc.Rules.SplitSoftmax
import Derivc.Rules.OnlineAgg
import Derivc.Rules.MapMma

namespace Derivc

/-- a generic sequential fold: step k is applied to the state after steps 0..k-1 -/
def foldN {S : Type} (step : Nat → S → S) (s0 : S) : Nat → S
  | 0 => s0
  | n + 1 => step n (foldN step s0 n)

theorem foldN_zero {S : Type} (step : Nat → S → S) (s0 : S) : foldN step s0 0 = s0 := rfl

theorem foldN_succ {S : Type} (step : Nat → S → S) (s0 : S) (n : Nat) :
    foldN step s0 (n + 1) = step n (foldN step s0 n) := rfl

variable {R : Type} [KAlg R]

/-- the guard form the exporter emits -/
def sel (b : Bool) (x y : R) : R := if b then x else y

theorem sel_true (x y : R) : sel true x y = x := rfl

theorem sel_false (x y : R) : sel false x y = y := rfl

theorem sel_and (a b : Bool) (x y : R) : sel (a && b) x y = sel a (sel b x y) y := by
  cases a <;> rfl

/-- masked softmax: masked positions give 0 -/
def softmaxAtG (g : Nat → Bool) (n : Nat) (s : Nat → R) (j : Nat) : R :=
  if g j = true then
    div (KAlg.exp (s j)) (sumTo n (fun k => if g k = true then KAlg.exp (s k) else KAlg.zero))
  else KAlg.zero

end Derivc

/-- first attempt at an obligation: unfold the guard form, then close by rfl / omega -/
macro "derivc_congr" : tactic =>
  `(tactic| (simp only [Derivc.sel]; first | rfl | omega))
