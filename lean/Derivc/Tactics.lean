/-
derivc proof library: what the compiler's per-step obligations (StepNN_<rule>.lean) use
besides the rule theorems.  Mirrors proofs_ci/coq/Tactics.v lemma by lemma and tactic by
tactic, under the same names (`python -m proofs_ci.theorems` compares the two lists):
  - `sel`, the guard form, and `foldN`, the sequential fold the IR's Fold is exported to,
  - congruence lemmas with bound hypotheses, the extended-shift softmax lemmas,
  - the tactics `derivc_congr` (agreement up to linear index arithmetic, guards decided by
    omega, in-bounds producer reads and commutative-ring identities), `derivc_kill_masked`,
    `derivc_valid`, `derivc_mnext`, … written with Lean 4 core tactics only (no Mathlib:
    `derivc_ring` normalises with `simp only` and the ring laws, where Coq uses `ring`).
NOT checked in this environment (no Lean toolchain): `lake build` in CI is its first check.
-/
import Derivc.Sum
import Derivc.Rules.Fuse
import Derivc.Rules.Tile
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

theorem foldN_ext {S : Type} (f g : Nat → S → S) (s0 s1 : S) (n m : Nat)
    (hnm : n = m) (hs : s0 = s1) (hfg : ∀ k s, k < n → f k s = g k s) :
    foldN f s0 n = foldN g s1 m := by
  subst hnm
  subst hs
  induction n with
  | zero => rfl
  | succ n ih =>
    rw [foldN_succ, foldN_succ, ih (fun k s hk => hfg k s (by omega))]
    exact hfg n _ (by omega)

/-- iterations k in [K, n) that leave the state unchanged can be dropped -/
theorem foldN_trunc {S : Type} (f : Nat → S → S) (s0 : S) (n K : Nat)
    (hid : ∀ k s, K ≤ k → k < n → f k s = s) (hK : K ≤ n) : foldN f s0 n = foldN f s0 K := by
  induction n with
  | zero =>
    have e : K = 0 := by omega
    rw [e]
  | succ n ih =>
    by_cases e : K = n + 1
    · rw [e]
    · rw [foldN_succ, hid n _ (by omega) (by omega)]
      exact ih (fun k s h1 h2 => hid k s h1 (by omega)) (by omega)

theorem foldN_trunc_eq {S : Type} (f g : Nat → S → S) (s0 s1 : S) (n K : Nat)
    (hid : ∀ k s, K ≤ k → k < n → f k s = s) (hK : K ≤ n) (hs : s0 = s1)
    (hfg : ∀ k s, k < K → f k s = g k s) : foldN f s0 n = foldN g s1 K := by
  rw [foldN_trunc f s0 n K hid hK]
  exact foldN_ext f g s0 s1 K K rfl hs hfg

theorem app_cong {A B : Type} (f g : A → B) (a b : A) (hfg : f = g) (hab : a = b) : f a = g b := by
  subst hfg
  subst hab
  rfl

/-- the exporter's guard form, for finite and extended values alike -/
def sel {A : Type} (b : Bool) (x y : A) : A := if b then x else y

