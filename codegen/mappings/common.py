"""Matching helpers shared by the tensor-core mappings.

A tensor-core printer implements one meaning (a contraction over staged tiles, the ONLINE-AGG
fold).  It accepts a kernel IR only after reading every part of it off the kernel IR and
comparing it with the meaning it implements; what it cannot account for is refused with
`UnsupportedMapping` naming the part.  Nothing here guesses from names.
"""
from __future__ import annotations

from compiler.ir import Aff, Cond, Const, Expr, Read, Select

from ..kir.ir import Kernel
from ..source import KernelSource, Launch
from ..kir.lower import UnsupportedMapping
from .plan import GridAxis, Operand


def refuse(mapping: str, what: str) -> UnsupportedMapping:
    return UnsupportedMapping(f"{mapping} mapping: {what}")


def size_name(a: Aff, mapping: str, what: str) -> str:
    if len(a.terms) != 1 or a.terms[0][1] != 1 or a.const:
        raise refuse(mapping, f"{what}: dimension {a} is not a plain size name")
    return a.terms[0][0]


def operand(k: Kernel, name: str, level: str, mapping: str) -> Operand:
    t = k.tensor(name)
    return Operand(name, tuple(size_name(a, mapping, f"tensor {name}") for a in t.dims), t.dtype, level)


def tile_coord(a: Aff, grid_vars: set[str], local: str | None, mapping: str, what: str) -> tuple[str, int]:
    """a == tile * g + local for one grid or loop variable g: returns (g, tile)."""
    rest = a
    if local is not None:
        if a.coef(local) != 1:
            raise refuse(mapping, f"{what}: index {a} does not run over {local} with stride 1")
        rest = a - Aff.of(local)
    if rest.const or len(rest.terms) != 1 or rest.terms[0][0] not in grid_vars:
        raise refuse(mapping, f"{what}: index {a} is not tile * block index + {local or 'offset'}")
    g, t = rest.terms[0]
    return g, t


def staged(e: Expr) -> tuple[tuple[Cond, ...], Read]:
    """[conds] ? T[idx] : 0, or a plain read: the guard and the global read of a staged copy."""
    if isinstance(e, Select) and e.other == Const(0.0) and isinstance(e.then, Read):
        return e.conds, e.then
    if isinstance(e, Read):
        return (), e
    raise UnsupportedMapping(f"staged value is not a (zero-filled) tensor read: {e}")


def grid_axes(k: Kernel, tiles: dict[str, tuple[str, int]],
              literal: dict[str, int] | None = None) -> tuple[GridAxis, ...]:
    """GridAxis per grid variable: the size it enumerates (tiles: var -> (size, tile); literal:
    the value of a size name that stands for a literal dimension, split-K's splits)."""
    out = []
    for g in k.grid:
        if g.var not in tiles:
            raise UnsupportedMapping(f"grid variable {g.var} does not index the output")
        dim, tile = tiles[g.var]
        want = g.ext.parts[0] if len(g.ext.parts) == 1 else None
        size = Aff.lit(literal[dim]) if literal and dim in literal else Aff.of(dim)
        if want is None or want != (size, tile):
            raise UnsupportedMapping(f"grid variable {g.var} < {g.ext} does not enumerate tiles of {tile} over {dim}")
        out.append(GridAxis(g.var, dim, tile, g.axis))
    return tuple(out)


def bound_cond(c: Cond, var_tile: tuple[str, int] | Aff, local: str) -> str | None:
    """If c is `tile * g + local < SIZE` (either side order kept), the size name; else None.
    var_tile: (g, tile), or the tile's first position as an affine expression (a split-K tile
    S·tile·ko + tile·ks)."""
    base = var_tile if isinstance(var_tile, Aff) else Aff.of(var_tile[0], var_tile[1])
    if not isinstance(c, Cond) or c.op != "<" or c.lhs != base + Aff.of(local):
        return None
    r = c.rhs
    if len(r.terms) == 1 and r.terms[0][1] == 1 and not r.const:
        return r.terms[0][0]
    return None


def launch_of(k: Kernel, ks: KernelSource, extras: tuple[str, ...] = ()) -> Launch:
    """The launch of a printed kernel: grid from the kernel IR, block and shared memory from the
    source, arguments in the kernel IR's order (tensors, dynamic sizes, then `extras`)."""
    return Launch(tuple((g.axis, g.ext) for g in k.grid), ks.threads, ks.smem_bytes,
                  tuple(t.name for t in k.tensors), k.dynamic(), extras)
