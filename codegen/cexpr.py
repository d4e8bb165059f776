"""C expressions for the kernel IR's index arithmetic: affine maps, conditions, extents.

`names` maps every index variable and size name to a C expression (a register, a block index,
a literal); the result is parenthesised so that it can be used anywhere.  One printer for every
mapping, so no template spells a mask or a bound of its own.
"""
from __future__ import annotations

from typing import Mapping

from compiler.ir import UNARY_FUNCTIONS, Aff, Cond, Ext


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


def cond_c(c: Cond, names: Mapping[str, str]) -> str:
    return f"({aff_c(c.lhs, names)} {c.op} {aff_c(c.rhs, names)})"


def conds_c(conds: tuple[Cond, ...], names: Mapping[str, str]) -> str:
    return " && ".join(cond_c(c, names) for c in conds) if conds else "true"


# float functions of the CUDA math library for the language's unary functions (fp32 math)
_UNARY_C = {"exp": "expf", "sqrt": "sqrtf", "rsqrt": "rsqrtf", "tanh": "tanhf", "erf": "erff"}
assert set(_UNARY_C) | {"neg"} == set(UNARY_FUNCTIONS)


def unary_c(op: str, arg: str) -> str:
    """C text of a unary function applied to the C expression `arg` (a float)."""
    if op == "neg":
        return f"(-{arg})"
    fn = _UNARY_C.get(op)
    if fn is None:
        raise KeyError(f"function {op} has no C form")
    return f"{fn}({arg})"


def index_value_c(a: Aff, names: Mapping[str, str]) -> str:
    """An affine index expression as a float value (64-bit integer math, then converted)."""
    return f"((float)(long long){aff_c(a, names)})"


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


def box_extremes(c: Cond, box: Mapping[str, tuple[str, str]], names: Mapping[str, str]) -> tuple[str, str]:
    """C expressions for (the condition holds on the whole box, it holds nowhere in it).

    The box gives each boxed variable its (lowest, highest) value as C; the condition
    lhs < rhs (or <=) is affine, so its slack rhs - lhs is least and greatest at corners: each
    boxed variable sits at the end its coefficient's sign picks.
    """
    slack = c.rhs - c.lhs
    lo_names, hi_names = dict(names), dict(names)
    for v, (lo, hi) in box.items():
        coef = slack.coef(v)
        lo_names[v], hi_names[v] = (lo, hi) if coef >= 0 else (hi, lo)
    bound = "0" if c.op == "<" else "-1"
    return f"({aff_c(slack, lo_names)} > {bound})", f"({aff_c(slack, hi_names)} <= {bound})"
