"""ASSOC: factor a term that does not depend on the summed index out of a sum.

    before:  sum(j < N: [g] ? exp(s[j] - M) / L * V[j, d] : 0)
    after:   sum(j < N: [g] ? exp(s[j] - M) * V[j, d] : 0) / L

Zero-guards move outward first (([g] ? a : 0)·b = [g] ? a·b : 0); the sum's body (under the
guard) is read as a product of
factors and divisors; those that use neither the summed index nor anything bound inside the
sum are moved outside, in order.  Exact over the reals (distributivity, commutativity and
associativity of +, ·); in floating point the tolerance policy bounds the difference.
This is FA2's "divide by l once at the end".
Theorem: sumTo_factor (lean/Derivc/Rules/Assoc.lean, proofs_ci/coq).
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import Bin, Const, Expr, Program, Reduce, Select, free_indices, tensors_read
from . import register
from .base import Facts, Rule, StepParams, find_binder, replace_node


class AssocParams(StepParams):
    def_: str = Field(alias="def")
    """the definition whose sum has factors that do not use the summed index"""
    index: str
    """the summed index to factor the constant terms out of"""


def hoist_guards(e: Expr) -> Expr:
    """Move zero-guards out of products: ([g] ? a : 0) * b = [g] ? a * b : 0 (also for /)."""
    if isinstance(e, Bin) and e.op in ("*", "/"):
        a, b = hoist_guards(e.a), hoist_guards(e.b)
        zero = Const(0.0)
        if isinstance(a, Select) and a.other == zero:
            return _guard(a.conds, hoist_guards(Bin(e.op, a.then, b)))
        if e.op == "*" and isinstance(b, Select) and b.other == zero:
            return _guard(b.conds, hoist_guards(Bin(e.op, a, b.then)))
        return Bin(e.op, a, b)
    return e


def _guard(conds, e: Expr) -> Expr:
    if isinstance(e, Select) and e.other == Const(0.0):
        return Select(tuple(conds) + e.conds, e.then, e.other)
    return Select(tuple(conds), e, Const(0.0))


def _split_guard(body: Expr) -> tuple[Expr, tuple]:
    body = hoist_guards(body)
    if isinstance(body, Select) and body.other == Const(0.0):
        return body.then, body.conds
    return body, ()


def factors(e: Expr) -> list[tuple[Expr, bool]]:
    """e as a product: [(factor, is_divisor)], left to right."""
    if isinstance(e, Bin) and e.op == "*":
        return factors(e.a) + factors(e.b)
    if isinstance(e, Bin) and e.op == "/":
        return factors(e.a) + [(e.b, True)]
    return [(e, False)]


def product(parts: list[tuple[Expr, bool]]) -> Expr:
    out: Expr | None = None
    for f, div in parts:
        if out is None:
            out = Bin("/", Const(1.0), f) if div else f
        else:
            out = Bin("/" if div else "*", out, f)
    return out if out is not None else Const(1.0)


class Assoc(Rule):
    name = "assoc"
    kind = "ASSOC"
    theorem = "sumTo_factor"
    Params = AssocParams

    def check(self, prog: Program, p: AssocParams) -> Facts:
        d = self.get_def(prog, p.def_)
        self.require_index(d, p.index, "index")
        node = find_binder(d, p.index)
        if not isinstance(node, Reduce) or node.op != "sum":
            raise self.fail(f"index {p.index} of {p.def_} is not a sum")
        body, conds = _split_guard(node.body)
        parts = factors(body)
        local = {n for n, _ in prog.inputs} | {x.name for x in prog.defs}
        out = [f for f, _ in parts if p.index not in free_indices(f) and tensors_read(f) <= local]
        if not out:
            raise self.fail(f"every factor of the sum over {p.index} depends on {p.index}; nothing to factor out")
        if len(out) == len(parts):
            raise self.fail(f"no factor of the sum depends on {p.index}")
        return {"factored": [_show(f) for f in out], "guard_kept": bool(conds), "site": node}

    def rewrite(self, prog: Program, p: AssocParams, facts: Facts) -> Program:
        d = prog.def_named(p.def_)
        node: Reduce = facts["site"]
        body, conds = _split_guard(node.body)
        parts = factors(body)
        local = {n for n, _ in prog.inputs} | {x.name for x in prog.defs}
        keep = [(f, dv) for f, dv in parts if not (p.index not in free_indices(f) and tensors_read(f) <= local)]
        move = [(f, dv) for f, dv in parts if (f, dv) not in keep]
        inner = product(keep)
        if conds:
            inner = Select(conds, inner, Const(0.0))
        out: Expr = replace(node, body=inner)
        for f, dv in move:
            out = Bin("/" if dv else "*", out, f)
        return prog.with_def(replace(d, body=replace_node(d.body, node, out)))


def _show(e: Expr) -> str:
    from ..printer import show_expr

    return show_expr(e)


register(Assoc())
