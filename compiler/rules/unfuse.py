"""UNFUSE (inverse of FUSE): materialise a reduction of a definition as its own definition.

    before:  def O[i, d] = sum(j < N: e[i, j, d]) / sum(j2 < N: g[i, j2])
    after:   def L[i] = sum(j2 < N: g[i, j2])
             def O[i, d] = sum(j < N: e[i, j, d]) / L[i]

The reduction may use untiled loop indices of the definition and the indices of enclosing
reductions of a plain extent (sizes only: a fixed number of partial sums), so the new definition
loops over exactly those, the enclosing reductions' indices first (outermost first), then the
definition's loops in their order (its fastest loop stays the fastest dimension):

    before:  def dW[c] = sum(ri < 64: sum(ro < ceil(R/64): e[64*ro + ri, c]))
    after:   def P[ri, c] = sum(ro < ceil(R/64): e[64*ro + ri, c])
             def dW[c] = sum(ri < 64: P[ri, c])

(a column sum split into 64 strided partial sums, each its own element: tile, reorder, unfuse).
Any other enclosing binding form (a fold, a softmax, a let) is refused.  The new definition is
placed before the definition it came from, in global memory.
Theorem: gen_inline, read right to left (lean/Derivc/Rules/Fuse.lean, proofs_ci/coq).
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import Aff, Def, Loop, Program, Read, Reduce, TensorType, free_indices
from . import register
from .base import Facts, Rule, StepParams, enclosing_binders, find_binder, replace_node


class UnfuseParams(StepParams):
    def_: str = Field(alias="def")
    """the definition holding the reduction"""
    index: str
    """the reduced index of the sum to materialise"""
    name: str
    """the new definition's name"""
    new_names = ("name",)


class Unfuse(Rule):
    name = "unfuse"
    kind = "FUSE"
    theorem = "gen_inline"
    Params = UnfuseParams

    def check(self, prog: Program, p: UnfuseParams) -> Facts:
        d = self.get_def(prog, p.def_)
        self.require_index(d, p.index, "index")
        node = find_binder(d, p.index)
        if not isinstance(node, Reduce):
            raise self.fail(f"index {p.index} of {p.def_} is not a sum/max reduction")
        self.require_new_name(prog, p.name, "name")
        used = free_indices(node)
        sizes = {n for n, _ in prog.sizes}
        partials = []  # enclosing reductions whose index the reduction uses: dimensions of the new definition
        for outer in enclosing_binders(d.body, node):
            if not isinstance(outer, Reduce):
                raise self.fail(f"the reduction over {p.index} sits inside a {type(outer).__name__.lower()}; only "
                                "a top-level reduction or one inside reductions can be materialised")
            if outer.var not in used:
                continue
            ext = outer.ext
            if len(ext.parts) != 1 or ext.parts[0][1] != 1 or not ext.names() <= sizes:
                raise self.fail(f"the reduction uses index {outer.var} of an enclosing reduction of extent {ext}, "
                                "not a plain size expression (a dimension of the new definition)")
            partials.append(Loop(outer.var, ext))
        loops = [lp for lp in d.loops if lp.var in used]
        plain = {str(a) for a in d.store}
        for lp in loops:
            if lp.var not in plain or lp.mapping is not None:
                raise self.fail(f"the reduction uses loop {lp.var}, which is tiled or mapped; unfuse before tiling")
        stray = used - {lp.var for lp in loops} - {lp.var for lp in partials} - sizes
        if stray:
            raise self.fail(f"the reduction uses indices {sorted(stray)} that are not loops of {p.def_}")
        dims = tuple(lp.ext.single()[0] for lp in partials + loops)
        return {"loops": [lp.var for lp in loops], "partials": [lp.var for lp in partials],
                "shape": [str(x) for x in dims], "site": node, "partial_loops": tuple(partials)}

    def rewrite(self, prog: Program, p: UnfuseParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        node: Reduce = facts["site"]
        loops = facts["partial_loops"] + tuple(lp for lp in d.loops if lp.var in facts["loops"])
        new = Def(
            name=p.name,
            type=TensorType(tuple(lp.ext.single()[0] for lp in loops), prog.intermediate_dtype()),
            loops=loops,
            store=tuple(Aff.of(lp.var) for lp in loops),
            body=node,
        )
        read = Read(p.name, tuple(Aff.of(lp.var) for lp in loops))
        consumer = replace(d, body=replace_node(d.body, node, read))
        defs = []
        for x in prog.defs:
            if x.name == d.name:
                defs += [new, consumer]
            else:
                defs.append(x)
        return replace(prog, defs=tuple(defs))


register(Unfuse())
