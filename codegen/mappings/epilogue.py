"""A contraction's epilogue: the kernel IR's stored value, printed to C around the accumulator.

The contraction mappings accept a stored value that is an expression of

- the accumulator (the tile loop's one state), read once or several times;
- reads of input tensors whose indices are affine in the output tile's lanes, the block indices
  and the sizes (`bias[256*jo + ji]`, `C0[128*io + ii, 256*jo + ji]`);
- scalar bindings computed after the tile loop (`Compute` of a register scalar: FUSE's binding
  of a producer read several times), inlined where they are read;
- number constants, `+ - * /`, `max`, the step `gt`, and the functions `exp neg log tanh sqrt rsqrt erf`;
- sizes and indices as values (`IndexValue`).

Anything else (a condition, a reduction, `rescale`, a non-finite constant, a read of a buffer or
of a tensor that is not an input) is refused with `UnsupportedMapping` naming it: the store never
drops what the kernel IR says.

The value is printed as the body of a C++ lambda `epi(float acc_, int er_, int ec_) -> float`
(`er_`, `ec_`: the element's row and column inside the output tile; block indices, sizes and
tensor pointers are captured); a read or binding used more than once is a local computed once per
element (the CUDA compiler does not merge repeated guarded loads), one used once is printed in
place (measured on the H200, run E: locals for single reads made the residual epilogue's
kernel 20 % slower).  Every read `T[idx]` is guarded
by its bounds,
`(epi_interior || (0 <= idx_d && idx_d < dim_d for every d)) ? T[idx] : 0` (the lower bound is
left out where every coefficient and the constant are >= 0), where `epi_interior` is the C
condition, from `cexpr.box_extremes`, that every read's guard holds on the whole output tile of
this block: interior blocks pass every guard on one uniform predicate.  (One code path: a second,
unguarded copy of the epilogue costs the cp.async kernel its last registers and spills.)

Instruction choices (never meaning): with an f16 / bf16 output, `tanh` prints as the hardware
`tanh.approx.f32` (relative error about 2^-11, the output's own rounding) and `exp` as `__expf`;
an f32 output gets `tanhf` / `expf`; `log` is `logf` on every output.  Except where the value
multiplies two tanh terms (1 − t·t, tanh's derivative: GELU's backward): that cancels as |t| → 1,
where tanh.approx's absolute error (~5e-4) becomes the whole of 1 − t² and the factors around it
(x³ in GELU's) amplify it far past the output's rounding — such an epilogue gets `tanhf`.  (The
CPU emulation runs tanh.approx as libm's tanhf, so only the GPU would show the difference.)
"""
from __future__ import annotations

import math
from typing import Mapping

from compiler.ir import Aff, Bin, Cond, Const, Expr, IndexValue, Read, Un, walk

from .cexpr import UNARY_C, aff_c, box_extremes, cond_c, gt_c
from ..kir.ir import Compute, Kernel
from ..kir.lower import UnsupportedMapping
from .plan import EpiloguePlan, Operand

ACC = "acc_"
ROW, COL = "er_", "ec_"
BINARY = {"+": "+", "-": "-", "*": "*", "/": "/"}
UNARY_EXACT = dict(UNARY_C)  # neg prints as a sign
UNARY_FAST = {**UNARY_EXACT, "exp": "__expf", "tanh": "derivc_tanh_approx"}
# C functions of the value that are instructions -> the macro of constructs/instr.cu.j2 printing
# that wrapper (its PTX and its emulation) into the kernel's wrapper section
HELPERS = {"derivc_tanh_approx": "tanh_approx"}


