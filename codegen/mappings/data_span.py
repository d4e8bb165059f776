"""The fold mappings' printing of a data-derived key-tile span (MASK-DATA; compiler.ir_index.DataSpan).

The span is computed once per block, in the block's prologue, by all its threads, from the mask's
own integer data, exactly as the interpreters define it:

    lo_v, hi_v = min / max of the query read over the row box (reads outside the tensor left out)
    first, last = the least / greatest key position p < key_dim with lo_v <= key[p] <= hi_v
    span_lo_ = first / size, span_hi_ = last / size + 1   (no such p: span_lo_ past every tile, span_hi_ = 0)

Each of the two passes is a strided loop over the block's threads and a block reduction (warp
shuffles, then one shared word per warp), so the prologue reads the query rows once and the key
data once per block (4 bytes a key: a 16k-token row of ids is 64 KiB, one key tile's K load).
The fold then runs over the tiles [max(its first tile, span_lo_), min(its extent, span_hi_)), and
the conjunct itself prints as span_lo_ <= tile < span_hi_ (tile-uniform).
"""
from __future__ import annotations

from typing import Mapping

from compiler.ir import SPAN_KEY, DataSpan

from .cexpr import aff_c, data_read_c

LO, HI = "span_lo_", "span_hi_"
_INT_MAX, _INT_MIN = "2147483647", "(-2147483647 - 1)"


def span_c(span: DataSpan, names: Mapping[str, str]) -> str:
    """The conjunct at a key tile (names gives the tile's variables their C expressions)."""
    t = aff_c(span.tile, names)
    return f"({LO} <= {t} && {t} < {HI})"


def _reduce(a: str, b: str) -> list[str]:
    """Block-wide a = min(a), b = max(b) over every thread (blockDim.x a multiple of 32)."""
    return [
        "#pragma unroll",
        "for (int o_ = 16; o_ > 0; o_ >>= 1) {",
        f"    {a} = min({a}, __shfl_xor_sync(0xffffffffu, {a}, o_));",
        f"    {b} = max({b}, __shfl_xor_sync(0xffffffffu, {b}, o_));",
        "}",
        f"if ((threadIdx.x & 31) == 0) {{ span_w_[0][threadIdx.x >> 5] = {a}; span_w_[1][threadIdx.x >> 5] = {b}; }}",
        "__syncthreads();",
        f"{a} = span_w_[0][0]; {b} = span_w_[1][0];",
        "for (int w_ = 1; w_ < (int)(blockDim.x >> 5); ++w_) {",
        f"    {a} = min({a}, span_w_[0][w_]); {b} = max({b}, span_w_[1][w_]);",
        "}",
        "__syncthreads();",
    ]


def span_prologue(span: DataSpan, names: Mapping[str, str]) -> list[str]:
    """C statements (block scope, every thread of the block) declaring and computing span_lo_ and
    span_hi_.  names: the block's variables (batch indices, query tile, sizes, data pointers)."""
    count = 1
    for _, n in span.rows:
        count *= n
    row_names = dict(names)
    decode = []
    stride = count
    for k, (v, n) in enumerate(span.rows):
        stride //= n
        decode.append(f"        const int sr{k}_ = (r_ / {stride}) % {n};")
        row_names[v] = f"sr{k}_"
    q_inside, q_value = data_read_c(span.query, row_names)
    k_inside, k_value = data_read_c(span.key, {**names, SPAN_KEY: "p_"})
    body = [
        f"int {LO}, {HI};  // MASK-DATA: the key tiles this block's rows can reach, from {span.key.tensor}",
        "{",
        "    __shared__ int span_w_[2][32];",
        f"    int a_ = {_INT_MAX}, b_ = {_INT_MIN};  // the least / greatest value of the block's query rows",
        f"    for (int r_ = threadIdx.x; r_ < {count}; r_ += blockDim.x) {{",
        *decode,
        f"        if ({q_inside}) {{ const int v_ = (int){q_value}; a_ = min(a_, v_); b_ = max(b_, v_); }}",
        "    }",
        *("    " + x for x in _reduce("a_", "b_")),
        f"    int f_ = {_INT_MAX}, l_ = -1;  // the first / last key position whose value lies in [a_, b_]",
        f"    for (long long p_ = threadIdx.x; p_ < (long long){aff_c(span.key_dim, names)}; p_ += blockDim.x) {{",
        f"        if ({k_inside}) {{",
        f"            const long long v_ = {k_value};",
        "            if (a_ <= v_ && v_ <= b_) { f_ = min(f_, (int)p_); l_ = max(l_, (int)p_); }",
        "        }",
        "    }",
        *("    " + x for x in _reduce("f_", "l_")),
        f"    {LO} = f_ / {span.size};",
        f"    {HI} = l_ < 0 ? 0 : l_ / {span.size} + 1;",
        "}",
    ]
    return body
