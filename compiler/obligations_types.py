"""Value types of IR expressions for the proof export: finite ('R') or extended ('X').

The proof semantics keeps −∞ out of the ring R: everything max-like (the constant −∞, `max`,
max reductions, selects with a −∞ branch, tensors / buffers / fold state holding such values)
is an extended value `ext R` (Fin r | NInf), on which there is no ring arithmetic; `rescale` and
the step `gt(a, b)` are finite whatever their operands.  This module assigns each IR name and
expression its type; compiler/obligations_terms.py exports accordingly (lifting R to X with `Fin`,
`exp (a - b)` on extended values as `expd a b`).
"""
from __future__ import annotations

import math

from .ir import Bin, Const, Expr, Fold, Let, Program, Read, Reduce, Select, Softmax, Un

FIN, EXT = "R", "X"


def join(*tys: str) -> str:
    return EXT if EXT in tys else FIN


def expr_type(e: Expr, names: dict[str, str]) -> str:
    """The type of e; records the types of the buffers and fold state it binds in `names`."""
    if isinstance(e, Const):
        return EXT if math.isinf(e.value) and e.value < 0 else FIN
    if isinstance(e, Read):
        return names.get(e.tensor, FIN)
    if isinstance(e, Bin):
        ta, tb = expr_type(e.a, names), expr_type(e.b, names)
        return EXT if e.op == "max" else FIN if e.op in ("rescale", "gt") else join(ta, tb)
    if isinstance(e, Un):
        expr_type(e.a, names)
        return FIN
    if isinstance(e, Reduce):
        tb = expr_type(e.body, names)
        return EXT if e.op == "max" else tb
    if isinstance(e, Select):
        return join(expr_type(e.then, names), expr_type(e.other, names))
    if isinstance(e, Softmax):
        expr_type(e.score, names)
        return FIN
    if isinstance(e, Let):
        names[e.bind.name] = join(names.get(e.bind.name, FIN), expr_type(e.bind.value, names))
        return expr_type(e.body, names)
    if isinstance(e, Fold):
        for _ in range(2):  # state types feed the binds that feed the updates
            for name, init in zip(e.state, e.init):
                names[name] = join(names.get(name, FIN), expr_type(init, names))
            for b in e.binds:
                names[b.name] = join(names.get(b.name, FIN), expr_type(b.value, names))
            for name, upd in zip(e.state, e.update):
                names[name] = join(names.get(name, FIN), expr_type(upd, names))
        return expr_type(e.result, names)
    return FIN


def program_types(*progs: Program) -> dict[str, str]:
    """Types of every input, definition, buffer and fold-state name of the programs."""
    names: dict[str, str] = {}
    for prog in progs:
        for n, _ in prog.inputs:
            names[n] = FIN
    for _ in range(3):  # definitions read each other
        for prog in progs:
            for d in prog.defs:
                names[d.name] = join(names.get(d.name, FIN), expr_type(d.body, names))
    return names
