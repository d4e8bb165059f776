/- Rule SPLIT-KV (flash-decoding): the ONLINE-AGG fold's key tiles divided into consecutive
   ranges, each folded from (-inf, 0, 0), the partial states (m, l, acc) merged by the fold's
   merge m = max m1 m2, l = l1 e^(m1 - m) + l2 e^(m2 - m), acc likewise.  The merged state has
   the invariant of the fold over the concatenation (fully masked ranges included), so its
   acc / l is the concatenated fold's; for S ranges the merge is a left fold (mergeN), equal to
   the combine with one global max (online_merge_global).
   Mirrors Rules/OnlineMerge.v.  NOT checked here (no Lean toolchain). -/
import Derivc.Rules.OnlineAgg
import Derivc.Rules.Reorder
import Derivc.Rules.Tile

namespace Derivc

variable {R : Type} [KAlg R]

def oMerge (a b : OState R) : OState R :=
  OState.mk (emax a.st_m b.st_m)
    (KAlg.add (KAlg.mul a.st_l (rescale a.st_m (emax a.st_m b.st_m)))
      (KAlg.mul b.st_l (rescale b.st_m (emax a.st_m b.st_m))))
    (KAlg.add (KAlg.mul a.st_acc (rescale a.st_m (emax a.st_m b.st_m)))
      (KAlg.mul b.st_acc (rescale b.st_m (emax a.st_m b.st_m))))

def oInit : OState R := OState.mk Ext.ninf KAlg.zero KAlg.zero

/-- the S partial states merged left to right -/
def mergeN (part : Nat → OState R) : Nat → OState R
  | 0 => oInit
  | k + 1 => oMerge (mergeN part k) (part k)

theorem merge_rescale (x z S : R) :
    KAlg.mul (KAlg.mul (KAlg.exp (KAlg.neg x)) S) (KAlg.exp (sub x z))
      = KAlg.mul (KAlg.exp (KAlg.neg z)) S := by
  rw [mul_rot, exp_rescale]