class _Printer:
    def __init__(self, k: Kernel, acc: str, names: Mapping[str, str], pointers: Mapping[str, str],
                 lanes: Mapping[str, int], bindings: Mapping[str, Expr], out_dtype: str, mapping: str,
                 uses: Mapping[tuple, int] | None = None):
        self.k, self.acc, self.names, self.pointers = k, acc, names, pointers
        self.lanes, self.bindings, self.mapping = lanes, bindings, mapping
        fast = out_dtype in ("f16", "bf16") and not multiplies_tanh_terms(k.store.value, bindings)
        self.unary = UNARY_FAST if fast else UNARY_EXACT
        self.conds: list[Cond] = []
        self.reads: list[str] = []
        self.locals: list[str] = []       # C statements: each read and binding used more than once
        self.memo: dict[tuple, str] = {}
        self.counting = uses is None       # the first pass counts the uses (of the printed text)
        self.uses: dict[tuple, int] = dict(uses or {})
        self.helpers: list[str] = []

    def refuse(self, what: str) -> UnsupportedMapping:
        return UnsupportedMapping(f"{self.mapping} mapping: the epilogue {what}")

    def expr(self, e: Expr, guarded: bool) -> str:
        if isinstance(e, Const):
            if not isinstance(e.value, (int, float)) or not math.isfinite(float(e.value)):
                raise self.refuse(f"has the constant {e.value!r}, not a finite number")
            return f"{float(e.value)!r}f"
        if isinstance(e, Read):
            return self.read(e, guarded)
        if isinstance(e, Bin):
            a, b = self.expr(e.a, guarded), self.expr(e.b, guarded)
            if e.op in BINARY:
                return f"({a} {BINARY[e.op]} {b})"
            if e.op == "max":
                return f"fmaxf({a}, {b})"
            if e.op == "gt":
                return gt_c(a, b)
            raise self.refuse(f"applies {e.op!r}, which this printer does not print")
        if isinstance(e, Un):
            a = self.expr(e.a, guarded)
            if e.op == "neg":
                return f"(-{a})"
            fn = self.unary.get(e.op)
            if fn is None:
                raise self.refuse(f"applies the function {e.op!r}, which this printer does not print")
            if fn in HELPERS and HELPERS[fn] not in self.helpers:
                self.helpers.append(HELPERS[fn])
            return f"{fn}({a})"
        if isinstance(e, IndexValue):
            return f"((float){self.aff(e.aff, 'an index value')})"
        raise self.refuse(f"contains {type(e).__name__} ({_short(e)}), which a contraction's store does not print")

    def aff(self, a: Aff, what: str) -> str:
        missing = sorted(a.names() - set(self.names))
        if missing:
            raise self.refuse(f"uses {', '.join(missing)} in {what} {a}: only the output tile's lanes, "
                              "block indices and sizes are known at the store")
        return aff_c(a, self.names)

    def read(self, r: Read, guarded: bool) -> str:
        if r.tensor == self.acc and not r.idx:
            return ACC
        if r.tensor in self.bindings and not r.idx:
            return self.local(("bind", r.tensor, guarded), lambda: self.expr(self.bindings[r.tensor], guarded))
        if r.tensor not in self.pointers:
            raise self.refuse(f"reads {r.tensor}, which is not an input tensor of the kernel")
        t = self.k.tensor(r.tensor)
        if len(r.idx) != len(t.dims):
            raise self.refuse(f"reads {r.tensor} with {len(r.idx)} indices, its rank is {len(t.dims)}")
        offset = None
        conds: list[Cond] = []
        for a, dim in zip(r.idx, t.dims):
            ia = self.aff(a, f"the index of {r.tensor}")
            offset = ia if offset is None else f"({offset} * {self.aff(dim, 'a dimension')} + {ia})"
            if a.const < 0 or any(c < 0 for _, c in a.terms):
                conds.append(Cond(Aff.lit(0), "<=", a))
            conds.append(Cond(a, "<", dim))
        load = f"{t.dtype}_to_f32({self.pointers[r.tensor]}[{offset or '0'}])"
        for c in conds:
            if c not in self.conds:
                self.conds.append(c)
        if r.tensor not in self.reads:
            self.reads.append(r.tensor)
        if not guarded or not conds:
            return self.local(("read", r, False), lambda: load)
        test = " && ".join(cond_c(c, self.names) for c in conds)
        return self.local(("read", r, True), lambda: f"((epi_interior || ({test})) ? {load} : 0.0f)")

    def local(self, key: tuple, value) -> str:
        """A read or a binding: in place when used once, else a C local computed once per element.
        The counting pass looks inside a key's value at its first use only: a value used again
        is a local, printed once."""
        if self.counting:
            self.uses[key] = self.uses.get(key, 0) + 1
            return value() if self.uses[key] == 1 else "0.0f"
        if self.uses.get(key, 0) < 2:
            return value()
        name = self.memo.get(key)
        if name is None:
            text = value()
            name = self.memo[key] = f"e{len(self.locals)}_"
            self.locals.append(f"const float {name} = {text};")
        return name


