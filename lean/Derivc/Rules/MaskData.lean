/- Rule MASK-DATA: the key tiles of an online-aggregation fold bounded by a span derived from the
   mask's own integer data.  Mirrors proofs_ci/coq/Rules/MaskData.v definition by definition and
   theorem by theorem (span_cover, span_cover_at, foldN_skip_span).  Not checked here: no Lean
   toolchain. -/
import Derivc.Tactics

namespace Derivc

/-- some r < n has f r -/
def anyBelow : Nat → (Nat → Bool) → Bool
  | 0, _ => false
  | k + 1, f => anyBelow k f || f k

theorem anyBelow_intro (n : Nat) (f : Nat → Bool) (r : Nat) (hr : r < n) (hf : f r = true) :
    anyBelow n f = true := by
  induction n with
  | zero => omega
  | succ n ih =>
    simp only [anyBelow, Bool.or_eq_true]
    by_cases e : r = n
    · subst e; exact Or.inr hf
    · exact Or.inl (ih (by omega))

/-- the least hit below n (n when none) -/
def firstHit (h : Nat → Bool) : Nat → Nat
  | 0 => 0
  | k + 1 => if firstHit h k < k then firstHit h k else if h k then k else k + 1

/-- one past the greatest hit below n (0 when none) -/
def lastHit (h : Nat → Bool) : Nat → Nat
  | 0 => 0
  | k + 1 => if h k then k + 1 else lastHit h k

/-- the span's ends: the obligations compare the tile with them as with any index bound -/
def spanLo (h : Nat → Bool) (nk size : Nat) : Nat := firstHit h nk / size

def spanHi (h : Nat → Bool) (nk size : Nat) : Nat :=
  match lastHit h nk with | 0 => 0 | l + 1 => l / size + 1

def spanHas (h : Nat → Bool) (nk size t : Nat) : Bool :=
  Nat.ble (spanLo h nk size) t && Nat.blt t (spanHi h nk size)

/-- the span of a comparison query == key: key p lies between the least and greatest value of
the valid rows r < rows (the exported form; `leb` the values' order) -/
def spanHit {A : Type} (leb : A → A → Bool) (q : Nat → A) (ok : Nat → Bool) (rows : Nat)
    (k : Nat → A) (p : Nat) : Bool :=
  anyBelow rows (fun r => ok r && leb (q r) (k p)) && anyBelow rows (fun r => ok r && leb (k p) (q r))

theorem firstHit_le (h : Nat → Bool) (n p : Nat) (hp : p < n) (hh : h p = true) :
    firstHit h n ≤ p := by
  induction n with
  | zero => omega
  | succ n ih =>
    simp only [firstHit]
    by_cases e : p = n
    · subst e
      split
      · omega
      · simp [hh]
    · have := ih (by omega)
      split
      · omega
      · omega

theorem lastHit_gt (h : Nat → Bool) (n p : Nat) (hp : p < n) (hh : h p = true) :
    p < lastHit h n := by
  induction n with
  | zero => omega
  | succ n ih =>
    simp only [lastHit]
    by_cases e : p = n
    · subst e; simp [hh]
    · split
      · omega
      · exact ih (by omega)

theorem span_cover (h : Nat → Bool) (nk size p : Nat) (hs : 0 < size) (hp : p < nk)
    (hh : h p = true) : spanHas h nk size (p / size) = true := by
  have hf := firstHit_le h nk p hp hh
  have hl := lastHit_gt h nk p hp hh
  simp only [spanHas, spanLo, spanHi, Bool.and_eq_true, Nat.ble_eq, Nat.blt_eq]
  refine ⟨Nat.div_le_div_right hf, ?_⟩
  cases e : lastHit h nk with
  | zero => omega
  | succ l =>
    have : p / size ≤ l / size := Nat.div_le_div_right (by omega)
    simp only; omega

theorem span_cover_at (h : Nat → Bool) (nk size t p : Nat) (hlo : size * t ≤ p)
    (hhi : p < size * t + size) (hp : p < nk) (hh : h p = true) : spanHas h nk size t = true := by
  have hs : 0 < size := by omega
  have ht : p / size = t := by
    rw [Nat.div_eq_iff hs]
    constructor <;> simp only [Nat.mul_comm] at * <;> omega
  rw [← ht]
  exact span_cover h nk size p hs hp hh

theorem foldN_app {S : Type} (f : Nat → S → S) (s0 : S) (a b : Nat) :
    foldN f s0 (a + b) = foldN (fun k => f (a + k)) (foldN f s0 a) b := by
  induction b with
  | zero => rfl
  | succ b ih => rw [← Nat.add_assoc, foldN_succ, foldN_succ, ih]

theorem foldN_identity {S : Type} (f : Nat → S → S) (s0 : S) (n : Nat)
    (hid : ∀ k s, k < n → f k s = s) : foldN f s0 n = s0 := by
  induction n with
  | zero => rfl
  | succ n ih => rw [foldN_succ, hid n _ (by omega), ih (fun k s hk => hid k s (by omega))]

theorem foldN_skip_span {S : Type} (f : Nat → S → S) (s0 : S) (n lo hi : Nat) (hlh : lo ≤ hi)
    (hhn : hi ≤ n) (hid : ∀ k s, k < n → (k < lo ∨ hi ≤ k) → f k s = s) :
    foldN f s0 n = foldN (fun k => f (lo + k)) s0 (hi - lo) := by
  rw [foldN_trunc f s0 n hi (fun k s h1 h2 => hid k s h2 (Or.inr h1)) hhn]
  have e : hi = lo + (hi - lo) := by omega
  conv => lhs; rw [e]
  rw [foldN_app, foldN_identity f s0 lo (fun k s hk => hid k s (by omega) (Or.inl hk))]

end Derivc