/-- two consecutive key ranges [0, n1) and [n1, n1 + n2) -/
theorem online_merge (g : Nat → Bool) (s v : Nat → R) (n1 n2 : Nat) (a b : OState R)
    (ha : onlineInv g s v n1 a)
    (hb : onlineInv (fun j => g (n1 + j)) (fun j => s (n1 + j)) (fun j => v (n1 + j)) n2 b) :
    onlineInv g s v (n1 + n2) (oMerge a b) := by
  obtain ⟨ma, la, aa⟩ := a
  obtain ⟨mb, lb, ab⟩ := b
  unfold onlineInv at ha hb ⊢
  unfold oMerge
  dsimp only at ha hb ⊢
  rw [sumTo_app, sumTo_app]
  cases ma with
  | fin x =>
    cases mb with
    | fin y =>
      obtain ⟨hla, haa⟩ := ha
      obtain ⟨hlb, hab⟩ := hb
      show KAlg.add (KAlg.mul la (rescale (Ext.fin x) (Ext.fin (KAlg.rmax x y))))
            (KAlg.mul lb (rescale (Ext.fin y) (Ext.fin (KAlg.rmax x y)))) = _
          ∧ KAlg.add (KAlg.mul aa (rescale (Ext.fin x) (Ext.fin (KAlg.rmax x y))))
            (KAlg.mul ab (rescale (Ext.fin y) (Ext.fin (KAlg.rmax x y)))) = _
      rw [hla, haa, hlb, hab, rescale_fin, rescale_fin, merge_rescale, merge_rescale,
        merge_rescale, merge_rescale, ← KAlg.mul_add, ← KAlg.mul_add]
      exact ⟨rfl, rfl⟩
    | ninf =>
      obtain ⟨hla, haa⟩ := ha
      obtain ⟨hlb, hab, hg⟩ := hb
      have hz := eg_masked_sum (fun j => g (n1 + j)) (fun j => s (n1 + j)) (fun j => v (n1 + j)) n2 hg
      show KAlg.add (KAlg.mul la (rescale (Ext.fin x) (Ext.fin x)))
            (KAlg.mul lb (rescale Ext.ninf (Ext.fin x))) = _
          ∧ KAlg.add (KAlg.mul aa (rescale (Ext.fin x) (Ext.fin x)))
            (KAlg.mul ab (rescale Ext.ninf (Ext.fin x))) = _
      rw [hla, haa, hlb, hab, rescale_diag, KAlg.mul_one, KAlg.mul_one, mul_0_l, mul_0_l,
        KAlg.add_zero, KAlg.add_zero]
      refine ⟨?_, ?_⟩
      · show _ = KAlg.mul _ (KAlg.add _ (sumTo n2 (eg (fun j => g (n1 + j)) (fun j => s (n1 + j)))))
        rw [hz.1, KAlg.add_zero]
      · show _ = KAlg.mul _ (KAlg.add _ (sumTo n2 (fun j => KAlg.mul (eg (fun j => g (n1 + j))
            (fun j => s (n1 + j)) j) (v (n1 + j)))))
        rw [hz.2, KAlg.add_zero]
  | ninf =>
    cases mb with
    | fin y =>
      obtain ⟨hla, haa, hg⟩ := ha
      obtain ⟨hlb, hab⟩ := hb
      have hz := eg_masked_sum g s v n1 hg
      show KAlg.add (KAlg.mul la (rescale Ext.ninf (Ext.fin y)))
            (KAlg.mul lb (rescale (Ext.fin y) (Ext.fin y))) = _
          ∧ KAlg.add (KAlg.mul aa (rescale Ext.ninf (Ext.fin y)))
            (KAlg.mul ab (rescale (Ext.fin y) (Ext.fin y))) = _
      rw [hla, haa, hlb, hab, rescale_diag, KAlg.mul_one, KAlg.mul_one, mul_0_l, mul_0_l,
        add_0_l, add_0_l, hz.1, hz.2, add_0_l, add_0_l]
      exact ⟨rfl, rfl⟩
    | ninf =>
      obtain ⟨hla, haa, hg1⟩ := ha
      obtain ⟨hlb, hab, hg2⟩ := hb
      refine ⟨?_, ?_, ?_⟩
      · show KAlg.add (KAlg.mul la (rescale Ext.ninf Ext.ninf)) (KAlg.mul lb (rescale Ext.ninf Ext.ninf))
            = KAlg.zero
        rw [hla, hlb, mul_0_l, mul_0_l, KAlg.add_zero]
      · show KAlg.add (KAlg.mul aa (rescale Ext.ninf Ext.ninf)) (KAlg.mul ab (rescale Ext.ninf Ext.ninf))
            = KAlg.zero
        rw [haa, hab, mul_0_l, mul_0_l, KAlg.add_zero]
      · intro j hj
        by_cases hlt : j < n1
        · exact hg1 j hlt
        · have e : j = n1 + (j - n1) := by omega
          rw [e]
          exact hg2 (j - n1) (by omega)

