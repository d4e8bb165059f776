"""C expressions for the kernel IR's index arithmetic: affine maps, conditions, extents.

`names` maps every index variable and size name to a C expression (a register, a block index,
a literal); the result is parenthesised so that it can be used anywhere.  One printer for every
mapping, so no template spells a mask or a bound of its own.
"""
from __future__ import annotations

from typing import Callable, Mapping

from compiler.ir import UNARY_FUNCTIONS, Aff, Bin, Cond, Const, DataCond, DataRead, DataSpan, Expr, Ext, IndexValue, Or, Read, Un


def aff_c(a: Aff, names: Mapping[str, str]) -> str:
    parts: list[str] = []
    for n, c in a.terms:
        if n not in names:
            raise KeyError(f"index {n} has no C name here")
        v = names[n]
        parts.append(v if c == 1 else f"{c} * {v}" if c != -1 else f"-{v}")
    if a.const or not parts:
        parts.append(str(a.const))
    text = " + ".join(parts).replace("+ -", "- ")
    return f"({text})"


def data_pointer(tensor: str, names: Mapping[str, str]) -> str:
    """The kernel argument of an integer input: `names["*T"]` where a mapping names its pointers
    itself (the fold mappings' p_x<n>), else `p_T` (the row and SIMT mappings)."""
    return names.get("*" + tensor, f"p_{tensor}")


def data_pointer_names(pointers: Mapping[str, str]) -> dict[str, str]:
    """The entries of a `names` map that give integer inputs their kernel arguments."""
    return {"*" + t: p for t, p in pointers.items()}


def data_read_c(r: DataRead, names: Mapping[str, str]) -> tuple[str, str]:
    """(the read is inside the tensor, the value as long long): row-major over the tensor's dims."""
    offset, inside = "", []
    for a, dim in zip(r.idx, r.dims):
        i, n = aff_c(a, names), aff_c(dim, names)
        inside.append(f"0 <= {i} && {i} < {n}")
        offset = i if not offset else f"({offset} * {n} + {i})"
    return " && ".join(inside) or "true", f"(long long){data_pointer(r.tensor, names)}[{offset or 0}]"


def data_cond_c(c: DataCond, names: Mapping[str, str]) -> str:
    """A comparison of integer data: false where a read leaves its tensor (the interpreters' NaN)."""
    guards, sides = [], []
    for s in (c.lhs, c.rhs):
        if isinstance(s, DataRead):
            inside, value = data_read_c(s, names)
            guards.append(inside)
            sides.append(value)
        else:
            sides.append(f"(long long){aff_c(s, names)}")
    return f"({' && '.join(guards)} && {sides[0]} {c.op} {sides[1]})"


def cond_c(c: Cond | Or | DataCond, names: Mapping[str, str]) -> str:
    if isinstance(c, DataSpan):  # its bounds are computed once per block (codegen.mappings.data_span)
        raise ValueError(f"the data span {c} is printed by the online-fold mappings only")
    if isinstance(c, DataCond):
        return data_cond_c(c, names)
    if isinstance(c, Or):
        return "(" + " || ".join(cond_c(p, names) for p in c.parts) + ")"
    return f"({aff_c(c.lhs, names)} {c.op} {aff_c(c.rhs, names)})"


def conds_c(conds: tuple[Cond | Or, ...], names: Mapping[str, str]) -> str:
    return " && ".join(cond_c(c, names) for c in conds) if conds else "true"


# float functions of the CUDA math library for the language's unary functions (fp32 math; logf,
# not the approximate __logf: log feeds gradients and log-sum-exp, whose error it would carry)
UNARY_C = {"exp": "expf", "log": "logf", "sqrt": "sqrtf", "rsqrt": "rsqrtf", "tanh": "tanhf", "erf": "erff"}
# ... and their double forms (the SIMT mapping computes a kernel with an f64 tensor in double)
UNARY_C_DOUBLE = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh", "erf": "erf"}
assert set(UNARY_C) | {"neg"} == set(UNARY_FUNCTIONS) == set(UNARY_C_DOUBLE) | {"neg"}
REALS = ("float", "double")  # the C types a kernel computes in


