"""TILE: split one index into an outer tile index and an inner offset, i = T·io + ii.

On a reduction (sum or max):

    before:  sum(k < K: body[k])
    after:   sum(ko < ceil(K/T): sum(ki < T: [T*ko + ki < K] ? body[T*ko + ki] : 0))

On a loop of a definition (a Gen): the loop `i < N` becomes `io < ceil(N/T), ii < T` in the
same place, the store index and the body read `T*io + ii`, and the store gets the guard
`T*io + ii < N`.  The guard is left out only when N is a fixed size divisible by T; with
`guard: false` the step demands that (dynamic sizes can never be assumed divisible).

Theorems: sumTo_tile_guard / maxTo_tile_guard (reductions), gen_tile (loops) — lean/Derivc/
Rules/Tile.lean and proofs_ci/coq.  Names `outer`/`inner` default to `<i>o` / `<i>i`.
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..errors import StepInputError
from ..names import ALL_RESERVED
from ..spec import MAX_SIZE
from ..ir import Aff, Cond, Const, Ext, Loop, Program, Reduce, names_in_program, fresh, subst_index
from . import register
from .base import Facts, Rule, StepParams, const_extent, find_binder, guarded, replace_node


class TileParams(StepParams):
    def_: str = Field(alias="def")
    """the definition whose loop or reduction is tiled"""
    index: str
    """the loop or summed / maxed index to split into outer * size + inner"""
    size: int = Field(ge=1, le=MAX_SIZE)
    """the tile size (at most the largest size: 32-bit indices)"""
    guard: bool | None = None
    """omitted: guard exactly when needed; false: demand that size divides a fixed extent"""
    outer: str | None = None
    """the tile index's name (default: <index>o)"""
    inner: str | None = None
    """the offset's name (default: <index>i)"""
    new_names = ("outer", "inner")


class Tile(Rule):
    name = "tile"
    kind = "TILE"
    theorem = "sumTo_tile_guard"
    also = ("maxTo_tile_guard", "gen_tile", "tile_cover", "tile_inj")
    Params = TileParams

    def check(self, prog: Program, p: TileParams) -> Facts:
        d = self.get_def(prog, p.def_)
        self.require_index(d, p.index, "index")
        loop = next((lp for lp in d.loops if lp.var == p.index), None)
        node = None if loop else find_binder(d, p.index)
        if loop is None and not isinstance(node, Reduce):
            what = "a fold" if node is not None else "not bound in it"
            raise self.fail(f"index {p.index} of {p.def_} is {what}: TILE applies to a loop or a sum/max reduction")
        if node is not None and node.mma is not None:
            raise self.fail(f"the sum over {p.index} is mapped to tensor cores; tile before MAP-MMA")
        ext = loop.ext if loop else node.ext
        if len(ext.parts) != 1:
            raise self.fail(f"extent of {p.index} is {ext}, a min of several bounds; tile before truncating")
        if loop is not None and loop.mapping is not None:
            raise self.fail(f"loop {p.index} is already mapped to {loop.mapping}; tile before PARALLEL")
        n = const_extent(prog, ext)
        divides = n is not None and n % p.size == 0
        if p.guard is False and not divides:
            why = f"{ext} is dynamic" if n is None else f"{p.size} does not divide {ext} = {n}"
            raise self.fail(f"tile size {p.size} of {p.index} needs a guard ({why}) but guard: false was given")
        if n is not None and p.size > n:  # bad input, not a failed derivation: the extent is known
            raise StepInputError(self.name, f"parameter size: tile size {p.size} exceeds the extent {ext} = {n} "
                                            f"of {p.index} (a tile is at most the extent it tiles)")
        taken = names_in_program(prog)
        avoid = taken | ALL_RESERVED  # a default name must not be a keyword either (d → do)
        outer = p.outer or fresh(p.index + "o", avoid)
        inner = p.inner or fresh(p.index + "i", avoid | {outer})
        for field, nm in (("outer", outer), ("inner", inner)):
            if nm in taken:
                raise self.unknown(f"parameter {field}: name {nm} is already used in the program")
        if outer == inner:
            raise self.unknown("parameters outer and inner: the names must differ")
        return {
            "target": "loop" if loop else f"{node.op} reduction",
            "extent": str(ext),
            "extent_value": n,
            "divisible": divides,
            "guarded": not divides,
            "outer": outer,
            "inner": inner,
            "theorem": "gen_tile" if loop else ("sumTo_tile_guard" if node.op == "sum" else "maxTo_tile_guard"),
            "site": node,
        }

    def rewrite(self, prog: Program, p: TileParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        outer, inner, t = facts["outer"], facts["inner"], p.size
        j = Aff.build({outer: t, inner: 1})
        if facts["target"] == "loop":
            loops: list[Loop] = []
            ext = None
            for lp in d.loops:
                if lp.var == p.index:
                    ext = lp.ext
                    num, div = lp.ext.single()
                    loops += [Loop(outer, Ext(((num, div * t),))), Loop(inner, Ext.of(t))]
                else:
                    loops.append(lp)
            num, div = ext.single()
            guard = d.guard
            if facts["guarded"]:
                guard = guard + (Cond(j, "<", num) if div == 1 else Cond(j.scale(div), "<", num),)
            return prog.with_def(
                replace(
                    d,
                    loops=tuple(loops),
                    store=tuple(a.subst(p.index, j) for a in d.store),
                    guard=tuple(c.subst(p.index, j) for c in guard),
                    body=subst_index(d.body, p.index, j),
                )
            )
        node: Reduce = facts["site"]
        num, div = node.ext.single()
        body = subst_index(node.body, p.index, j)
        if facts["guarded"]:
            neutral = Const(0.0) if node.op == "sum" else Const(float("-inf"))
            bound = Cond(j, "<", num) if div == 1 else Cond(j.scale(div), "<", num)
            body = guarded((bound,), body, neutral)
        inner_r = Reduce(node.op, inner, Ext.of(t), body)
        outer_r = Reduce(node.op, outer, Ext(((num, div * t),)), inner_r, acc=node.acc)
        return prog.with_def(replace(d, body=replace_node(d.body, node, outer_r)))


register(Tile())
