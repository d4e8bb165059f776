"""What one kernel of a program computes, and what it reads that another build step wrote.

A definition with `computed_by` (a backward kernel reading the forward's output, or the LSE an
earlier kernel wrote) keeps its meaning in the program — every numeric check evaluates it — but
the kernel receives the tensor as an argument.  Definitions only such tensors need are meaning
only: no kernel computes them here.
"""
from __future__ import annotations

from dataclasses import replace

from .ir import Def, Program, free_indices, tensors_read


def computed_here(prog: Program) -> list[Def]:
    """The definitions the output needs, not through a definition another step writes."""
    by_name = {d.name: d for d in prog.defs}
    live: set[str] = set()
    todo = [prog.output]
    while todo:
        n = todo.pop()
        d = by_name.get(n)
        if d is None or n in live or d.computed_by:
            continue
        live.add(n)
        todo += sorted(tensors_read(d.body))
    return [d for d in prog.defs if d.name in live]


def kernel_inputs(prog: Program) -> list[str]:
    """The tensors the kernel reads: the program's inputs, then the definitions written
    elsewhere, in the program's order (the kernel's arguments)."""
    reads: set[str] = set()
    for d in computed_here(prog):
        reads |= tensors_read(d.body)
    names = [n for n, _ in prog.inputs] + [n for d in prog.defs if d.computed_by for n in written_by(d)]
    return [n for n in names if n in reads]


def written_by(d: Def) -> list[str]:
    """The tensors a definition writes: itself, then its further outputs (a split fold's m, l)."""
    return [d.name, *(a.name for a in d.also)]


def kernel_view(prog: Program) -> Program:
    """The program as its kernel sees it: the tensors written elsewhere are inputs, and only
    the definitions the kernel computes remain."""
    if not any(d.computed_by for d in prog.defs):
        return prog
    types = {n: t for n, t in prog.inputs} | {d.name: d.type for d in prog.defs} \
        | {a.name: a.type for d in prog.defs for a in d.also}
    inputs = tuple((n, types[n]) for n in kernel_inputs(prog))
    defs = tuple(computed_here(prog))
    # sizes only the other steps' definitions use are not the kernel's
    return replace(prog, sizes=sizes_used(prog, inputs, defs), inputs=inputs, defs=defs)


def sizes_used(prog: Program, inputs: tuple, defs: tuple[Def, ...]) -> tuple:
    """prog's sizes that the inputs' shapes or the definitions use, in prog's order."""
    used: set[str] = set()
    for _, t in inputs:
        used |= set().union(*(a.names() for a in t.dims))
    for d in defs:
        used |= set().union(*(a.names() for a in d.type.dims), *(lp.ext.names() for lp in d.loops))
        used |= free_indices(d.body)
    return tuple((n, v) for n, v in prog.sizes if n in used)


# A program fact naming, in order, the definitions that run as one kernel each: the rule that
# left several definitions on purpose (SPLIT-KV: the partial folds, then the combine) says so.
# A program with several definitions and no such fact is one kernel that lacks a FUSE.
CHAIN_FACT = "kernels"


def kernel_chain(prog: Program) -> tuple[str, ...]:
    """The definitions the program runs as a chain of kernels, in order; () when it is one
    kernel.  ValueError when the fact no longer names the program's definitions (a later step
    added or fused one)."""
    named = tuple(n for n in dict(prog.facts).get(CHAIN_FACT, "").split(",") if n)
    if not named:
        return ()
    defs = tuple(d.name for d in prog.defs)
    if named != defs:
        raise ValueError(f"the program's {CHAIN_FACT} fact names the kernels {', '.join(named)}, but its "
                         f"definitions are {', '.join(defs)}: each definition of a chain is one kernel")
    return named
