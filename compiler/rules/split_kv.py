"""SPLIT-KV (flash-decoding): ONLINE-AGG's key-tile loop divided among S splits over a new
loop (a grid axis once PARALLEL maps it), each split folding its tiles from (-inf, 0, 0) into a
partial state (m, l, acc), then a combine that merges the S partial states.

    before:  def O[b, h, i, d] = <lets> fold(jo < E) state (m = -inf, l = 0, acc = 0):
                                   <binds and updates over tile jo>
                                 result acc / l
    after:   def Op[b, h, i, ks, d] : f32 = <lets> fold(jo < ceil((E·t − t·ks) / (t·S))) state (m, l, acc):
                                   <the same binds and updates over tile S·jo + ks>
                                 result acc
                                 result[1] m
                                 result[2] l
               also Op_m[b, h, i, ks] = result[1] where d == 0
               also Op_l[b, h, i, ks] = result[2] where d == 0
             def O[b, h, i, d] = let mx = max(ks < S: Op_m[b, h, i, ks])
                                 in sum(ks < S: Op[b, h, i, ks, d] · rescale(Op_m[b, h, i, ks], mx))
                                    / sum(ks < S: Op_l[b, h, i, ks] · rescale(Op_m[b, h, i, ks], mx))

Split ks folds the tiles ks, S + ks, 2S + ks, … (strided: with S fixed the tile index stays
affine for every number of tiles; a split past the last tile folds nothing and keeps
(-inf, 0, 0)).  The combine is a program of its own (a definition: the second kernel), the
merge of the fold with one global max: m = max_k m_k, l = Σ_k l_k·e^(m_k − m), acc likewise
(rescale(-inf, -inf) = 1: a row with every split masked gives 0 / 0 = 0, as the fold does).
No atomics: every partial state has its own slot and the combine adds them in split order.

Preconditions: `def` is a plain definition (unmapped, untiled loops, store = its loops, no
guard, no further outputs) whose body is lets around a tail fold over `index` with ONLINE-AGG's
state (m, l, acc) from (-inf, 0, 0) (m := max(m, …), l and acc rescaled by rescale(m, m_new))
and result acc / l; `splits` ≥ 2; the new names are unused.
Theorems (proofs_ci/coq/Rules/OnlineMerge.v, lean/Derivc/Rules/OnlineMerge.lean):
online_split_kv_strided (this rule's assignment: split k folding tiles S·o + k, merged, gives the
softmax-weighted average over all tiles), from online_merge_cover (any assignment of keys to
splits that covers the keys once; fully masked splits included); online_merge_global (the
left-to-right merge is the one-max combine written here, the per-step obligation); for
consecutive ranges online_merge (two), online_merge_splits and online_split_kv (S).
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import (
    Aff, AlsoStore, Bin, Binding, Def, Ext, Fold, Let, Loop, Program, Read, Reduce, TensorType, fresh,
    names_in_program, subst_index, tail_fold,
)
from ..names import name_problem
from ..kernel_view import CHAIN_FACT
from ..machine import DEVICE
from . import register
from .base import Facts, Rule, StepParams
from .fold_stat import online_pair


class SplitKvParams(StepParams):
    def_: str = Field(alias="def")
    """the plain definition ending in ONLINE-AGG's fold"""
    index: str
    """the fold's key-tile index divided among the splits"""
    splits: int = Field(le=min(DEVICE.grid_limits))
    """the number of splits S (at least 2; they run as blocks of one grid axis)"""
    split_index: str = "ks"
    """the new loop over the splits"""
    name: str = ""
    """the partial accumulator tensor (default: <def>_part); <name>_m, <name>_l beside it"""
    new_names = ("split_index",)


def _partial_names(p: SplitKvParams) -> tuple[str, str, str]:
    base = p.name or f"{p.def_}_part"
    return base, f"{base}_m", f"{base}_l"


def _with_tail(e, fold: Fold):
    if isinstance(e, Let):
        return Let(e.bind, _with_tail(e.body, fold))
    return fold


