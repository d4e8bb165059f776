/- Rule PARALLEL: if the write index is injective on the iteration range, the
   order in which the iterations' writes land does not matter.
   Own `Perm` and membership `InL` (no library permutation). Mirrors Rules/Parallel.v. -/
import Derivc.Sum

namespace Derivc

/-- memory: Nat → A; a point update -/
def upd {A : Type} (m : Nat → A) (a : Nat) (v : A) : Nat → A :=
  fun x => if x = a then v else m x

/-- iteration list l; iteration i writes `val i` at `idx i`; applied left to right -/
def applyWrites {A : Type} : (Nat → A) → (Nat → Nat) → (Nat → A) → List Nat → (Nat → A)
  | m, _, _, [] => m
  | m, idx, val, i :: l => applyWrites (upd m (idx i) (val i)) idx val l

inductive Perm : List Nat → List Nat → Prop where
  | nil : Perm [] []
  | skip (x : Nat) (l l' : List Nat) : Perm l l' → Perm (x :: l) (x :: l')
  | swap (x y : Nat) (l : List Nat) : Perm (y :: x :: l) (x :: y :: l)
  | trans (l l' l'' : List Nat) : Perm l l' → Perm l' l'' → Perm l l''

def InL (x : Nat) : List Nat → Prop
  | [] => False
  | y :: l => y = x ∨ InL x l

theorem inL_head (x : Nat) (l : List Nat) : InL x (x :: l) := by
  show x = x ∨ InL x l
  exact Or.inl rfl

theorem inL_tail (x y : Nat) (l : List Nat) (h : InL x l) : InL x (y :: l) := by
  show y = x ∨ InL x l
  exact Or.inr h

theorem perm_in (l l' : List Nat) (h : Perm l l') : ∀ x, InL x l → InL x l' := by
  induction h with
  | nil => intro x hx; exact hx
  | skip y l l' _ ih =>
    intro x hx
    have hx' : y = x ∨ InL x l := hx
    show y = x ∨ InL x l'
    cases hx' with
    | inl e => exact Or.inl e
    | inr h2 => exact Or.inr (ih x h2)
  | swap y z l =>
    intro x hx
    have hx' : z = x ∨ (y = x ∨ InL x l) := hx
    show y = x ∨ (z = x ∨ InL x l)
    cases hx' with
    | inl e => exact Or.inr (Or.inl e)
    | inr h2 =>
      cases h2 with
      | inl e => exact Or.inl e
      | inr h3 => exact Or.inr (Or.inr h3)
  | trans l l' l'' _ _ ih1 ih2 =>
    intro x hx
    exact ih2 x (ih1 x hx)

theorem perm_sym (l l' : List Nat) (h : Perm l l') : Perm l' l := by
  induction h with
  | nil => exact Perm.nil
  | skip x l l' _ ih => exact Perm.skip x l' l ih
  | swap x y l => exact Perm.swap y x l
  | trans l l' l'' _ _ ih1 ih2 => exact Perm.trans l'' l' l ih2 ih1

theorem upd_comm {A : Type} (m : Nat → A) (a b : Nat) (v w : A) (hab : a ≠ b) :
    upd (upd m a v) b w = upd (upd m b w) a v := by
  funext x
  show (if x = b then w else (if x = a then v else m x))
    = (if x = a then v else (if x = b then w else m x))
  by_cases hb : x = b
  · have ha : ¬ x = a := by omega
    rw [if_pos hb, if_neg ha, if_pos hb]
  · by_cases ha : x = a
    · rw [if_neg hb, if_pos ha, if_pos ha]
    · rw [if_neg hb, if_neg ha, if_neg ha, if_neg hb]

theorem parallel_writes {A : Type} (idx : Nat → Nat) (val : Nat → A) (l l' : List Nat)
    (h : Perm l l') :
    ∀ (m : Nat → A), (∀ i j, InL i l → InL j l → idx i = idx j → i = j) →
      applyWrites m idx val l = applyWrites m idx val l' := by
  induction h with
  | nil => intro m _; rfl
  | skip x l l' _ ih =>
    intro m hinj
    exact ih (upd m (idx x) (val x))
      (fun i j hi hj e => hinj i j (inL_tail i x l hi) (inL_tail j x l hj) e)
  | swap x y l =>
    intro m hinj
    show applyWrites (upd (upd m (idx y) (val y)) (idx x) (val x)) idx val l
      = applyWrites (upd (upd m (idx x) (val x)) (idx y) (val y)) idx val l
    by_cases e : idx x = idx y
    · have hxy : x = y :=
        hinj x y (inL_tail x y (x :: l) (inL_head x l)) (inL_head y (x :: l)) e
      subst hxy
      rfl
    · rw [upd_comm m (idx y) (idx x) (val y) (val x) (fun h => e h.symm)]
  | trans l l' l'' h1 _ ih1 ih2 =>
    intro m hinj
    rw [ih1 m hinj]
    exact ih2 m (fun i j hi hj e =>
      hinj i j (perm_in l' l (perm_sym l l' h1) i hi) (perm_in l' l (perm_sym l l' h1) j hj) e)

/-- A grid axis carrying several loops (PARALLEL of a second loop to a used axis): the axis
    enumerates x * E + i for the loops before (x < X, flattened) and the joining loop (i < E);
    the printers decode i = block % E and x = block / E. Mirrors Rules/Parallel.v. -/
theorem grid_axis_product (X E x i : Nat) (hx : x < X) (hi : i < E) :
    x * E + i < X * E ∧ (x * E + i) / E = x ∧ (x * E + i) % E = i := by
  have hE : 0 < E := by omega
  refine ⟨?_, ?_, ?_⟩
  · have h1 : (x + 1) * E ≤ X * E := Nat.mul_le_mul_right E (by omega)
    rw [Nat.add_mul, Nat.one_mul] at h1
    omega
  · rw [Nat.mul_comm, Nat.mul_add_div hE, Nat.div_eq_of_lt hi, Nat.add_zero]
  · rw [Nat.mul_comm, Nat.mul_add_mod, Nat.mod_eq_of_lt hi]

theorem grid_axis_cover (X E b : Nat) (hb : b < X * E) :
    b / E < X ∧ b % E < E ∧ b = b / E * E + b % E := by
  have hE : 0 < E := by
    cases E with
    | zero => simp at hb
    | succ n => exact Nat.succ_pos n
  refine ⟨(Nat.div_lt_iff_lt_mul hE).2 hb, Nat.mod_lt b hE, ?_⟩
  rw [Nat.mul_comm]
  exact (Nat.div_add_mod b E).symm

end Derivc
