"""The float64 interpreter's array arithmetic for contractions: a sum of products over one axis
as a batched matrix product (`_matmul_sum`, run on the calling thread in BLAS-sized blocks), with
IEEE's NaN / ±inf rules restored where an operand is not finite (`_nonfinite_sum`)."""
from __future__ import annotations

import numpy as np

from .ir import Bin, Cond, Const, Expr, Select


def _axes(a: np.ndarray) -> frozenset[int]:
    return frozenset(i for i, n in enumerate(a.shape) if n != 1)


def _matmul_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ over the last axis of a·b (broadcast), through a batched matrix product."""
    d = a.ndim - 1
    k = max(a.shape[-1], b.shape[-1])
    a = np.broadcast_to(a, a.shape[:-1] + (k,))
    b = np.broadcast_to(b, b.shape[:-1] + (k,))
    batch = [i for i in range(d) if a.shape[i] > 1 and b.shape[i] > 1]
    only_a = [i for i in range(d) if a.shape[i] > 1 and b.shape[i] == 1]
    only_b = [i for i in range(d) if b.shape[i] > 1 and a.shape[i] == 1]
    rest_a = [i for i in range(d) if i not in batch and i not in only_a]
    rest_b = [i for i in range(d) if i not in batch and i not in only_b]
    size = lambda x, axes: int(np.prod([x.shape[i] for i in axes]))  # noqa: E731
    nb, na, nob = size(a, batch), size(a, only_a), size(b, only_b)
    am = a.transpose(batch + only_a + rest_a + [d]).reshape(nb, na, k)
    bm = b.transpose(batch + [d] + only_b + rest_b).reshape(nb, k, nob)
    c = _batched_matmul(am, bm)
    perm = batch + only_a + only_b
    full = [a.shape[i] if i in batch or i in only_a else b.shape[i] for i in perm]
    c = c.reshape(full).transpose(np.argsort(perm))
    return c.reshape(tuple(a.shape[i] if (i in batch or i in only_a) else b.shape[i] if i in only_b else 1
                           for i in range(d)))


# OpenBLAS runs a dgemm whose m·n·k is below this on the calling thread; larger ones wake its
# thread pool, which on a loaded machine (or beside other test workers) costs more than it saves.
_SERIAL_GEMM = 4 * 65536


def _batched_matmul(am: np.ndarray, bm: np.ndarray) -> np.ndarray:
    """(b, m, k) @ (b, k, n) in float64, through BLAS in blocks it runs on this thread."""
    _, m, k = am.shape
    n = bm.shape[2]
    if m == 1 or n == 1 or 4 * k > _SERIAL_GEMM:
        return np.einsum("bik,bkj->bij", am, bm)
    cols = min(n, max(2, _SERIAL_GEMM // (2 * k)))
    rows = min(m, max(2, _SERIAL_GEMM // (k * cols)))
    if rows == m and cols == n:
        return np.matmul(am, bm)
    out = np.empty(am.shape[:2] + (n,))
    for r in range(0, m, rows):
        for c in range(0, n, cols):
            out[:, r:r + rows, c:c + cols] = np.matmul(am[:, r:r + rows], bm[:, :, c:c + cols])
    return out


def _nonfinite_sum(
    a: np.ndarray, b: np.ndarray, keep_a: np.ndarray, keep_b: np.ndarray, fin_a: np.ndarray, fin_b: np.ndarray
) -> np.ndarray:
    """Σ over the last axis of (keep_a·keep_b ? a·b : 0) when an operand is NaN or ±inf somewhere.

    The finite terms are contracted as usual; which sums the other terms make NaN, +inf or
    -inf follows from IEEE products (NaN·x and ±inf·0 are NaN, ±inf·x carries the sign of
    the product) and sums (+inf + -inf is NaN), each an "exists k" counted by a contraction of
    indicator arrays.
    """
    out = _matmul_sum(np.where(fin_a, a, 0.0), np.where(fin_b, b, 0.0))

    def exists(x: np.ndarray, y: np.ndarray) -> np.ndarray | bool:
        if not (x.any() and y.any()):
            return False
        return _matmul_sum(x.astype(np.float64), y.astype(np.float64)) > 0

    nan_a, nan_b = np.isnan(a), np.isnan(b)
    pinf_a, ninf_a, pinf_b, ninf_b = a == np.inf, a == -np.inf, b == np.inf, b == -np.inf
    inf_a, inf_b = pinf_a | ninf_a, pinf_b | ninf_b
    zero_a, zero_b = (a == 0) & keep_a, (b == 0) & keep_b
    pos_a, neg_a, pos_b, neg_b = a > 0, a < 0, b > 0, b < 0
    nan = (exists(nan_a, keep_b) | exists(keep_a, nan_b)
           | exists(inf_a, zero_b) | exists(zero_a, inf_b))
    pinf = (exists(pinf_a, pos_b) | exists(ninf_a, neg_b)
            | exists(pos_a, pinf_b) | exists(neg_a, ninf_b))
    ninf = (exists(pinf_a, neg_b) | exists(ninf_a, pos_b)
            | exists(pos_a, ninf_b) | exists(neg_a, pinf_b))
    out = np.where(ninf, -np.inf, out)
    out = np.where(pinf, np.inf, out)
    return np.where(nan | (pinf & ninf), np.nan, out)


def _all(masks: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    out = np.ones((1,) * len(shape), dtype=bool)
    for m in masks:
        out = out & m
    return out


def guarded_product(body: Expr) -> tuple[list[Cond], Bin] | None:
    """`[conds] ? a · b : 0` (nested guards collected) as (conds, a · b); None when the body is
    not a product under zero-guards, the shape a contraction runs through a matrix product."""
    conds: list[Cond] = []
    while isinstance(body, Select) and isinstance(body.other, Const) and body.other.value == 0.0:
        conds.extend(body.conds)
        body = body.then
    return (conds, body) if isinstance(body, Bin) and body.op == "*" else None


def operand_keeps(masks: list[np.ndarray], a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each operand of a guarded product is kept: each guard zeroes the operands whose axes
    cover it (one covering neither zeroes a, which grows to its axes)."""
    in_a = [m for m in masks if _axes(m) <= _axes(a) or not _axes(m) <= _axes(b)]
    in_b = [m for m in masks if _axes(m) <= _axes(b)]
    return _all(in_a, a.shape), _all(in_b, b.shape)
