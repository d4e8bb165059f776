"""MAP-MMA (D6): compute an inner tile product with tensor-core fragments.

    before:  sum(ki < 32: A_s[ii, ki] * B_s[ki, ji])
    after:   sum(ki < 32 @{mma mma_sync 16x8x16}: A_s[ii, ki] * B_s[ki, ji])

Meaning unchanged: the fragment product is the same sum, grouped in k-chunks of 16.
Preconditions: a sum whose body (under an optional zero-guard) is a product a·b; b reads a
staged tile (or input) with the summed index k in one position and one other index n; a is
such a read too (index m) or a tile computed in registers (FA2's P fed to the P·V product —
then `m` names the row loop; a product written computed-times-read, the backward's dO·P, takes
the read as B: multiplication commutes); operands are f16 or bf16 and of one dtype; the extents of m, n
and k are fixed multiples of the instruction shape (mma_sync m16n8k16; wgmma m64nNk16 with
N ≤ 256).  The accumulator is f32 in registers.

Packed rows (grouped-query decode: the G query heads of one K / V head in one tile): the A
operand may read several row indices, all loops of the definition with fixed extents, e.g.
Q_r[g, ii, e]; the instruction's rows are then their row-major product (row g·T + ii), whose
extent must be the multiple of the shape (`m: [g, ii]` names them for a computed A operand):

    before:  sum(e < 128: Q_r[g, ii, e] * K_s[c, e])                     g < 4, ii < 4
    after:   sum(e < 128 @{mma mma_sync 16x8x16}: Q_r[g, ii, e] * K_s[c, e])   rows g·4 + ii

The value of each (g, ii, c) element is the same k-sum (the rows of an mma are independent), so
the theorem and obligation are the same; the facts record the packed rows (`rows`), which the
printers read off the kernel IR's lanes and staged Q tile.
Theorem: mma_tile (lean/Derivc/Rules/MapMma.lean, proofs_ci/coq).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import Field

from ..ir import AccFact, Binding, Bin, Const, Def, Expr, Fold, Let, MmaFact, Program, Read, Reduce, Select, walk
from . import register
from .assoc import hoist_guards
from .base import Facts, Rule, StepParams, const_extent, find_binder, replace_node

SHAPES = {"mma_sync": (16, 8, 16), "wgmma": (64, 8, 16)}


class MapMmaParams(StepParams):
    def_: str = Field(alias="def")
    """the definition holding the tile product"""
    index: str
    """the summed index of the inner tile product (e.g. ki) to run on tensor cores"""
    instr: Literal["mma_sync", "wgmma"] = "mma_sync"
    """the tensor-core instruction: mma_sync (m16n8k16, sm_80+) or wgmma (m64nNk16, Hopper)"""
    m: str | tuple[str, ...] | None = None
    """the row loop of an operand computed in registers (FA2's P in P·V), when no read names it; a list of loops for packed rows (their row-major product, e.g. [g, ii])"""


class MapMma(Rule):
    name = "map_mma"
    kind = "MAP-MMA"
    theorem = "mma_tile"
    Params = MapMmaParams

    def check(self, prog: Program, p: MapMmaParams) -> Facts:
        d = self.get_def(prog, p.def_)
        self.require_index(d, p.index, "index")
        m_named = (p.m,) if isinstance(p.m, str) else p.m
        for v in m_named or ():
            self.require_index(d, v, "m")
        node = find_binder(d, p.index)
        if not isinstance(node, Reduce) or node.op != "sum":
            raise self.fail(f"index {p.index} of {p.def_} is not a sum")
        if node.mma is not None:
            raise self.fail(f"the sum over {p.index} is already mapped")
        bm, bn, bk = SHAPES[p.instr]
        extents, buffers = self._scope_info(prog, d)
        k_ext = const_extent(prog, node.ext)
        if k_ext is None or k_ext % bk:
            raise self.fail(f"the extent {node.ext} of {p.index} is not a fixed multiple of {bk} (tile it first)")
        body = hoist_guards(node.body)
        if isinstance(body, Select) and body.other == Const(0.0):
            body = body.then
        if not (isinstance(body, Bin) and body.op == "*"):
            raise self.fail(f"the sum over {p.index} is not a product of two operands")
        a, b = body.a, body.b
        if self._computed(b, buffers) and not self._computed(a, buffers):
            a, b = b, a  # a·b = b·a: the staged read is the B operand (dV's dO[i, d] * P[i, j])
        b_info = self._operand(prog, b, p.index, buffers, "B")
        if b_info["computed"]:
            raise self.fail("the B operand must be read from a staged tile or an input")
        a_info = self._operand(prog, a, p.index, buffers, "A")
        rows = a_info["rows"] or m_named
        if a_info["computed"] and a_info["rows"] and len(a_info["rows"]) > 1:
            rows = m_named  # a register tile read at several indices: its rows are the ones m names
        if rows is None:
            raise self.fail("the A operand is computed in registers; name its row loop with m")
        if len(b_info["rows"]) != 1:
            raise self.fail(f"operand B {b_info['tensor']} must have exactly one index besides {p.index}, "
                            f"has {list(b_info['rows'])}")
        n_var = b_info["rows"][0]
        dtypes = {x["dtype"] for x in (a_info, b_info) if x["dtype"]}
        if len(dtypes) != 1 or not dtypes <= {"f16", "bf16"}:
            raise self.fail(f"tensor cores need f16 or bf16 operands of one dtype, found {sorted(dtypes) or ['f32']}")
        if len(rows) > 1:
            self._check_packed(d, rows, extents, p.instr)
        m_ext = 1
        for var in rows:
            if extents.get(var) is None:
                raise self.fail(f"the m index {var} has no fixed extent")
            m_ext *= extents[var]
        m_var = "*".join(rows)
        extents = {**extents, m_var: m_ext}
        for var, need, role in ((m_var, bm, "m"), (n_var, bn, "n")):
            n = extents.get(var)
            if n is None:
                raise self.fail(f"the {role} index {var} has no fixed extent")
            if n % need:
                raise self.fail(f"the {role} extent {n} of {var} is not a multiple of {need} for {p.instr}")
        if p.instr == "wgmma" and extents[n_var] > 256:
            raise self.fail(f"wgmma's n is at most 256, {n_var} has {extents[n_var]}")
        return {
            "instr": p.instr, "shape": f"m{bm}n{bn}k{bk}", "m": m_var, "n": n_var, "k": p.index,
            "tile": [extents[m_var], extents[n_var], k_ext], "dtype": dtypes.pop(),
            "a_operand": "registers (computed)" if a_info["computed"] else a_info["tensor"],
            "b_operand": b_info["tensor"], "site": node, **({"rows": list(rows)} if len(rows) > 1 else {}),
        }

    def _check_packed(self, d: Def, rows: tuple[str, ...], extents: dict[str, int | None], instr: str) -> None:
        """Packed rows: loops of the definition, in loop-nest order (the row-major order of the
        packed row), on mma.sync (wgmma's 64-row warpgroup tiles are not packed)."""
        if instr != "mma_sync":
            raise self.fail(f"packed rows {list(rows)} are implemented on mma_sync only")
        order = [lp.var for lp in d.loops]
        for v in rows:
            if v not in order:
                raise self.fail(f"the packed row index {v} is not a loop of {d.name}")
        if [v for v in order if v in rows] != list(rows):
            raise self.fail(f"the packed rows {list(rows)} are not in the loop-nest order of {d.name}")

    def _scope_info(self, prog: Program, d: Def) -> tuple[dict[str, int | None], dict[str, Binding]]:
        extents: dict[str, int | None] = {lp.var: const_extent(prog, lp.ext) for lp in d.loops}
        buffers: dict[str, Binding] = {}
        for e in walk(d.body):
            if isinstance(e, Reduce):
                extents[e.var] = const_extent(prog, e.ext)
            binds = [e.bind] if isinstance(e, Let) else list(e.binds) if isinstance(e, Fold) else []
            for bnd in binds:
                buffers[bnd.name] = bnd
                for v, x in bnd.dims:
                    extents[v] = const_extent(prog, x)
        return extents, buffers

    def _computed(self, e: Expr, buffers: dict[str, Binding]) -> bool:
        return not isinstance(e, Read) or (e.tensor in buffers and not buffers[e.tensor].source)

    def _operand(self, prog: Program, e: Expr, k: str, buffers: dict[str, Binding], role: str) -> dict:
        if not isinstance(e, Read):
            return {"computed": True, "rows": None, "dtype": None, "tensor": None}
        pos = [i for i, a in enumerate(e.idx) if a.coef(k)]
        if len(pos) != 1 or e.idx[pos[0]].coef(k) != 1:
            raise self.fail(f"operand {role} {e.tensor} must use {k} in exactly one position with stride 1")
        others = [a.names() - {k} for a in e.idx if a.names() - {k}]
        if any(len(o) != 1 for o in others):
            raise self.fail(f"operand {role} {e.tensor} reads an index combining several loops: {list(map(str, e.idx))}")
        others = tuple(next(iter(o)) for o in others)  # one row index per position, in position order
        if e.tensor in buffers:
            bnd = buffers[e.tensor]
            if not bnd.source:
                return {"computed": True, "rows": others or None, "dtype": None, "tensor": e.tensor}
            dtype = prog.tensor_type(bnd.source).dtype
        else:
            dtype = prog.tensor_type(e.tensor).dtype
        if not others or len(set(others)) != len(others):
            raise self.fail(f"operand {role} {e.tensor} must have row indices besides {k}, each once, has {list(others)}")
        return {"computed": False, "rows": others, "dtype": dtype, "tensor": e.tensor}

    def rewrite(self, prog: Program, p: MapMmaParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        node: Reduce = facts["site"]
        bm, bn, bk = SHAPES[p.instr]
        new = replace(node, mma=MmaFact(p.instr, bm, bn, bk), acc=node.acc or AccFact("register", "f32"))
        return prog.with_def(replace(d, body=replace_node(d.body, node, new)))


register(MapMma())