/-- congruence through a guard, each branch under its condition (the direct proofs' descent) -/
theorem sel_congr {A : Type} (c : Bool) (x x' y y' : A) (hx : c = true → x = x')
    (hy : c = false → y = y') : sel c x y = sel c x' y' := by
  cases c
  · exact hy rfl
  · exact hx rfl

variable {R : Type} [KAlg R]

theorem sel_if (b : Bool) (x y : R) : sel b x y = if b then x else y := rfl

theorem sel_true (x y : R) : sel true x y = x := rfl

theorem sel_false (x y : R) : sel false x y = y := rfl

theorem sel_and (a b : Bool) (x y : R) : sel (a && b) x y = sel a (sel b x y) y := by
  cases a <;> rfl

theorem sumTo_ext_eq (n m : Nat) (f g : Nat → R) (e : n = m) (hfg : ∀ i, i < n → f i = g i) :
    sumTo n f = sumTo m g := by
  subst e
  exact sumTo_ext n f g hfg

theorem sumTo_ext_lt (n : Nat) (f g : Nat → R) (hfg : ∀ i, i < n → f i = g i) :
    sumTo n f = sumTo n g :=
  sumTo_ext n f g hfg

theorem maxTo_ext_eq (n m : Nat) (f g : Nat → Ext R) (e : n = m) (hfg : ∀ i, i < n → f i = g i) :
    maxTo n f = maxTo m g := by
  subst e
  exact maxTo_ext n f g hfg

theorem mma16_ext (f g : Nat → R) (hfg : ∀ k, k < 16 → f k = g k) : mma16 f = mma16 g := by
  unfold mma16
  rw [hfg 0 (by omega), hfg 1 (by omega), hfg 2 (by omega), hfg 3 (by omega), hfg 4 (by omega), hfg 5 (by omega), hfg 6 (by omega), hfg 7 (by omega), hfg 8 (by omega), hfg 9 (by omega), hfg 10 (by omega), hfg 11 (by omega), hfg 12 (by omega), hfg 13 (by omega), hfg 14 (by omega), hfg 15 (by omega)]

theorem sub_diag (a : R) : sub a a = KAlg.zero := KAlg.add_neg a

theorem add_left_comm (a b c : R) : KAlg.add a (KAlg.add b c) = KAlg.add b (KAlg.add a c) := by
  rw [← KAlg.add_assoc, KAlg.add_comm a b, KAlg.add_assoc]

theorem mul_left_comm (a b c : R) : KAlg.mul a (KAlg.mul b c) = KAlg.mul b (KAlg.mul a c) := by
  rw [← KAlg.mul_assoc, KAlg.mul_comm a b, KAlg.mul_assoc]

theorem onlineFoldW_foldN (w : Nat → Ext R → R) (v : Nat → R) (t : Nat)
    (mnext : Nat → Ext R → Ext R) (m0 : Ext R) (T : Nat) :
    onlineFoldW w v t mnext m0 T
      = foldN (onlineStepW w v t mnext) (OState.mk m0 KAlg.zero KAlg.zero) T := by
  induction T with
  | zero => rfl
  | succ T ih =>
    rw [foldN_succ, ← ih]
    rfl

theorem onlineFoldG_foldN (g : Nat → Bool) (s v : Nat → R) (t : Nat)
    (mnext : Nat → Ext R → Ext R) (m0 : Ext R) (T : Nat) :
    onlineFoldG g s v t mnext m0 T
      = foldN (onlineStepW (fun j m => if g j = true then expd (Ext.fin (s j)) m else KAlg.zero)
          v t mnext) (OState.mk m0 KAlg.zero KAlg.zero) T :=
  onlineFoldW_foldN _ v t mnext m0 T

/-- the (m, l) fold of a row softmax (ONLINE-AGG without V) as the IR's generic fold -/
theorem onlineFold2_foldN (g : Nat → Bool) (s : Nat → R) (t : Nat)
    (mnext : Nat → Ext R → Ext R) (m0 : Ext R) (T : Nat) :
    onlineFold2 g s t mnext m0 T = foldN (onlineStep2 g s t mnext) (m0, KAlg.zero) T := by
  induction T with
  | zero => rfl
  | succ T ih => simp only [onlineFold2, foldN, ih]

/-- masked softmax: exp(s j) / sum of exp over the unmasked k; masked positions give 0 -/
def softmaxAtG (g : Nat → Bool) (n : Nat) (s : Nat → R) (j : Nat) : R :=
  if g j = true then
    div (KAlg.exp (s j)) (sumTo n (fun k => if g k = true then KAlg.exp (s k) else KAlg.zero))
  else KAlg.zero

/-- the stabilising shift M is arbitrary as long as it is defined (-inf only when every
    position is masked) -/
theorem softmaxAt_shift (n : Nat) (s : Nat → R) (j : Nat) (M : Ext R) (hj : j < n)
    (hM : ∀ k, k < n → M = Ext.ninf → False) :
    softmaxAt n s j = div (expd (Ext.fin (s j)) M) (sumTo n (fun k => expd (Ext.fin (s k)) M)) := by
  cases M with
  | ninf => exact absurd rfl (hM j hj)
  | fin m =>
    show div (KAlg.exp (s j)) (sumTo n (fun k => KAlg.exp (s k)))
      = div (KAlg.exp (sub (s j) m)) (sumTo n (fun k => KAlg.exp (sub (s k) m)))
    have h1 : sumTo n (fun k => KAlg.exp (sub (s k) m))
        = KAlg.mul (sumTo n (fun k => KAlg.exp (s k))) (KAlg.exp (KAlg.neg m)) := by
      rw [← sumTo_mul_r]
      exact sumTo_ext n _ _ (fun k _ => exp_sub (s k) m)
    rw [h1, exp_sub]
    exact (div_cancel_r _ _ _ (exp_ne_zero _)).symm

theorem softmaxAtG_shift (g : Nat → Bool) (n : Nat) (s : Nat → R) (j : Nat) (M : Ext R)
    (hj : j < n) (hM : ∀ k, k < n → M = Ext.ninf → g k = false) :
    softmaxAtG g n s j
      = if g j = true then div (expd (Ext.fin (s j)) M)
          (sumTo n (fun k => if g k = true then expd (Ext.fin (s k)) M else KAlg.zero))
        else KAlg.zero := by
  cases M with
  | ninf =>
    unfold softmaxAtG
    rw [hM j hj rfl]
    rfl
  | fin m =>
    unfold softmaxAtG
    cases hg : g j with
    | false => rfl
    | true =>
      show div (KAlg.exp (s j)) (sumTo n (fun k => if g k = true then KAlg.exp (s k) else KAlg.zero))
        = div (KAlg.exp (sub (s j) m))
            (sumTo n (fun k => if g k = true then KAlg.exp (sub (s k) m) else KAlg.zero))
      have h1 : sumTo n (fun k => if g k = true then KAlg.exp (sub (s k) m) else KAlg.zero)
          = KAlg.mul (sumTo n (fun k => if g k = true then KAlg.exp (s k) else KAlg.zero))
              (KAlg.exp (KAlg.neg m)) := by
        rw [← sumTo_mul_r]
        exact sumTo_ext n _ _ (fun k _ => cond_exp (g k) (s k) m)
      rw [h1, exp_sub]
      exact (div_cancel_r _ _ _ (exp_ne_zero _)).symm

theorem softmaxAtG_true (n : Nat) (s : Nat → R) (j : Nat) :
    softmaxAtG (fun _ => true) n s j = softmaxAt n s j := rfl

/-- KAlg is a commutative ring (Coq: the `ring_theory` given to `Add Ring`; Lean core has no
    `ring`, `derivc_ring` rewrites with these laws) -/
theorem kalg_ring :
    (∀ a : R, KAlg.add KAlg.zero a = a) ∧ (∀ a b : R, KAlg.add a b = KAlg.add b a)
    ∧ (∀ a b c : R, KAlg.add a (KAlg.add b c) = KAlg.add (KAlg.add a b) c)
    ∧ (∀ a : R, KAlg.mul KAlg.one a = a) ∧ (∀ a b : R, KAlg.mul a b = KAlg.mul b a)
    ∧ (∀ a b c : R, KAlg.mul a (KAlg.mul b c) = KAlg.mul (KAlg.mul a b) c)
    ∧ (∀ a b c : R, KAlg.mul (KAlg.add a b) c = KAlg.add (KAlg.mul a c) (KAlg.mul b c))
    ∧ (∀ a : R, KAlg.add a (KAlg.neg a) = KAlg.zero) :=
  ⟨add_0_l, KAlg.add_comm, fun a b c => (KAlg.add_assoc a b c).symm, mul_1_l, KAlg.mul_comm,
    fun a b c => (KAlg.mul_assoc a b c).symm, add_mul, KAlg.add_neg⟩

/-! Tactics (same names as the Coq ones). -/

/-- Coq splits conjunctions and existentials in hypotheses for lia; omega does it itself -/
macro "derivc_destruct_conj" : tactic => `(tactic| skip)

/-- beta/zeta and the exporter's small definitions -/
macro "derivc_red" : tactic => `(tactic| (try simp only [sel, div, onlineStepW]))

/-- guards as arithmetic facts for omega -/
macro "derivc_facts" : tactic =>
  `(tactic| (try simp only [Nat.blt_eq, Nat.ble_eq, Bool.and_eq_true, ← Bool.not_eq_true,
    zltb, zleb, zeqb, decide_eq_true_eq] at *))

/-- case on a guard (an if on an index comparison) -/
macro "derivc_split" : tactic => `(tactic| (split <;> derivc_facts))

/-- Coq's derivc_split_on generalises one comparison before casing on it (so that Coq's destruct
   does not search the goal up to conversion); Lean's `split` cases on the `if` itself, so the
   mirror is the same case split -/
macro "derivc_split_on" : tactic => `(tactic| (split <;> derivc_facts))

/-- case on a comparison of integer data (zltb / zleb / zeqb of an i32 input's reads) -/
macro "derivc_zsplit" : tactic => `(tactic| (split <;> derivc_facts))

/-- Coq's test of a data fact's shape (used inside derivc_zunify there); nothing to do here -/
macro "derivc_zfact" : tactic => `(tactic| skip)

/-- data hypotheses (zeqb a b = true, …) as Int facts for omega -/
macro "derivc_zhyps" : tactic =>
  `(tactic| (try simp only [zltb, zleb, zeqb, decide_eq_true_eq, decide_eq_false_iff_not] at *))

/-- reads of integer data at indices spelt differently (i + 128 * t, t * 128 + i), spelt alike -/
macro "derivc_zunify" : tactic =>
  `(tactic| (try simp only [Nat.add_comm, Nat.mul_comm, Nat.add_left_comm] at *))

/-- a contradictory case: index facts, or data facts up to the spelling of their indices -/
macro "derivc_absurd" : tactic => `(tactic| (exfalso; first | omega | (derivc_zunify; omega)))

macro "derivc_cases" : tactic =>
  `(tactic| (repeat' (derivc_split <;> derivc_red <;> try (exfalso; omega))))

macro "derivc_fin_close" : tactic =>
  `(tactic| (intros; derivc_facts; first | rfl | contradiction | omega | (exfalso; omega) | trivial))

/-- commutative-ring identities: distribute, drop zeros and ones, sort sums and products -/
macro "derivc_ring" : tactic =>
  `(tactic| (simp only [KAlg.mul_add, add_mul, mul_0_l, mul_0_r, add_0_l, KAlg.add_zero,
      KAlg.mul_one, mul_1_l, KAlg.add_assoc, KAlg.add_comm, add_left_comm, KAlg.mul_assoc,
      KAlg.mul_comm, mul_left_comm]; done))

/-- a term of a sum / max over masked iterations vanishes -/
macro "derivc_zero_tail" : tactic =>
  `(tactic| (intro _ _; derivc_red; derivc_cases; all_goals (first | rfl | (exfalso; omega))))

/-- masked iterations of a fold leave the online-aggregation state unchanged -/
macro "derivc_kill_masked" : tactic =>
  `(tactic| (
    derivc_red
    repeat' (first
      | (rw [sumTo_zero_ext] <;> try derivc_zero_tail)
      | (rw [maxTo_ninf_ext] <;> try derivc_zero_tail))
    try simp only [max_ninf_r, rescale_diag, KAlg.mul_one, KAlg.add_zero]
    try rfl))

syntax "derivc_congr" : tactic
macro_rules
  | `(tactic| derivc_congr) => `(tactic| (
      derivc_red
      first
      | rfl
      | omega
      | (derivc_split <;> derivc_red <;> first | (exfalso; omega) | derivc_congr)
      | (rw [gen_inline] <;> first | omega | derivc_congr)
      | (rw [genX_inline] <;> first | omega | derivc_congr)
      | (apply sumTo_ext_eq <;> first | omega | (intro _ _; derivc_congr))
      | (apply maxTo_ext_eq <;> first | omega | (intro _ _; derivc_congr))
      | (apply mma16_ext; intro _ _; derivc_congr)
      | (apply foldN_ext <;> first | omega | (intro _ _ _; derivc_congr) | derivc_congr)
      | (apply foldN_trunc_eq <;>
          first
          | omega
          | (intro _ s _ _; cases s; derivc_kill_masked)
          | (intro _ _ _; derivc_congr)
          | derivc_congr)
      | (apply app_cong <;> derivc_congr)
      | derivc_ring))

/-- the guard hypotheses of sel_congr as facts omega reads -/
macro "derivc_bhyps" : tactic => `(tactic| derivc_facts)

/-- foldN_trunc_eq's first premise in a direct proof: the dropped iterations leave the state unchanged -/
macro "derivc_kill_step" : tactic =>
  `(tactic| (intro _ s _ _; first | (exfalso; omega) | (cases s; derivc_kill_masked)))

/-- one differing subterm of a direct proof: search, on that subterm only -/
macro "derivc_leaf" : tactic => `(tactic| (derivc_bhyps; derivc_congr))

/-- a proposition over index arithmetic: bounds, guards, store-index equalities -/
macro "derivc_props" : tactic =>
  `(tactic| (intros; repeat' (first | apply And.intro | apply Iff.intro | intro _); all_goals omega))

/-- goal `M = Ext.ninf → P` where M is an (inlined) max over a range and P is `g k = false` or
    False: a live key k makes M finite (maxTo_NInf_inv at k) -/
syntax "derivc_valid" term : tactic
macro_rules
  | `(tactic| derivc_valid $k) => `(tactic| (
      try simp only [sel, genAtX, genAt]
      derivc_cases
      all_goals first
        | derivc_fin_close
        | (intro hM
           have hc := maxTo_NInf_inv _ _ hM $k (by omega)
           revert hc
           derivc_red
           derivc_cases
           all_goals derivc_fin_close)))

/-- goal `online_max_ok g t mnext T` for the IR's running max max(m, max over the tile) -/
macro "derivc_mnext" : tactic => `(tactic| (
    unfold online_max_ok
    intro o m ho e
    have h2 := max_NInf_inv _ _ e
    refine ⟨h2.1, ?_⟩
    intro i hi
    have hc := maxTo_NInf_inv _ _ h2.2 i hi
    revert hc
    derivc_red
    derivc_cases
    all_goals derivc_fin_close))

/-! Safety: exp arguments <= 0 (Coq: Tactics.v, section Safety). -/

theorem ele_max_l_of (x a b : Ext R) (h : ele x a) : ele x (emax a b) :=
  ele_trans x a (emax a b) h (ele_max_l a b)

theorem ele_max_r_of (x a b : Ext R) (h : ele x b) : ele x (emax a b) :=
  ele_trans x b (emax a b) h (ele_max_r a b)

theorem ele_maxTo (n : Nat) (f : Nat → Ext R) : ∀ j, j < n → ele (f j) (maxTo n f) := by
  induction n with
  | zero => intro j hj; exact absurd hj (Nat.not_lt_zero j)
  | succ n ih =>
    intro j hj
    rw [maxTo_S]
    cases Nat.decEq j n with
    | isTrue e => subst e; exact ele_max_r _ _
    | isFalse e => exact ele_max_l_of (f j) (maxTo n f) (f n) (ih j (by omega))

theorem ele_maxTo_at (n : Nat) (f : Nat → Ext R) (x : Ext R) (h : ∃ j, j < n ∧ x = f j) :
    ele x (maxTo n f) := by
  cases h with
  | intro j hj => rw [hj.2]; exact ele_maxTo n f j hj.1

/-- x is one of the maximised values of a masked max: the value at a live key -/
theorem ele_maxTo_sel (n : Nat) (g : Nat → Bool) (f : Nat → Ext R) (x : Ext R) (j : Nat)
    (e : x = f j) (hj : j < n) (hg : g j = true) :
    ele x (maxTo n (fun k => sel (g k) (f k) Ext.ninf)) := by
  apply ele_maxTo_at
  exact ⟨j, hj, by
    rw [e]
    show f j = (if g j = true then f j else Ext.ninf)
    rw [if_pos hg]⟩

theorem ele_foldN {S : Type} (step : Nat → S → S) (s0 : S) (proj : S → Ext R) (n o : Nat)
    (x : Ext R) :
    (∀ k s, k < n → ele (proj s) (proj (step k s))) → o < n →
    (∀ s, ele x (proj (step o s))) → ele x (proj (foldN step s0 n)) := by
  induction n with
  | zero => intro _ ho _; exact absurd ho (Nat.not_lt_zero o)
  | succ n ih =>
    intro hmono ho hx
    rw [foldN_succ]
    cases Nat.decEq o n with
    | isTrue e => subst e; exact hx _
    | isFalse e =>
      exact ele_trans x (proj (foldN step s0 n)) _
        (ih (fun k s hk => hmono k s (by omega)) (by omega) hx) (hmono n _ (by omega))

theorem div_mod_t (i t : Nat) (_ht : 0 < t) : i = i % t + t * (i / t) := by
  rw [Nat.add_comm]
  exact (Nat.div_add_mod i t).symm

theorem div_lt_ceilDiv (i n t : Nat) (ht : 0 < t) (hi : i < n) : i / t < ceilDiv n t := by
  have h := ceilDiv_ge n t ht
  exact (Nat.div_lt_iff_lt_mul ht).2 (by omega)

/-- goal `ele x m`, m a max over a set that contains x (Coq: derivc_ele; the Coq tactic also
    covers the final running max of a fold through `ele_foldN`, found by goal matching, which
    this macro does not mirror) -/
syntax "derivc_ele" : tactic
macro_rules
  | `(tactic| derivc_ele) => `(tactic| first
      | exact ele_refl _
      | exact True.intro
      | (apply ele_max_r_of; derivc_ele)
      | (apply ele_max_l_of; derivc_ele)
      | (apply ele_maxTo_sel; rfl; omega; (derivc_red; derivc_facts; omega))
      | (apply ele_maxTo_at; exact ⟨_, by omega, rfl⟩))

/-- goal `a ≠ Ext.ninf` for the score of an exp site, under the site's select conditions -/
macro "derivc_not_ninf" : tactic =>
  `(tactic| (derivc_red; derivc_cases; all_goals (intro h; cases h)))

/-- a safety obligation `... → let .. in expd_safe a m` or `rescale_safe m m'` -/
macro "derivc_safe" : tactic =>
  `(tactic| (intros; first
      | (apply rescale_safe_of_ele; derivc_ele)
      | (apply expd_safe_of_ele_ne; derivc_ele; derivc_not_ninf)))

end Derivc
