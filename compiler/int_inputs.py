"""Values of integer inputs (dtype i32) for the numeric checks and the kernel checks.

An integer input is read only as data of a condition (a DataCond): a gathered index
(`X[r, T[r]]`, the guard `g == T[r]` of a sum over g < E) or a document id
(`Doc[b, i] == Doc[b, j]`).  Its draw is chosen from that use, so that every check meets the
cases that matter:

- a gather target draws uniformly in [-1, E]: both ends in range (0 and E - 1) and both
  neighbours out of range (-1 and E, which gather nothing);
- any other integer input draws document ids: along its last dimension, nondecreasing runs of
  random lengths 1 to 4 (documents of length 1 included) starting at 0.

The values are float64 arrays of integers (exact below 2^53), as the interpreters read them.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .ir import Aff, DataCond, DataRead, Ext, Program, Reduce, Select, Softmax, walk

DOC_RUN = 4  # the longest document of a drawn document-id input


def is_int(prog: Program, name: str) -> bool:
    return prog.tensor_type(name).dtype == "i32"


def gather_extents(prog: Program) -> dict[str, Ext]:
    """For each integer input compared with a reduced index (`g == T[r]` in a sum over g), the
    extent of that index: the range its values index."""
    out: dict[str, Ext] = {}
    for d in prog.defs:
        for e in walk(d.body):
            conds = e.body.conds if isinstance(e, Reduce) and isinstance(e.body, Select) else \
                e.mask if isinstance(e, Softmax) else ()
            var = e.var if isinstance(e, (Reduce, Softmax)) else ""
            for c in conds:
                if isinstance(c, DataCond):
                    for side, other in ((c.lhs, c.rhs), (c.rhs, c.lhs)):
                        if isinstance(side, DataRead) and other == Aff.of(var):
                            out.setdefault(side.tensor, e.ext)
    return out


def draw_int(shape: tuple[int, ...], extent: int | None, rng: np.random.Generator) -> np.ndarray:
    """One integer input's values: targets in [-1, extent] when it is gathered by an index of
    that extent, else document ids (nondecreasing runs along the last dimension)."""
    if extent is not None:
        return rng.integers(-1, extent + 1, size=shape).astype(np.float64)
    if not shape or shape[-1] == 0:
        return np.zeros(shape)
    starts = rng.integers(0, DOC_RUN, size=shape) == 0  # a new document with probability 1/DOC_RUN
    starts[..., 0] = False
    return np.cumsum(starts, axis=-1).astype(np.float64)


def int_input(prog: Program, name: str, shape: tuple[int, ...], sizes: Mapping[str, int],
              rng: np.random.Generator) -> np.ndarray:
    ext = gather_extents(prog).get(name)
    return draw_int(shape, None if ext is None else ext.evaluate(sizes), rng)


def span_holds(query: np.ndarray, row_axes: tuple[int, ...], key: np.ndarray, tile: np.ndarray,
               size: int) -> np.ndarray:
    """A DataSpan's value (compiler.ir_index.DataSpan), vectorised: `query` holds the query
    values with the private row variables on `row_axes`, `key` the key values with the key
    position on the last axis (both NaN where a read leaves its tensor), `tile` the key tile;
    the leading axes broadcast together.  True where the tile lies in the span."""
    lo_v = np.where(np.isnan(query), np.inf, query).min(axis=row_axes, initial=np.inf)
    hi_v = np.where(np.isnan(query), -np.inf, query).max(axis=row_axes, initial=-np.inf)
    hit = (lo_v[..., None] <= key) & (key <= hi_v[..., None])  # NaN compares false
    pos = np.arange(key.shape[-1])
    first = np.where(hit, pos, key.shape[-1]).min(axis=-1, initial=key.shape[-1])
    last = np.where(hit, pos, -1).max(axis=-1, initial=-1)
    lo, hi = first // size, np.where(last >= 0, last // size + 1, 0)
    return (lo <= tile) & (tile < hi)


def sequence_ids(cu_seqlens: np.ndarray) -> np.ndarray:
    """The sequence-id tensor of packed variable-length sequences from their offsets (the
    `cu_seqlens` form: [0, n0, n0 + n1, ..., T], S + 1 entries): Seq[t] = s for
    cu_seqlens[s] <= t < cu_seqlens[s + 1], int32, T entries (what the varlen examples take as Seq;
    a sequence of length 0 takes no token).  ValueError for offsets that do not start at 0 or
    decrease."""
    off = np.asarray(cu_seqlens).astype(np.int64).ravel()
    if off.size == 0 or off[0] != 0 or (np.diff(off) < 0).any():
        raise ValueError("cu_seqlens must start at 0 and never decrease (the packed sequences' offsets)")
    return np.repeat(np.arange(off.size - 1, dtype=np.int32), np.diff(off))