class SplitKv(Rule):
    name = "split_kv"
    kind = "SPLIT-KV"
    theorem = "online_split_kv_strided"
    also = ("online_merge_cover", "online_merge_global", "online_merge")
    Params = SplitKvParams

    def check(self, prog: Program, p: SplitKvParams) -> Facts:
        d = self.get_def(prog, p.def_)
        problem = name_problem(p.name) if p.name else ""
        if problem:
            raise self.fail(f"parameter name: {problem}")
        if p.splits < 2:
            raise self.fail(f"splits must be at least 2 (got {p.splits})")
        for n in (p.split_index, *_partial_names(p)):
            self.require_new_name(prog, n, "split_index" if n == p.split_index else "name")
        fold = tail_fold(d.body)
        if fold is None or fold.var != p.index:
            raise self.fail(f"{d.name}'s body is not a fold over {p.index} (under lets): apply online_agg first")
        pair = online_pair(fold)
        if pair is None or len(fold.state) != 3 or fold.init[2] != fold.init[1]:
            raise self.fail(f"{d.name}'s fold does not carry ONLINE-AGG's state (m, l, acc) from (-inf, 0, 0)")
        m, l, acc = fold.state
        acc_upd = fold.update[2]
        if not (isinstance(acc_upd, Bin) and acc_upd.op == "+"
                and acc_upd.a == Bin("*", Read(acc, ()), Bin("rescale", Read(m, ()), fold.update[0]))):
            raise self.fail(f"{d.name}'s fold does not rescale acc by rescale({m}, m_new)")
        if fold.result != Bin("/", Read(acc, ()), Read(l, ())) or fold.also or d.also:
            raise self.fail(f"{d.name}'s fold result is not {acc} / {l} alone (split before fold_stat)")
        if d.guard or d.level != "global" or any(lp.mapping for lp in d.loops) \
                or d.store != tuple(Aff.of(lp.var) for lp in d.loops):
            raise self.fail(f"{d.name} is not a plain statement (untiled, unmapped, unguarded store "
                            f"{d.name}[loops]): split before tiling or mapping its loops")
        if len(d.loops) < 1:
            raise self.fail(f"{d.name} has no loop")
        return {"theorem": "online_merge_global", "site": fold, "m": m, "l": l, "acc": acc, "tiles": str(fold.ext),
                "splits": p.splits,
                "partials": list(_partial_names(p)),
                "assignment": f"split {p.split_index} folds tiles {p.splits}*{p.index} + {p.split_index}"}

    def rewrite(self, prog: Program, p: SplitKvParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        fold: Fold = facts["site"]
        m, l, acc = fold.state
        S, ks, jo = p.splits, p.split_index, fold.var
        part, part_m, part_l = _partial_names(p)
        tile = Aff.build({jo: S, ks: 1})
        # tiles S*jo + ks < ceil(num / div)  <=>  jo < ceil((num - div*ks) / (div*S))
        ext = Ext(tuple((num - Aff.of(ks, div), div * S) for num, div in fold.ext.parts))
        binds = tuple(replace(b, value=subst_index(b.value, jo, tile)) for b in fold.binds)
        partial_fold = replace(
            fold, ext=ext, binds=binds,
            update=tuple(subst_index(u, jo, tile) for u in fold.update),
            result=Read(acc, ()), also=(Read(m, ()), Read(l, ())))
        *outer, last = d.loops
        loops = (*outer, Loop(ks, Ext.of(S)), last)
        dims = (*d.type.dims[:-1], Aff.lit(S), d.type.dims[-1])
        keep = tuple(range(len(loops) - 1))
        row_dims = dims[:-1]
        partial = Def(
            name=part, type=TensorType(dims, "f32"), loops=loops,
            store=tuple(Aff.of(lp.var) for lp in loops), body=_with_tail(d.body, partial_fold),
            also=(AlsoStore(part_m, TensorType(row_dims, "f32"), keep),
                  AlsoStore(part_l, TensorType(row_dims, "f32"), keep)))
        taken = set(names_in_program(prog)) | {part, part_m, part_l, ks}
        names = []
        for base in ("mx", f"{ks}_max", f"{ks}_acc", f"{ks}_sum"):
            names.append(fresh(base, taken))
            taken.add(names[-1])
        mx, k_max, k_acc, k_sum = names
        row = tuple(Aff.of(lp.var) for lp in outer)

        def at(tensor: str, k: str, full: bool) -> Read:
            return Read(tensor, (*row, Aff.of(k), *((Aff.of(last.var),) if full else ())))

        def weight(k: str) -> Bin:
            return Bin("rescale", at(part_m, k, False), Read(mx, ()))

        num = Reduce("sum", k_acc, Ext.of(S), Bin("*", at(part, k_acc, True), weight(k_acc)))
        den = Reduce("sum", k_sum, Ext.of(S), Bin("*", at(part_l, k_sum, False), weight(k_sum)))
        combine = Let(Binding(mx, (), Reduce("max", k_max, Ext.of(S), at(part_m, k_max, False))),
                      Bin("/", num, den))
        defs = []
        for x in prog.defs:
            if x.name == d.name:
                defs += [partial, replace(d, body=combine)]
            else:
                defs.append(x)
        return replace(prog, defs=tuple(defs), facts=with_chain(prog, part, d.name))


def with_chain(prog: Program, part: str, combine: str) -> tuple[tuple[str, str], ...]:
    """prog's facts with `kernels` naming the partial folds' kernel before the combine's: the
    program is meant to run as a chain of kernels, one per definition (compiler/kernel_chain.py)."""
    facts = dict(prog.facts)
    names = [n for n in facts.get(CHAIN_FACT, "").split(",") if n] or [combine]
    at = names.index(combine) if combine in names else len(names)
    names[at:at] = [part] if combine in names else [part, combine]
    facts[CHAIN_FACT] = ",".join(names)
    return tuple(facts.items())


register(SplitKv())
