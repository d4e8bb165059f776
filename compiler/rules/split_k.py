"""SPLIT-K (split-K GEMM): a sum's tile loop divided among S splits over a new loop (a grid
axis once PARALLEL maps it), each split writing its partial sum, in f32, to a workspace tensor;
then a combine that adds the S partial sums in split order and applies the definition's
epilogue.

    before:  def C[i, j] = epi(sum(ko < ceil(N/t): body(ko)), reads)
    after:   def C_part[ks, i, j] : f32 = sum(ko < ceil((N − t·ks) / (t·S)): body(S·ko + ks))
             def C[i, j] = epi(sum(ks_ < S: C_part[ks_, i, j]), reads)

Split ks adds the tiles ks, S + ks, 2S + ks, … (strided: with S fixed the tile index stays
affine for every number of tiles).  A split past the last tile (S > tiles, or S not dividing
the tile count) adds nothing and writes 0.  The combine is a program of its own (the second
kernel): a sum over the splits in the fixed order 0, 1, …, S − 1, so a run gives the same bits
every time (no atomics: every partial sum has its own slot in the workspace).

Preconditions: `def` is a plain definition (untiled, unmapped loops, store = its loops, no
guard, no further outputs); its body holds exactly one reduction over `index`, a sum, outside
every other binding form (an element-wise epilogue around it stays in the combine); the sum's
extent is one part ceil(num / div) (TILE's outer loop over ceil(K / t), or an untiled K);
`splits` ≥ 1; the new names are unused.
Theorems (proofs_ci/coq/Rules/SplitK.v, lean/Derivc/Rules/SplitK.lean): sumTo_split_k_strided
(this rule's assignment: Σ_{o < ceil(N/t)} f o = Σ_{s < S} Σ_{o < ceil((N − t·s)/(t·S))} f (S·o + s),
the per-step obligation, instantiated on the step's sums), from sumTo_chunks (a range cut into
S consecutive chunks of any sizes, empty ones included) and sumTo_strided (the residues mod S).
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import (
    Aff, Def, Expr, Ext, Fold, Let, Loop, Program, Read, Reduce, Softmax, TensorType, children, fresh, map_children,
    names_in_program, subst_index,
)
from ..names import name_problem
from ..machine import DEVICE
from . import register
from .base import Facts, Rule, StepParams
from .split_kv import with_chain


class SplitKParams(StepParams):
    def_: str = Field(alias="def")
    """the plain definition holding the sum"""
    index: str
    """the sum's (tile) index divided among the splits"""
    splits: int = Field(le=min(DEVICE.grid_limits))
    """the number of splits S (at least 1; they run as blocks of one grid axis)"""
    split_index: str = "ks"
    """the new loop over the splits"""
    name: str = ""
    """the partial sums' workspace tensor (default: <def>_part)"""
    new_names = ("split_index",)


def _part_name(p: SplitKParams) -> str:
    return p.name or f"{p.def_}_part"


def _sums_over(e: Expr, index: str, inside: bool = False) -> list[tuple[Reduce, bool]]:
    """Every reduction over `index` in e, with whether it sits inside another binding form."""
    out: list[tuple[Reduce, bool]] = []
    if isinstance(e, Reduce) and e.var == index:
        out.append((e, inside))
        inside = True
    elif isinstance(e, (Reduce, Softmax, Fold, Let)):
        inside = True
    for c in children(e):
        out += _sums_over(c, index, inside)
    return out


def _replace_node(e: Expr, site: Expr, new: Expr) -> Expr:
    if e is site:
        return new
    return map_children(e, lambda c: _replace_node(c, site, new))


class SplitK(Rule):
    name = "split_k"
    kind = "SPLIT-K"
    theorem = "sumTo_split_k_strided"
    also = ("sumTo_chunks", "sumTo_strided")
    Params = SplitKParams

    def check(self, prog: Program, p: SplitKParams) -> Facts:
        d = self.get_def(prog, p.def_)
        problem = name_problem(p.name) if p.name else ""
        if problem:
            raise self.fail(f"parameter name: {problem}")
        if p.splits < 1:
            raise self.fail(f"splits must be at least 1 (got {p.splits})")
        self.require_new_name(prog, p.split_index, "split_index")
        self.require_new_name(prog, _part_name(p), "name")
        if d.guard or d.also or d.level != "global" or any(lp.mapping for lp in d.loops) \
                or d.store != tuple(Aff.of(lp.var) for lp in d.loops):
            raise self.fail(f"{d.name} is not a plain statement (untiled, unmapped, unguarded store "
                            f"{d.name}[loops], no further outputs): split before tiling or mapping its loops")
        if not d.loops:
            raise self.fail(f"{d.name} has no loop")
        found = _sums_over(d.body, p.index)
        if len(found) != 1:
            raise self.fail(f"{d.name}'s body has {len(found)} reductions over {p.index}, not one")
        site, nested = found[0]
        if site.op != "sum":
            raise self.fail(f"the reduction over {p.index} is a {site.op}, not a sum (split-K splits sums)")
        if nested:
            raise self.fail(f"the sum over {p.index} sits inside another reduction, fold or let: "
                            "only an element-wise epilogue may surround it")
        if len(site.ext.parts) != 1:
            raise self.fail(f"the sum over {p.index} runs to {site.ext}, a min of several extents")
        if site.acc is not None or site.mma is not None:
            raise self.fail(f"the sum over {p.index} is already mapped (split before cache / map_mma)")
        strided = site.ext.single()[1] == 1  # an untiled sum: split ks adds the indices S·o + ks
        return {"site": site, "splits": p.splits, "tiles": str(site.ext), "partial": _part_name(p),
                "theorem": "sumTo_strided" if strided else "sumTo_split_k_strided",
                "assignment": f"split {p.split_index} adds tiles {p.splits}*{p.index} + {p.split_index}"}

    def rewrite(self, prog: Program, p: SplitKParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        site: Reduce = facts["site"]
        S, ks, ko = p.splits, p.split_index, site.var
        part = _part_name(p)
        (num, div), = site.ext.parts
        # tiles S*ko + ks < ceil(num / div)  <=>  ko < ceil((num - div*ks) / (div*S))
        ext = Ext(((num - Aff.of(ks, div), div * S),))
        tile = Aff.build({ko: S, ks: 1})
        partial_sum = replace(site, ext=ext, body=subst_index(site.body, ko, tile))
        loops = (Loop(ks, Ext.of(S)), *d.loops)
        partial = Def(name=part, type=TensorType((Aff.lit(S), *d.type.dims), "f32"), loops=loops,
                      store=tuple(Aff.of(lp.var) for lp in loops), body=partial_sum)
        taken = set(names_in_program(prog)) | {part, ks}
        k_sum = fresh(f"{ks}_sum", taken)
        row = tuple(Aff.of(lp.var) for lp in d.loops)
        combine_sum = Reduce("sum", k_sum, Ext.of(S), Read(part, (Aff.of(k_sum), *row)))
        combine = replace(d, body=_replace_node(d.body, site, combine_sum))
        defs: list[Def] = []
        for x in prog.defs:
            defs += [partial, combine] if x.name == d.name else [x]
        return replace(prog, defs=tuple(defs), facts=with_chain(prog, part, d.name))


register(SplitK())
