"""A readable printer for programs: what `derivc build` writes after every step."""
from __future__ import annotations

import math

from .ir import (
    BINARY_FUNCTIONS, Bin, Binding, Const, Def, Expr, Fold, IndexValue, Let, Program, Read, Reduce, Select, Softmax, Un,
)

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def show_expr(e: Expr, indent: int = 0) -> str:
    """Expression text; binding forms break onto indented lines."""
    pad = "  " * indent
    if isinstance(e, Const):
        # A labelled constant carries its value: the digest is of the printed program, and two
        # specs that differ only in a parameter's value must not share one.
        return f"{e.label}(={_number(e.value)})" if e.label else _number(e.value)
    if isinstance(e, IndexValue):
        return f"idx({e.aff})"
    if isinstance(e, Read):
        return e.tensor + ("[" + ", ".join(str(a) for a in e.idx) + "]" if e.idx else "")
    if isinstance(e, Bin):
        if e.op in BINARY_FUNCTIONS:
            return f"{e.op}({show_expr(e.a, indent)}, {show_expr(e.b, indent)})"
        return f"{_wrap(e.a, e.op, indent, False)} {e.op} {_wrap(e.b, e.op, indent, True)}"
    if isinstance(e, Un):
        return f"-({show_expr(e.a, indent)})" if e.op == "neg" else f"{e.op}({show_expr(e.a, indent)})"
    if isinstance(e, Reduce):
        facts = []
        if e.acc:
            facts.append(f"acc {e.acc.level} {e.acc.dtype}")
        if e.mma:
            facts.append(f"mma {e.mma.instr} {e.mma.m}x{e.mma.n}x{e.mma.k}")
        tag = f" @{{{'; '.join(facts)}}}" if facts else ""
        return f"{e.op}({e.var} < {e.ext}{tag}: {show_expr(e.body, indent)})"
    if isinstance(e, Select):
        conds = " && ".join(str(c) for c in e.conds)
        return f"[{conds}] ? {show_expr(e.then, indent)} : {show_expr(e.other, indent)}"
    if isinstance(e, Softmax):
        mask = (" | " + " && ".join(str(c) for c in e.mask)) if e.mask else ""
        return f"softmax({e.var} < {e.ext}{mask}: {show_expr(e.score, indent)})@[{e.at}]"
    if isinstance(e, Let):
        return f"let {show_binding(e.bind, indent)}\n{pad}in {show_expr(e.body, indent)}"
    if isinstance(e, Fold):
        inner = "  " * (indent + 1)
        lines = [f"fold({e.var} < {e.ext}) state ("
                 + ", ".join(f"{s} = {show_expr(i, indent)}" for s, i in zip(e.state, e.init)) + "):"]
        for b in e.binds:
            lines.append(f"{inner}let {show_binding(b, indent + 1)}")
        for s, u in zip(e.state, e.update):
            lines.append(f"{inner}{s} := {show_expr(u, indent + 1)}")
        lines.append(f"{pad}result {show_expr(e.result, indent)}")
        for n, x in enumerate(e.also):
            lines.append(f"{pad}result[{n + 1}] {show_expr(x, indent)}")
        return "\n".join(lines)
    raise TypeError(f"not an expression: {e!r}")


def _number(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    return repr(float(value)) if value != int(value) else str(int(value))


def _wrap(e: Expr, op: str, indent: int, right: bool) -> str:
    text = show_expr(e, indent)
    if isinstance(e, Bin) and e.op in _PREC:
        if _PREC[e.op] < _PREC[op] or (right and _PREC[e.op] == _PREC[op] and op in "-/"):
            return f"({text})"
    if isinstance(e, (Select, Let, Fold)):
        return f"({text})"
    return text


def show_binding(b: Binding, indent: int = 0) -> str:
    dims = "[" + ", ".join(f"{v} < {x}" for v, x in b.dims) + "]" if b.dims else ""
    facts = [b.level] + ([f"stages {b.stages}"] if b.stages > 1 else []) + ([f"caches {b.source}"] if b.source else [])
    return f"{b.name}{dims} @{{{'; '.join(facts)}}} = {show_expr(b.value, indent + 1)}"


def show_def(d: Def) -> str:
    dims = ", ".join(str(a) for a in d.type.dims)
    head = f"def {d.name}[{dims}] : {d.type.dtype} @{d.level}"
    if d.computed_by:
        head += f" (read from {d.computed_by})"
    loops = ", ".join(
        f"{lp.var} < {lp.ext}" + (f" @{lp.mapping}" if lp.mapping else "") for lp in d.loops
    )
    guard = (" where " + " && ".join(str(c) for c in d.guard)) if d.guard else ""
    store = f"{d.name}[" + ", ".join(str(a) for a in d.store) + "]"
    also = "".join(f"\n  also {a.name}[{', '.join(str(d.store[k]) for k in a.keep)}] : {a.type.dtype} = result[{n + 1}]"
                   f" where " + " && ".join(f"{d.store[k]} == 0" for k in range(len(d.store)) if k not in a.keep)
                   for n, a in enumerate(d.also))
    return f"{head}\n  for {loops}{guard}:\n    {store} = {show_expr(d.body, 3)}{also}"


def show_program(p: Program) -> str:
    sizes = ", ".join(f"{n}={v}" if v is not None else f"{n}=?" for n, v in p.sizes)
    ins = "; ".join(
        f"{n}[{', '.join(str(a) for a in t.dims)}] : {t.dtype}" for n, t in p.inputs
    )
    parts = [f"sizes {sizes}", f"inputs {ins}"]
    parts += [show_def(d) for d in p.defs]
    parts.append(f"output {p.output}")
    if p.facts:
        parts.append("facts " + ", ".join(f"{k}={v}" for k, v in p.facts))
    return "\n".join(parts) + "\n"