def scalar_bindings(k: Kernel, mapping: str) -> dict[str, Expr]:
    """The register scalars computed after the tile loop (name -> value), in order."""
    out: dict[str, Expr] = {}
    for s in k.body[1:]:
        if not (isinstance(s, Compute) and not s.buf.dims and s.buf.level == "register"):
            raise UnsupportedMapping(f"{mapping} mapping: after the tile loop the kernel has {type(s).__name__} "
                                     f"{s.buf.name if hasattr(s, 'buf') else ''}, not a register scalar")
        out[s.buf.name] = s.value
    return out


def multiplies_tanh_terms(value: Expr, bindings: Mapping[str, Expr]) -> bool:
    """Whether value (or a binding it reads) has a product of two factors that both contain a
    tanh (a binding whose value contains one counts as one)."""
    with_tanh: set[str] = set()

    def has_tanh(e: Expr) -> bool:
        return any((isinstance(x, Un) and x.op == "tanh") or (isinstance(x, Read) and not x.idx and x.tensor in with_tanh)
                   for x in walk(e))

    changed = True
    while changed:  # bindings may read bindings
        grown = {n for n, b in bindings.items() if has_tanh(b)}
        changed, with_tanh = grown != with_tanh, grown
    return any(isinstance(x, Bin) and x.op == "*" and has_tanh(x.a) and has_tanh(x.b)
               for e in (value, *bindings.values()) for x in walk(e))


def plan_epilogue(k: Kernel, acc: str, names: Mapping[str, str], pointers: Mapping[str, str],
                  bindings: Mapping[str, Expr], mapping: str) -> EpiloguePlan | None:
    """The epilogue of k's store (None: the store writes the accumulator itself).

    names: C names of the lanes (row lane -> `er_`, column lane -> `ec_`), block indices and
    sizes; pointers: C pointer of every input tensor the store may read."""
    value = k.store.value
    if value == Read(acc, ()):
        return None
    uses = {x.tensor for x in walk(value) if isinstance(x, Read) and not x.idx}
    for b in bindings.values():
        uses |= {x.tensor for x in walk(b) if isinstance(x, Read) and not x.idx}
    if acc not in uses:
        raise UnsupportedMapping(f"{mapping} mapping: the stored value {_short(value)} does not use the "
                                 f"accumulator {acc}")
    lanes = {ln.var: ln.extent for ln in k.lanes}
    counter = _Printer(k, acc, names, pointers, lanes, bindings, k.output.dtype, mapping)
    counter.expr(value, True)
    p = _Printer(k, acc, names, pointers, lanes, bindings, k.output.dtype, mapping, counter.uses)
    result = p.expr(value, True)
    body = " ".join(p.locals + [f"return {result};"])
    box = {v: ("0", str(n - 1)) for v, n in lanes.items()}
    interior = " && ".join(box_extremes(c, box, names)[0] for c in p.conds) or "true"
    tensors = tuple(t for t in k.inputs if t.name in p.reads)
    ops = []
    for t in tensors:
        dims = []
        for a in t.dims:
            if len(a.terms) != 1 or a.terms[0][1] != 1 or a.const:
                raise p.refuse(f"reads {t.name}, whose dimension {a} is not a plain size name")
            dims.append(a.terms[0][0])
        ops.append(Operand(t.name, tuple(dims), t.dtype, "global"))
    return EpiloguePlan(source=_short(value, 400), tensors=tuple(ops), pointers=tuple(pointers[t.name] for t in tensors),
                        body=body, interior=interior, helpers=tuple(p.helpers))


def lambdas(e: EpiloguePlan) -> str:
    """The C++ a contraction template places once its block indices and pointers exist."""
    sig = f"[&](float {ACC}, int {ROW}, int {COL}) -> float"
    return (f"// epilogue (kernel IR): {e.source}\n"
            f"    const bool epi_interior = {e.interior};\n"
            f"    auto epi = {sig} {{ (void){ROW}; (void){COL}; {e.body} }};\n"
            "    (void)epi_interior;")


def _short(e: Expr, limit: int = 160) -> str:
    from compiler.printer import show_expr

    text = " ".join(show_expr(e).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