def unary_c(op: str, arg: str, real: str = "float") -> str:
    """C text of a unary function applied to the C expression `arg` (a `real`)."""
    if op == "neg":
        return f"(-{arg})"
    fn = (UNARY_C_DOUBLE if real == "double" else UNARY_C).get(op)
    if fn is None:
        raise KeyError(f"function {op} has no C form")
    return f"{fn}({arg})"


def index_value_c(a: Aff, names: Mapping[str, str], real: str = "float") -> str:
    """An affine index expression as a `real` value (64-bit integer math, then converted)."""
    return f"(({real})(long long){aff_c(a, names)})"


def ext_c(x: Ext, names: Mapping[str, str]) -> str:
    """max(0, min over parts of ceil(num / div)) — C division truncates, so clamp at 0."""
    parts = []
    for num, div in x.parts:
        n = aff_c(num, names)
        parts.append(f"(long long){n}" if div == 1 else f"(((long long){n} + {div - 1}) / {div})")
    out = parts[0]
    for p in parts[1:]:
        out = f"min({out}, {p})"
    return f"max(0LL, {out})" if len(x.parts) > 1 or any(a.terms for a, _ in x.parts) else out


def size_names(sizes: tuple[tuple[str, int | None], ...], prefix: str = "sz_") -> dict[str, str]:
    """Fixed sizes print as literals, dynamic ones as kernel arguments."""
    return {n: (str(v) if v is not None else prefix + n) for n, v in sizes}


def box_extremes(c: Cond | Or, box: Mapping[str, tuple[str, str]], names: Mapping[str, str]) -> tuple[str, str]:
    """C expressions for (the condition holds on the whole box, it holds nowhere in it).

    A disjunction holds on the whole box where one of its parts does (sufficient: a box some
    parts cover only between them is treated as partial, masked element-wise), and nowhere
    exactly where every part holds nowhere.

    The box gives each boxed variable its (lowest, highest) value as C; the condition
    lhs < rhs (or <=) is affine, so its slack rhs - lhs is least and greatest at corners: each
    boxed variable sits at the end its coefficient's sign picks.
    """
    if isinstance(c, (DataCond, DataSpan)):  # data: it may hold or not anywhere in the box (masked per element)
        return "false", "false"
    if isinstance(c, Or):
        ends = [box_extremes(p, box, names) for p in c.parts]
        return "(" + " || ".join(e for e, _ in ends) + ")", "(" + " && ".join(n for _, n in ends) + ")"
    slack = c.rhs - c.lhs
    lo_names, hi_names = dict(names), dict(names)
    for v, (lo, hi) in box.items():
        coef = slack.coef(v)
        lo_names[v], hi_names[v] = (lo, hi) if coef >= 0 else (hi, lo)
    bound = "0" if c.op == "<" else "-1"
    return f"({aff_c(slack, lo_names)} > {bound})", f"({aff_c(slack, hi_names)} <= {bound})"


# binary operators of the IR on float values, as C (fp32 math)
_BINARY_C = {"+": "+", "-": "-", "*": "*", "/": "/"}


def gt_c(a: str, b: str, real: str = "float") -> str:
    """C text of the step gt(a, b) on `real` expressions: 1 where a > b, else 0 (a NaN operand
    compares false, as in the interpreter)."""
    one, zero = (float_const_c(1.0, real), float_const_c(0.0, real))
    return f"(({a}) > ({b}) ? {one} : {zero})"