/-- S consecutive ranges of C keys each: the left-to-right merge -/
theorem online_merge_splits (g : Nat → Bool) (s v : Nat → R) (C : Nat) (part : Nat → OState R)
    (n : Nat)
    (hp : ∀ k, k < n → onlineInv (fun j => g (k * C + j)) (fun j => s (k * C + j))
      (fun j => v (k * C + j)) C (part k)) :
    onlineInv g s v (n * C) (mergeN part n) := by
  induction n with
  | zero => rw [Nat.zero_mul]; exact onlineInv_init g s v Ext.ninf
  | succ n ih =>
    show onlineInv g s v ((n + 1) * C) (oMerge (mergeN part n) (part n))
    rw [succ_mul' n C]
    exact online_merge g s v (n * C) C _ _ (ih (fun k hk => hp k (by omega))) (hp n (by omega))

/-- two states with the invariant of one key range have the same quotient acc / l -/
theorem onlineInv_quotient (g : Nat → Bool) (s v : Nat → R) (n : Nat) (a b : OState R)
    (ha : onlineInv g s v n a) (hb : onlineInv g s v n b) :
    div a.st_acc a.st_l = div b.st_acc b.st_l := by
  obtain ⟨ma, la, aa⟩ := a
  obtain ⟨mb, lb, ab⟩ := b
  unfold onlineInv at ha hb
  dsimp only at ha hb ⊢
  have hzero : ∀ x : R, (∀ j, j < n → g j = false) →
      div (KAlg.mul (KAlg.exp (KAlg.neg x)) (sumTo n (fun j => KAlg.mul (eg g s j) (v j))))
        (KAlg.mul (KAlg.exp (KAlg.neg x)) (sumTo n (eg g s))) = KAlg.zero := by
    intro x hg
    have hz := eg_masked_sum g s v n hg
    rw [hz.1, hz.2, mul_0_r]
    exact div_zero_zero
  cases ma with
  | fin x =>
    cases mb with
    | fin y =>
      obtain ⟨hla, haa⟩ := ha
      obtain ⟨hlb, hab⟩ := hb
      rw [hla, haa, hlb, hab, div_cancel_l _ _ _ (exp_ne_zero _), div_cancel_l _ _ _ (exp_ne_zero _)]
    | ninf =>
      obtain ⟨hla, haa⟩ := ha
      obtain ⟨hlb, hab, hg⟩ := hb
      rw [hla, haa, hlb, hab, hzero x hg, div_zero_zero]
  | ninf =>
    cases mb with
    | fin y =>
      obtain ⟨hla, haa, hg⟩ := ha
      obtain ⟨hlb, hab⟩ := hb
      rw [hla, haa, hlb, hab, hzero y hg, div_zero_zero]
    | ninf =>
      obtain ⟨hla, haa, _⟩ := ha
      obtain ⟨hlb, hab, _⟩ := hb
      rw [hla, haa, hlb, hab]

/-- merging the folds of two consecutive tile ranges equals folding their concatenation -/
theorem online_merge_fold (g : Nat → Bool) (s v : Nat → R) (t A B : Nat)
    (mnext1 mnext2 mnext : Nat → Ext R → Ext R)
    (h1 : online_max_ok g t mnext1 A)
    (h2 : online_max_ok (fun j => g (A * t + j)) t mnext2 B)
    (h12 : online_max_ok g t mnext (A + B)) :
    div (oMerge (onlineFoldG g s v t mnext1 Ext.ninf A)
          (onlineFoldG (fun j => g (A * t + j)) (fun j => s (A * t + j)) (fun j => v (A * t + j))
            t mnext2 Ext.ninf B)).st_acc
        (oMerge (onlineFoldG g s v t mnext1 Ext.ninf A)
          (onlineFoldG (fun j => g (A * t + j)) (fun j => s (A * t + j)) (fun j => v (A * t + j))
            t mnext2 Ext.ninf B)).st_l
      = div (onlineFoldG g s v t mnext Ext.ninf (A + B)).st_acc
          (onlineFoldG g s v t mnext Ext.ninf (A + B)).st_l := by
  apply onlineInv_quotient g s v ((A + B) * t)
  · rw [Nat.add_mul]
    exact online_merge g s v (A * t) (B * t) _ _ (online_invariant g s v t mnext1 Ext.ninf A h1)
      (online_invariant _ _ _ t mnext2 Ext.ninf B h2)
  · exact online_invariant g s v t mnext Ext.ninf (A + B) h12

/-- the rule's theorem: n splits of C tiles each, merged, give the quotient of the whole masked
    softmax-weighted sum for any valid shift M -/
theorem online_split_kv (g : Nat → Bool) (s v : Nat → R) (t C n : Nat)
    (mnext : Nat → Nat → Ext R → Ext R) (M : Ext R)
    (hok : ∀ k, k < n → online_max_ok (fun j => g (k * (C * t) + j)) t (mnext k) C)
    (hM : ∀ j, j < n * (C * t) → M = Ext.ninf → g j = false) :
    div (mergeN (fun k => onlineFoldG (fun j => g (k * (C * t) + j)) (fun j => s (k * (C * t) + j))
            (fun j => v (k * (C * t) + j)) t (mnext k) Ext.ninf C) n).st_acc
        (mergeN (fun k => onlineFoldG (fun j => g (k * (C * t) + j)) (fun j => s (k * (C * t) + j))
            (fun j => v (k * (C * t) + j)) t (mnext k) Ext.ninf C) n).st_l
      = div (sumTo (n * (C * t)) (fun j => KAlg.mul
              (if g j = true then expd (Ext.fin (s j)) M else KAlg.zero) (v j)))
          (sumTo (n * (C * t)) (fun j => if g j = true then expd (Ext.fin (s j)) M else KAlg.zero)) := by
  -- the whole range as one fold of n * C * t tiles of one key
  let one : Nat → Ext R → Ext R := fun _ m =>
    emax m (maxTo (n * (C * t)) (fun j => if g j = true then Ext.fin (s j) else Ext.ninf))
  have hone : online_max_ok g 1 one (n * (C * t)) := by
    intro o m ho e
    have e2 := max_NInf_inv _ _ e
    refine ⟨e2.1, fun i hi => ?_⟩
    have hi0 : i = 0 := by omega
    have eo := maxTo_NInf_inv _ _ e2.2 o ho
    rw [hi0, Nat.mul_one, Nat.add_zero]
    cases hg : g o with
    | false => rfl
    | true => simp only [hg] at eo; cases eo
  have eq := (online_agg_guard g s v 1 one Ext.ninf M (n * (C * t)) hone
    (fun j hj => hM j (by omega))).1
  rw [Nat.mul_one] at eq
  rw [← eq]
  apply onlineInv_quotient g s v (n * (C * t))
  · exact online_merge_splits g s v (C * t) _ n
      (fun k hk => online_invariant _ _ _ t (mnext k) Ext.ninf C (hok k hk))
  · have i := online_invariant g s v 1 one Ext.ninf (n * (C * t)) hone
    rw [Nat.mul_one] at i
    exact i

/-! The combine's one max. -/

theorem rescale_trans (a b c : Ext R) (hab : ele a b) (hbc : ele b c) :
    KAlg.mul (rescale a b) (rescale b c) = rescale a c := by
  cases a <;> cases b <;> cases c
  all_goals first
    | exact absurd hab id
    | exact absurd hbc id
    | skip
  · show KAlg.mul (KAlg.exp (sub _ _)) (KAlg.exp (sub _ _)) = KAlg.exp (sub _ _)
    rw [← KAlg.exp_add]
    unfold sub
    rw [KAlg.add_assoc, ← KAlg.add_assoc (KAlg.neg _) _ (KAlg.neg _),
      KAlg.add_comm (KAlg.neg _) _, KAlg.add_neg, add_0_l]
  all_goals first
    | exact mul_0_l _
    | exact mul_1_l _
    | exact KAlg.mul_one _

theorem ele_maxTo (n k : Nat) (f : Nat → Ext R) (hk : k < n) : ele (f k) (maxTo n f) := by
  induction n with
  | zero => omega
  | succ n ih =>
    rw [maxTo_S]
    by_cases e : k = n
    · rw [e]; exact ele_max_r _ _
    · exact ele_trans _ _ _ (ih (by omega)) (ele_max_l _ _)

theorem online_merge_global (part : Nat → OState R) (n : Nat) :
    mergeN part n
      = OState.mk (maxTo n (fun k => (part k).st_m))
          (sumTo n (fun k => KAlg.mul (part k).st_l
            (rescale (part k).st_m (maxTo n (fun k => (part k).st_m)))))
          (sumTo n (fun k => KAlg.mul (part k).st_acc
            (rescale (part k).st_m (maxTo n (fun k => (part k).st_m))))) := by
  induction n with
  | zero => rfl
  | succ n ih =>
    show oMerge (mergeN part n) (part n) = _
    rw [ih]
    unfold oMerge
    dsimp only
    have hM : emax (maxTo n (fun k => (part k).st_m)) (part n).st_m
        = maxTo (n + 1) (fun k => (part k).st_m) := rfl
    rw [hM, sumTo_S, sumTo_S, ← sumTo_mul_r, ← sumTo_mul_r]
    have hMn : ele (maxTo n (fun k => (part k).st_m)) (maxTo (n + 1) (fun k => (part k).st_m)) := by
      rw [maxTo_S]; exact ele_max_l _ _
    have hr : ∀ k, k < n →
        rescale (part k).st_m (maxTo n (fun k => (part k).st_m))
          |> (fun r => KAlg.mul r (rescale (maxTo n (fun k => (part k).st_m))
                (maxTo (n + 1) (fun k => (part k).st_m))))
          = rescale (part k).st_m (maxTo (n + 1) (fun k => (part k).st_m)) := by
      intro k hk
      exact rescale_trans _ _ _ (ele_maxTo n k (fun k => (part k).st_m) hk) hMn
    rw [sumTo_ext n _ (fun k => KAlg.mul (part k).st_l
          (rescale (part k).st_m (maxTo (n + 1) (fun k => (part k).st_m))))
        (fun k hk => by rw [KAlg.mul_assoc]; exact congrArg _ (hr k hk)),
      sumTo_ext n _ (fun k => KAlg.mul (part k).st_acc
          (rescale (part k).st_m (maxTo (n + 1) (fun k => (part k).st_m))))
        (fun k hk => by rw [KAlg.mul_assoc]; exact congrArg _ (hr k hk))]

/-! Any assignment of keys to splits. -/

/-- one partial state rescaled to a finite merged max z -/
theorem part_rescaled (g : Nat → Bool) (s v : Nat → R) (n : Nat) (st : OState R) (z : R)
    (hinv : onlineInv g s v n st) :
    KAlg.mul st.st_l (rescale st.st_m (Ext.fin z)) = KAlg.mul (KAlg.exp (KAlg.neg z)) (sumTo n (eg g s))
    ∧ KAlg.mul st.st_acc (rescale st.st_m (Ext.fin z))
      = KAlg.mul (KAlg.exp (KAlg.neg z)) (sumTo n (fun j => KAlg.mul (eg g s j) (v j))) := by
  obtain ⟨m, l, acc⟩ := st
  unfold onlineInv at hinv
  dsimp only at hinv ⊢
  cases m with
  | fin x =>
    obtain ⟨hl, ha⟩ := hinv
    rw [hl, ha, rescale_fin, merge_rescale, merge_rescale]
    exact ⟨rfl, rfl⟩
  | ninf =>
    obtain ⟨hl, ha, hg⟩ := hinv
    have hz := eg_masked_sum g s v n hg
    rw [hl, ha, mul_0_l, mul_0_l, hz.1, hz.2, mul_0_r]
    exact ⟨rfl, rfl⟩

/-- S partial states, split k over the keys key k j (j < n), covering N keys once (as sums):
    the merge's acc / l is the softmax-weighted average over the live keys of [0, N) -/
theorem online_merge_cover (g : Nat → Bool) (s v : Nat → R) (S n N : Nat)
    (key : Nat → Nat → Nat) (part : Nat → OState R)
    (hp : ∀ k, k < S → onlineInv (fun j => g (key k j)) (fun j => s (key k j))
      (fun j => v (key k j)) n (part k))
    (hcover : ∀ f : Nat → R, sumTo S (fun k => sumTo n (fun j => f (key k j))) = sumTo N f) :
    div (mergeN part S).st_acc (mergeN part S).st_l
      = div (sumTo N (fun j => KAlg.mul (eg g s j) (v j))) (sumTo N (eg g s)) := by
  rw [online_merge_global]
  dsimp only
  rw [← hcover (eg g s), ← hcover (fun j => KAlg.mul (eg g s j) (v j))]
  cases hM : maxTo S (fun k => (part k).st_m) with
  | fin z =>
    rw [sumTo_ext S _ (fun k => KAlg.mul (KAlg.exp (KAlg.neg z)) (sumTo n (fun j => eg g s (key k j))))
          (fun k hk => (part_rescaled _ _ _ n (part k) z (hp k hk)).1),
      sumTo_ext S _ (fun k => KAlg.mul (KAlg.exp (KAlg.neg z))
          (sumTo n (fun j => KAlg.mul (eg g s (key k j)) (v (key k j)))))
          (fun k hk => (part_rescaled _ _ _ n (part k) z (hp k hk)).2),
      sumTo_mul_l, sumTo_mul_l]
    exact div_cancel_l _ _ _ (exp_ne_zero _)
  | ninf =>
    have hz : ∀ k, k < S → (part k).st_l = KAlg.zero ∧ (part k).st_acc = KAlg.zero
        ∧ ∀ j, j < n → g (key k j) = false := by
      intro k hk
      have i := hp k hk
      unfold onlineInv at i
      rw [maxTo_NInf_inv S _ hM k hk] at i
      exact i
    rw [sumTo_zero_ext S _ (fun k hk => by simp only [(hz k hk).1]; exact mul_0_l _),
      sumTo_zero_ext S _ (fun k hk => by simp only [(hz k hk).2.1]; exact mul_0_l _),
      sumTo_zero_ext S (fun k => sumTo n (fun j => eg g s (key k j)))
        (fun k hk => (eg_masked_sum (fun j => g (key k j)) (fun j => s (key k j))
          (fun j => v (key k j)) n (hz k hk).2.2).1),
      sumTo_zero_ext S (fun k => sumTo n (fun j => KAlg.mul (eg g s (key k j)) (v (key k j))))
        (fun k hk => (eg_masked_sum (fun j => g (key k j)) (fun j => s (key k j))
          (fun j => v (key k j)) n (hz k hk).2.2).2)]

/-- the rule's assignment: split k folds the tiles S * o + k of t keys each -/
def skey (S t k j : Nat) : Nat := (S * (j / t) + k) * t + j % t

theorem tile_div_mod (o i t : Nat) (hi : i < t) : (o * t + i) / t = o ∧ (o * t + i) % t = i := by
  have ht : 0 < t := by omega
  constructor
  · rw [Nat.add_comm, Nat.add_mul_div_right _ _ ht, Nat.div_eq_of_lt hi, Nat.zero_add]
  · rw [Nat.add_comm, Nat.add_mul_mod_self_right, Nat.mod_eq_of_lt hi]

theorem skey_cover (S C t : Nat) (f : Nat → R) :
    sumTo S (fun k => sumTo (C * t) (fun j => f (skey S t k j))) = sumTo (C * S * t) f := by
  rw [sumTo_tile (C * S) t f, sumTo_tile C S]
  rw [sumTo_ext S _ (fun k => sumTo C (fun o => sumTo t (fun i => f ((S * o + k) * t + i))))
      (fun k _ => by
        rw [sumTo_tile]
        exact sumTo_ext C _ _ (fun o _ => sumTo_ext t _ _ (fun i hi => by
          unfold skey
          rw [(tile_div_mod o i t hi).1, (tile_div_mod o i t hi).2])))]
  rw [sumTo_swap]
  exact sumTo_ext C _ _ (fun o _ => sumTo_ext S _ _ (fun k _ => by rw [Nat.mul_comm S o]))

/-- the rule's theorem as the rule assigns tiles: S splits, split k folding the C tiles
    S * o + k from (-inf, 0, 0) with its own valid running max -/
theorem online_split_kv_strided (g : Nat → Bool) (s v : Nat → R) (t C S : Nat)
    (mnext : Nat → Nat → Ext R → Ext R)
    (hok : ∀ k, k < S → online_max_ok (fun j => g (skey S t k j)) t (mnext k) C) :
    div (mergeN (fun k => onlineFoldG (fun j => g (skey S t k j)) (fun j => s (skey S t k j))
            (fun j => v (skey S t k j)) t (mnext k) Ext.ninf C) S).st_acc
        (mergeN (fun k => onlineFoldG (fun j => g (skey S t k j)) (fun j => s (skey S t k j))
            (fun j => v (skey S t k j)) t (mnext k) Ext.ninf C) S).st_l
      = div (sumTo (C * S * t) (fun j => KAlg.mul (eg g s j) (v j))) (sumTo (C * S * t) (eg g s)) :=
  online_merge_cover g s v S (C * t) (C * S * t) (skey S t) _
    (fun k hk => online_invariant _ _ _ t (mnext k) Ext.ninf C (hok k hk))
    (fun f => skey_cover S C t f)

end Derivc
