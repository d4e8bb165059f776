"""FUSE: inline a producer definition into its consumers (F4: one kernel, no HBM round trip).

    before:  def P[i, j] = f(i, j)             def O[i, d] = sum(j < N: P[i, j] * V[j, d])
    after:                                     def O[i, d] = sum(j < N: f(i, j) * V[j, d])

Each read P[a, b] becomes f with P's loop indices replaced by the read's index expressions
(the producer's bound indices are renamed apart first).  Preconditions: P is a definition, not
the output; P's loop nest is untiled and unmapped with the plain store P[i, j] and no guard —
a tiled producer and a consumer reading it untiled are mismatched tilings, refused; every read
index stays inside P's extents or under a guard.  With `def` the producer is inlined into that
consumer only; it is removed once nothing reads it.  To compute the producer's value once where a
consumer reads the same element several times (GELU's x, a row's mean), use `fuse_let`.
Theorem: gen_inline (lean/Derivc/Rules/Fuse.lean, proofs_ci/coq).  Inverse: `unfuse`.
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import (
    Aff, Def, Expr, Program, Read, names_in_program, replace_reads, subst_index, tensors_read,
)
from . import register
from .base import Facts, Rule, StepParams, drop_def, freshen_binders, readers_of


class FuseParams(StepParams):
    producer: str
    """the definition to inline into the definitions that read it"""
    def_: str | None = Field(default=None, alias="def")
    """inline into this consumer only (default: every reader)"""


def value_at(producer: Def, idx: tuple[Aff, ...], taken: set[str]) -> Expr:
    """The producer's body at index `idx` (its bound names renamed apart from `taken`)."""
    body = freshen_binders(producer.body, taken)
    temps = [f"__fuse{k}" for k in range(len(producer.loops))]
    for lp, tmp in zip(producer.loops, temps):
        body = subst_index(body, lp.var, Aff.of(tmp))
    for tmp, a in zip(temps, idx):
        body = subst_index(body, tmp, a)
    return body


def inline_reads(consumer: Def, producer: Def, taken: set[str]) -> Def:
    """consumer with every read of producer replaced by producer's body at the read index."""
    return replace(consumer, body=replace_reads(consumer.body, producer.name,
                                                lambda r: value_at(producer, r.idx, taken)))


def inlinable_producer(rule: Rule, prog: Program, name: str) -> Def:
    """The producer FUSE and fuse_let inline: a definition, not the output, with the plain store
    P[i, ...] of an untiled, unmapped, unguarded loop nest (its consumers read it by plain
    indices)."""
    prod = rule.get_def(prog, name, "producer")
    if prod.name == prog.output:
        raise rule.fail(f"{prod.name} is the program's output; it cannot be inlined away")
    plain = tuple(Aff.of(lp.var) for lp in prod.loops)
    if prod.store != plain or prod.guard or any(lp.mapping for lp in prod.loops):
        raise rule.fail(
            f"mismatched tilings: producer {prod.name} stores {prod.name}[{', '.join(map(str, prod.store))}] "
            "with a tiled, mapped or guarded loop nest, while its consumers read it by plain indices; "
            f"{rule.name} before tiling the producer"
        )
    return prod


class Fuse(Rule):
    name = "fuse"
    kind = "FUSE"
    theorem = "gen_inline"
    Params = FuseParams

    def check(self, prog: Program, p: FuseParams) -> Facts:
        prod = inlinable_producer(self, prog, p.producer)
        consumers = [d.name for d in readers_of(prog, prod.name)]
        if not consumers:
            raise self.fail(f"nothing reads {prod.name}")
        if p.def_ is not None:
            self.get_def(prog, p.def_)
            if p.def_ not in consumers:
                raise self.fail(f"{p.def_} does not read {prod.name} (readers: {', '.join(consumers)})")
            targets = [p.def_]
        else:
            targets = consumers
        reads = sum(
            1 for d in prog.defs if d.name in targets
            for e in _reads_of(d.body, prod.name)
        )
        facts = {"producer": prod.name, "into": targets, "reads_inlined": reads,
                 "removes_producer": set(targets) == set(consumers)}
        return facts

    def rewrite(self, prog: Program, p: FuseParams, facts: Facts) -> Program:
        prod = prog.def_named(p.producer)
        others = replace(prog, defs=tuple(x for x in prog.defs if x.name != prod.name))
        taken = set(names_in_program(others))
        for name in facts["into"]:
            prog = prog.with_def(inline_reads(prog.def_named(name), prod, taken))
        if not any(prod.name in tensors_read(d.body) for d in prog.defs):
            prog = drop_def(prog, prod.name)
        return prog


def _reads_of(e: Expr, name: str) -> list[Read]:
    from ..ir import walk

    return [x for x in walk(e) if isinstance(x, Read) and x.tensor == name]


register(Fuse())