def float_const_c(v: float, real: str = "float") -> str:
    """A constant as a C `real` (float: the f suffix; infinities by their bits)."""
    assert real in REALS, real
    if v in (float("inf"), float("-inf")):
        if real == "float":
            return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
        return "__longlong_as_double(0x7ff0000000000000LL)" if v > 0 else "__longlong_as_double(-4503599627370496LL)"
    if v != v:
        raise ValueError("a NaN constant has no C form here")
    return repr(float(v)) + ("f" if real == "float" else "")


def value_c(e: Expr, read: Callable[[Read], str], index_value: Callable[[Aff], str]) -> str:
    """C text (a float) of an element-wise IR expression: constants, + - * / max gt, the unary
    functions, tensor reads (printed by `read`) and index values (printed by `index_value`).
    Anything else (a reduction, a guard, a fold) has no element-wise C form: ValueError naming it."""
    if isinstance(e, Const):
        return float_const_c(e.value)
    if isinstance(e, Read):
        return read(e)
    if isinstance(e, IndexValue):
        return index_value(e.aff)
    if isinstance(e, Bin):
        a, b = value_c(e.a, read, index_value), value_c(e.b, read, index_value)
        if e.op == "max":
            return f"fmaxf({a}, {b})"
        if e.op == "gt":
            return gt_c(a, b)
        op = _BINARY_C.get(e.op)
        if op is None:
            raise ValueError(f"operator {e.op} has no element-wise C form")
        return f"({a} {op} {b})"
    if isinstance(e, Un):
        return unary_c(e.op, value_c(e.a, read, index_value))
    raise ValueError(f"{type(e).__name__} is not an element-wise value")


def read_c(shape: tuple[Aff, ...], idx: tuple[Aff, ...], pointer: str, load: str,
           names: Mapping[str, str]) -> str:
    """A guarded element read of a row-major global tensor: `load(pointer[offset])` where every
    index lies in [0, its dimension), else 0 (64-bit offset; one unsigned compare per index)."""
    if len(shape) != len(idx):
        raise ValueError(f"{pointer}: {len(idx)} indices for {len(shape)} dimensions")
    off = "0LL"
    guards = []
    for a, n in zip(idx, shape):
        i, dim = aff_c(a, names), aff_c(n, names)
        off = f"({off} * (long long){dim} + (long long){i})"
        guards.append(f"((unsigned long long)(long long){i} < (unsigned long long)(long long){dim})")
    return f"({' && '.join(guards) or 'true'} ? {load}({pointer}[{off}]) : 0.0f)"


def first_tile_c(conds: tuple[Cond, ...], var: str, box: Mapping[str, tuple[str, str]],
                 names: Mapping[str, str]) -> str:
    """C expression for the first value of the tile index `var` at which the conjunction can hold
    somewhere in the box (0 when no condition bounds `var` from below).

    Each condition lhs < rhs (or <=) has the affine slack rhs - lhs = A + t*var.  With t > 0 it
    holds somewhere in the box iff max over the box of A (each boxed variable at the corner its
    coefficient picks) + t*var > b (b = 0 for <, -1 for <=), i.e. var >= ceil((b + 1 - A_max) / t).
    The conditions are half-spaces, so the tiles they can reach form one interval: the tiles below
    the largest of these bounds are fully masked for the whole box.  A disjunction reaches the
    union of its parts' tiles: it starts at the least of their starts (at 0 when a part bounds `var`
    only from above).  A part without `var` (prefix-LM's key j < Prefix, over query tiles) reaches
    every tile where it holds somewhere in the box and none where it holds nowhere.
    """
    starts = []
    for c in conds:
        if isinstance(c, (DataCond, DataSpan)):  # data bounds no tile here (a span: data_span.py)
            continue
        if isinstance(c, Or):  # the union of the parts' ranges: the least of their starts
            parts = [_or_part_start(p, var, box, names) for p in c.parts]
            if all(parts):
                starts.append(_nested("min", parts))
            continue
        one = _start(c, var, box, names)
        if one:
            starts.append(one)
    return _nested("max", ["0LL", *starts])


