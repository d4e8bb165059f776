"""Hardware mappings, found through a registry keyed by (kernel family, instruction).

A mapping prints a kernel IR for one kind of hardware unit: `simt` prints any kernel IR;
the tensor-core mappings (mma.sync, wgmma) accept a kernel IR only when its meaning is the one
their templates implement, and refuse by name otherwise.  The instruction comes from the kernel
IR (MAP-MMA's facts on its tile sums), never from a guess: a kernel IR with tensor-core facts is
printed by a tensor-core mapping or the build stops.  A new family or GPU generation is one
module that calls `register`, plus its templates.

Layout: every printer sits here with its templates.  The registry (`registry`, `common`) and one
module per family (`contraction`, `online_fold`, `rowwise`, `simt`); the tensor-core renderers
(`render` for mma.sync, `render_wgmma`, `render_attn_wgmma`) with their plans and contexts
(`plan`, `ctx_common`, `launch`: the mma.sync shared-memory layout, `epilogue`); `cexpr`, the C
printer of the kernel IR's conditions, affine forms and values; `templates_env` and `templates/`
(one skeleton per mapping, `templates/constructs/` the macros they share).  The split is flat,
not one subpackage per family, because renderers and constructs are shared across families
(`render` prints both the mma.sync contraction and the mma.sync online fold).
"""
from __future__ import annotations

from compiler.ir import Reduce

from ..kir.ir import Kernel, sub_expressions
from ..kir.lower import UnsupportedMapping
from .registry import REGISTRY, Mapping, Printed, Variant, register

__all__ = ["REGISTRY", "Mapping", "Printed", "Variant", "register", "instruction", "print_kernel", "mapping_named"]


def instruction(k: Kernel) -> str | None:
    """The tensor-core instruction the schedule mapped the kernel's tile sums to (MAP-MMA)."""
    instrs = {x.mma.instr for x in sub_expressions(k) if isinstance(x, Reduce) and x.mma is not None}
    if len(instrs) > 1:
        raise UnsupportedMapping(f"the kernel mixes tensor-core instructions {sorted(instrs)}")
    return instrs.pop() if instrs else None


def print_kernel(k: Kernel, options: tuple[str, ...]) -> Printed:
    """Print k with the mapping its facts ask for; UnsupportedMapping with every refusal."""
    _load()
    instr = instruction(k)
    reasons = []
    f64 = [t.name for t in k.tensors if t.dtype == "f64"]
    # the catch-all family prints anything, so it is tried last
    for m in sorted(REGISTRY.values(), key=lambda m: m.family == "any"):
        if m.instr != instr:
            continue
        if f64 and m.family != "any":  # only SIMT computes in double
            reasons.append(f"{m.name}: f64 tensors ({', '.join(f64)}) are printed by the SIMT mapping only")
            continue
        if k.also and not m.prints_also:
            reasons.append(f"{m.name}: does not print the kernel's further outputs "
                           f"({', '.join(st.tensor for st in k.also)})")
            continue
        dynamic = [f"{ln.var} < {ln.ext}" for ln in k.lanes if ln.extent is None]
        if dynamic and not m.dynamic_lanes:
            reasons.append(f"{m.name}: does not print a lane of dynamic extent ({', '.join(dynamic)})")
            continue
        try:
            return m.render(k, options)
        except UnsupportedMapping as exc:
            reasons.append(str(exc))
    if not reasons:
        raise UnsupportedMapping(f"no mapping prints instruction {instr!r}")
    # a mapping whose kernel shape does not fit at all says least: its reason goes last
    reasons.sort(key=lambda r: "the kernel is not" in r)
    raise UnsupportedMapping(" | ".join(reasons))


def mapping_named(name: str) -> Mapping:
    _load()
    for m in REGISTRY.values():
        if m.name == name:
            return m
    raise KeyError(name)


def _load() -> None:
    from . import combine, contraction, online_fold, rowwise, score_store, score_sum, score_sum_wgmma, simt  # noqa: F401  (each registers its mappings)
