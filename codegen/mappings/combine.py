"""Combine mapping: SPLIT-K's combine C = Σ_{ks<S} P[ks, …] printed with 16-byte loads.

The kernel IR it prints is the one the schedule makes of the combine (SPLIT-K's definition
after `tile j` by a block width, `tile` of the thread's part by V ∈ {4, 8}, the rows and the
column blocks on the grid, the V-groups on threads, the V columns left unmapped):

    lanes jl < T @thread, jv < V
    store C[…, base + V·jl + jv] = sum(ks < S: P[ks, …, base + V·jl + jv]) where …

Each thread owns the V consecutive columns of its jl: for ks = 0 … S − 1 in order it loads the
V partial sums (V/4 float4 loads) and adds them, column by column, into r = 0 — the same
additions in the same order as the SIMT printer's per-element sum, so the bits are the SIMT
kernel's and the same run to run (no atomics).  The vector path runs where the V columns are
all inside the store's guard (each guard conjunct is affine in jv: true at jv = 0 and V − 1
means true between) and 16-byte aligned (the offset of the first column and one split's plane
multiples of 4 floats; for the store, of the V elements); elsewhere each column is summed alone
with its guard.  Anything else — an epilogue around the sum, a thread lane that is not the
V-groups, a guard disjunction — is refused by name and printed by SIMT.
"""
from __future__ import annotations

from compiler.ir import Read, Reduce
from compiler.ir_index import Aff, Cond
from compiler.machine import DEVICE, DTYPES

from ..kir.grid import block_index_c
from ..kir.ir import Kernel
from ..kir.lower import UnsupportedMapping
from ..source import KernelSource, Launch
from .cexpr import aff_c, conds_c, ext_c, size_names
from .templates_env import render_template

NAME = "combine"
VECTOR_WIDTHS = (4, 8)


def _refuse(why: str) -> UnsupportedMapping:
    return UnsupportedMapping(f"{NAME}: {why}")


def _strides(dims: tuple[Aff, ...], names: dict[str, str]) -> list[str]:
    strides, acc = [], "1LL"
    for d in reversed(dims):
        strides.append(acc)
        acc = f"{acc} * (long long){aff_c(d, names)}"
    return list(reversed(strides))


def _match(k: Kernel) -> tuple[str, int, int]:
    """(partial tensor, S, V) of a vectorisable combine, or UnsupportedMapping."""
    if k.body or k.also:
        raise _refuse("the kernel is not one combine store (it stages, loops or writes further outputs)")
    if len(k.lanes) != 2:
        raise _refuse(f"the kernel is not a combine over (thread, vector) lanes: lanes {[ln.var for ln in k.lanes]}")
    thread, vec = k.lanes
    if thread.mapping is None or thread.mapping.level != "thread" or thread.extent is None:
        raise _refuse(f"lane {thread.var} is not mapped to threads")
    if thread.mapping.count not in (0, thread.extent):
        raise _refuse(f"lane {thread.var}: {thread.mapping.count} threads stride over {thread.extent} (one thread "
                      "per group of columns here)")
    if vec.mapping is not None or vec.extent not in VECTOR_WIDTHS:
        raise _refuse(f"lane {vec.var} is not an unmapped run of {' or '.join(map(str, VECTOR_WIDTHS))} columns")
    if thread.extent > DEVICE.max_threads_per_block:
        raise _refuse(f"{thread.extent} threads per block > {DEVICE.max_threads_per_block}")
    st, v = k.store, vec.extent
    col = st.index[-1]
    if col.coef(vec.var) != 1 or col.coef(thread.var) != v or any(vec.var in a.names() or thread.var in a.names()
                                                                  for a in st.index[:-1]):
        raise _refuse(f"the stored column {col} is not base + {v}·{thread.var} + {vec.var} (consecutive per thread)")
    red = st.value
    if not isinstance(red, Reduce) or red.op != "sum" or red.mma is not None:
        raise _refuse("the stored value is not a plain sum over the splits (an epilogue prints on SIMT)")
    splits = red.ext.const_value()
    body = red.body
    if splits is None or not isinstance(body, Read):
        raise _refuse("the sum is not a fixed number of splits of one partial tensor")
    out, part = k.tensor(st.tensor), k.tensor(body.tensor)
    if (part.dtype != "f32" or body.idx != (Aff.of(red.var), *st.index)
            or tuple(part.dims[1:]) != tuple(out.dims) or part.dims[0] != Aff.lit(splits)):
        raise _refuse(f"the sum does not read {body.tensor}[{red.var}, <the stored element>] of an f32 "
                      f"[{splits}, {', '.join(map(str, out.dims))}] workspace")
    if out.dtype not in ("f16", "bf16", "f32"):
        raise _refuse(f"output dtype {out.dtype}")
    if any(not isinstance(c, Cond) for c in st.guard):
        raise _refuse("a guard disjunction is not a half-space in the vector lane")
    return body.tensor, splits, v