def _nested(fn: str, xs: list[str]) -> str:
    """fn(fn(x0, x1), x2) ...: C's two-argument min / max over a list."""
    out = xs[0]
    for x in xs[1:]:
        out = f"{fn}({out}, {x})"
    return out


# a tile index past every tile (N < 2^31 rows: fewer than 2^30 tiles), small enough that a
# printer's int arithmetic on it (begin + stage) cannot overflow
NO_TILE = "(1LL << 30)"


def _or_part_start(c: Cond, var: str, box: Mapping[str, tuple[str, str]], names: Mapping[str, str]) -> str:
    """A disjunct's first tile ("" when it reaches tile 0: it bounds `var` only from above)."""
    if c.rhs.coef(var) != c.lhs.coef(var):
        return _start(c, var, box, names)
    return f"({box_extremes(c, box, names)[1]} ? {NO_TILE} : 0LL)"


def _or_part_end(c: Cond, var: str, box: Mapping[str, tuple[str, str]], names: Mapping[str, str]) -> str:
    """A disjunct's end ("" when it has none: it bounds `var` only from below)."""
    if c.rhs.coef(var) != c.lhs.coef(var):
        return _end(c, var, box, names)
    return f"({box_extremes(c, box, names)[1]} ? 0LL : {NO_TILE})"


def _start(c: Cond, var: str, box: Mapping[str, tuple[str, str]], names: Mapping[str, str]) -> str:
    """The first value of `var` at which c holds somewhere in the box ("" when c does not bound
    `var` from below)."""
    slack = c.rhs - c.lhs
    t = slack.coef(var)
    if t <= 0:
        return ""
    rest = Aff.build({v: a for v, a in slack.terms if v != var}, slack.const)
    hi = dict(names)
    for v, (lo, up) in box.items():
        hi[v] = up if rest.coef(v) >= 0 else lo
    need = f"((long long){1 if c.op == '<' else 0} - (long long){aff_c(rest, hi)})"
    # ceil(need / t) with C's truncating division: exact for negative numerators too
    return f"({need} > 0 ? ({need} + {t - 1}) / {t} : -((-{need}) / {t}))"


def end_tile_c(conds: tuple[Cond | Or, ...], var: str, box: Mapping[str, tuple[str, str]],
               names: Mapping[str, str]) -> str | None:
    """One past the last value of `var` at which every condition can hold in the box (None: no
    condition bounds it from above).  slack = rhs - lhs = A + t*var with t < 0 holds somewhere iff
    max(A) + t*var > b (b = 0 for <, -1 for <=): var <= floor((max(A) - b - 1) / -t).  A
    disjunction reaches the union of its parts' tiles: it ends at the greatest of their ends, and
    bounds nothing when a part has no end (a part without `var`: no end where it holds somewhere
    in the box, tile 0 where it holds nowhere)."""
    ends = []
    for c in conds:
        if isinstance(c, (DataCond, DataSpan)):
            continue
        if isinstance(c, Or):
            parts = [_or_part_end(p, var, box, names) for p in c.parts]
            if all(parts):
                ends.append(_nested("max", parts))
            continue
        one = _end(c, var, box, names)
        if one:
            ends.append(one)
    return _nested("min", ends) if ends else None


def _end(c: Cond, var: str, box: Mapping[str, tuple[str, str]], names: Mapping[str, str]) -> str:
    slack = c.rhs - c.lhs
    t = slack.coef(var)
    if t >= 0:
        return ""
    rest = Aff.build({v: a for v, a in slack.terms if v != var}, slack.const)
    hi = dict(names)
    for v, (lo, up) in box.items():
        hi[v] = up if rest.coef(v) >= 0 else lo
    num = f"((long long){aff_c(rest, hi)} - {1 if c.op == '<' else 0})"
    u = -t
    # floor(num / u) + 1 with C's truncating division
    return f"(({num} >= 0 ? {num} / {u} : -((-{num} + {u - 1}) / {u})) + 1)"
