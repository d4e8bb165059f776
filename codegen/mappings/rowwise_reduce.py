"""Row reductions for the rowwise printer (codegen/mappings/rowwise.py): a sum or max over the
row (or over a tile buffer of the current tile) as each thread's partial value over its own
columns, then a block reduction; and a gather, a sum whose guard pins its index to integer data,
as one read per row.
"""
from __future__ import annotations

from compiler.ir import Aff, Bin, Const, DataCond, DataRead, Expr, IndexValue, Read, Reduce, Select, Un, walk
from compiler.machine import DTYPES

from ..kir.ir import Kernel
from .cexpr import aff_c, conds_c, data_read_c, float_const_c, index_value_c, unary_c
from .rowwise_plan import fixed_value, refuse


def pins(c: object, var: str, point: DataRead) -> bool:
    """c is the guard `var == point`."""
    return isinstance(c, DataCond) and c.op == "==" and {c.lhs, c.rhs} == {Aff.of(var), point}


def gather_point(e: Reduce) -> DataRead | None:
    """The data D of a sum whose guard pins its index to it (`g == D`, D not reading g): a gather."""
    if e.op != "sum" or not isinstance(e.body, Select) or e.body.other != Const(0.0) or len(e.ext.parts) != 1 \
            or e.ext.parts[0][1] != 1:
        return None
    for c in e.body.conds:
        if isinstance(c, DataCond) and c.op == "==":
            for side in (c.lhs, c.rhs):
                if isinstance(side, DataRead) and e.var not in side.names() and pins(c, e.var, side):
                    return side
    return None


class RowReductions:
    """Mixed into the rowwise printer: row reductions and gathers, printed into self.lines (the
    sweeps, element-wise values, operators and fresh names are the printer's own)."""

    k: Kernel
    names: dict[str, str]
    row: int | None
    row_aff: Aff
    vec: int
    block: int
    tile: tuple[str, int, int] | None
    tilebufs: dict[str, int]
    lines: list[str]
    moved: list[str]
    reductions: list[str]

    def row_reduce(self, e: Reduce) -> str:
        if e.op not in ("sum", "max"):
            raise refuse(f"reduction {e.op}")
        point = gather_point(e)
        if point is not None:
            return self.point_sum(e, point)
        if e.mma is not None:
            raise refuse(f"the row reduction over {e.var} is mapped to {e.mma.instr}")
        n = e.ext.single()[0] if len(e.ext.parts) == 1 and e.ext.parts[0][1] == 1 else None
        spans_row = n is not None and (n == self.row_aff if self.row is None else fixed_value(n, self.k) == self.row)
        n = fixed_value(n, self.k) if n is not None else None
        tile = self.tile is not None and n == self.tile[1] and any(
            isinstance(x, Read) and x.tensor in self.tilebufs for x in walk(e.body))
        if not spans_row and not tile:
            raise refuse(f"the reduction over {e.var} < {e.ext} spans neither the row of {self.row} columns "
                         "nor a tile buffer of the current tile")
        acc = self.fresh("red_")
        init, step = ("0.0f", f"{acc} += v_;") if e.op == "sum" else ("neg_inf()", f"{acc} = fmaxf({acc}, v_);")

        def body() -> list[str]:
            loads, value = self.elementwise(e.body, e.var, tile)
            return loads + ["#pragma unroll", f"for (int j = 0; j < {self.vec}; ++j) {{",
                            f"    const float v_ = {value}; {step}", "}"]

        self.lines.append(f"float {acc} = {init};")
        mark = len(self.moved)
        self.lines += self.sweep(body(), tile) if tile else self.sweep_row(body)
        self.count_pass(mark)
        self.lines.append(f"{acc} = block_{e.op}<{self.block // 32}>({acc}, red_smem_);")
        self.reductions.append(f"{e.op} over {e.var}")
        return acc

    def point_sum(self, e: Reduce, point: DataRead) -> str:
        """A gather: sum(g < E: [g == D && rest] ? v : 0) is v at g = D where D is in [0, E) and
        rest holds there, else 0 — one read of D and of v per row (every thread the same
        addresses), no sweep and no block reduction."""
        assert isinstance(e.body, Select)
        at = self.fresh("pt_")
        inside, value = data_read_c(point, self.names)
        names = {**self.names, e.var: at}
        rest = tuple(c for c in e.body.conds if not pins(c, e.var, point))
        live = f"0 <= {at} && {at} < (long long){aff_c(e.ext.single()[0], self.names)}"
        acc = self.fresh("red_")
        self.lines += [f"const long long {at} = ({inside}) ? {value} : -1LL;",
                       f"float {acc} = 0.0f;",
                       f"if ({live} && {conds_c(rest, names)}) {acc} = {self.point_value(e.body.then, names)};"]
        self.reductions.append(f"gather over {e.var}")
        return acc

    def point_value(self, e: Expr, names: dict[str, str]) -> str:
        """An element-wise value at one point (indices printed by `names`): reads of inputs,
        sizes and indices as values, constants, operators."""
        if isinstance(e, Const):
            return float_const_c(e.value)
        if isinstance(e, Read):
            if e.tensor not in {t.name for t in self.k.inputs} or not e.idx:
                raise refuse(f"the gathered value reads {e.tensor}, not an input")
            dt = DTYPES[self.k.tensor(e.tensor).dtype]
            off = " + ".join(f"(long long){aff_c(a, names)} * {st}" for a, st in zip(e.idx, self.strides(e.tensor)))
            return f"{dt.name}_to_f32(p_{e.tensor}[{off}])"
        if isinstance(e, IndexValue):
            return index_value_c(e.aff, names)
        if isinstance(e, Bin):
            return self.binary(e.op, self.point_value(e.a, names), self.point_value(e.b, names))
        if isinstance(e, Un):
            return unary_c(e.op, self.point_value(e.a, names))
        raise refuse(f"no gathered form for {type(e).__name__}")