def render(k: Kernel, options: tuple[str, ...]) -> tuple[KernelSource, Launch]:
    part, splits, v = _match(k)
    thread, vec = k.lanes
    out = k.tensor(k.store.tensor)
    names = size_names(k.sizes)
    for g in k.grid:
        names[g.var] = f"v_{g.var}"
    names[thread.var] = f"v_{thread.var}"
    at = {**names, vec.var: "0"}
    strides = _strides(out.dims, names)
    base = " + ".join(f"(long long){aff_c(a, at)} * {s}" for a, s in zip(k.store.index, strides))
    plane = " * ".join(f"(long long){aff_c(d, names)}" for d in out.dims)
    first, last = ({**names, vec.var: str(j)} for j in (0, v - 1))
    guard = k.store.guard
    in_range = f"({conds_c(guard, first)}) && ({conds_c(guard, last)})" if guard else "true"
    store_elems = 16 // DTYPES[out.dtype].bytes if out.dtype == "f32" else v  # elements per aligned store
    aligned = f"((base_ | plane_) & 3LL) == 0 && (base_ & {min(store_elems, v) - 1}LL) == 0"
    params = [f"const {DTYPES[t.dtype].ctype}* __restrict__ p_{t.name}" for t in k.inputs]
    params += [f"{DTYPES[t.dtype].ctype}* __restrict__ p_{t.name}" for t in k.outputs]
    params += [f"int sz_{n}" for n in k.dynamic()]
    bidx = block_index_c([(g.var, ext_c(g.ext, names), g.axis) for g in k.grid])
    ctx = dict(kname=k.name, threads=thread.extent, params=", ".join(params),
               grid=[f"const long long v_{g.var} = {bidx[g.var]};" for g in k.grid],
               lane=f"v_{thread.var}", vec_var=f"v_{vec.var}", V=v, S=splits, part=part, out=out.name,
               out_dt=out.dtype, base=base, plane=plane, in_range=in_range, aligned=aligned,
               guard=conds_c(guard, {**names, vec.var: f"v_{vec.var}"}) if guard else "true",
               summary=f"combine of {splits} f32 partials, {thread.extent} threads x {v} consecutive columns, "
                       "16-byte loads, split order")
    src = render_template("combine.cu.j2", ctx)
    ks = KernelSource(src, k.name, tuple(t.name for t in k.tensors) + k.dynamic(), thread.extent, 0, options)
    launch = Launch(tuple((g.axis, g.ext) for g in k.grid), thread.extent, 0, tuple(t.name for t in k.tensors),
                    k.dynamic())
    return ks, launch


def _print(k: Kernel, options: tuple[str, ...]):
    from .registry import Printed, Variant

    ks, launch = render(k, options)
    return Printed(NAME, k, None, (Variant("kernel", ks, launch),),
                   {"expect_mma": None, "expect_async_copy": False, "forbid_spills": True})


def _register() -> None:
    from .registry import Mapping, register

    register(Mapping(NAME, "combine", None, _print))


_register()
