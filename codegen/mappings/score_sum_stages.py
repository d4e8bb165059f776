"""The order in which a score-sum printer can form the element-wise values when it waits for the
score tiles one by one (one wgmma group each, issued in order): what each value, each term and
each input read needs first.  Orders only: every value is the kernel IR's, read as it is."""
from __future__ import annotations

from dataclasses import dataclass

from compiler.ir import Expr, Read, Reduce, children, walk
from compiler.printer import show_expr


def last_group(e: Expr, group: dict[Reduce, int]) -> int:
    """The last score tile group `e` reads (-1: none)."""
    return max((group[x] for x in walk(e) if isinstance(x, Reduce) and x in group), default=-1)


def early_terms(values: tuple[Expr, ...], group: dict[Reduce, int]) -> tuple[Expr, ...]:
    """The largest sub-expressions of each value that hold a score sum and read only score tiles of
    an earlier group than the value's last one (P = exp(S - LSE) inside dS = P (dP - D) when S is
    issued before dP): a printer may compute them as soon as those tiles have landed."""
    found: set[Expr] = set()

    def visit(e: Expr, bound: int) -> None:
        g = last_group(e, group)
        if g < 0:
            return
        if g < bound and not isinstance(e, Reduce):
            found.add(e)
            return
        for c in children(e):
            visit(c, bound)

    for v in values:
        visit(v, last_group(v, group))
    return tuple(sorted(found, key=show_expr))


@dataclass(frozen=True)
class StagedRead:
    """An input read of the values that varies along one axis of the score tile only (LSE, Dsum:
    per column of the dV / dK tile, per row of the dQ tile): a printer may load it once per row or
    column, ahead of the score tile group `first` it is first needed with."""

    read: Read
    axis: str  # "row" | "col"
    first: int
    invariant: bool  # the same at every tile of the loop (dQ's LSE, Dsum: per row of the block)


def staged_reads(exprs: tuple[Expr, ...], groups: tuple[int, ...], row: str, col: str,
                 loop: str) -> tuple[StagedRead, ...]:
    """The reads of `exprs` (the terms and values, formed at score tile groups `groups`) indexed by
    the tile's row or its column but not both, each with the first group that needs it and whether
    its index leaves the tile `loop` out."""
    first: dict[Read, int] = {}

    def visit(e: Expr, g: int) -> None:  # not into the score sums (their tiles are the wgmmas' operands)
        if isinstance(e, Read):
            first[e] = min(first.get(e, g), g)
        elif not isinstance(e, Reduce):
            for c in children(e):
                visit(c, g)

    for e, g in zip(exprs, groups):
        visit(e, g)
    out = []
    for r, g in first.items():
        names = frozenset().union(*(a.names() for a in r.idx))
        if (row in names) != (col in names):
            out.append(StagedRead(r, "row" if row in names else "col", max(g, 0), loop not in names))
    return tuple(sorted(out, key=lambda s: show_expr(s.read)))
