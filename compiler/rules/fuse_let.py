"""FUSE into a binding: inline a per-row producer into its consumer ONCE, as a `let` at the top.

    before:  def M[r] = max(k < C: X[r, k])        def Y[r, c] = exp(X[r, c] - M[r]) / L[r]
    after:                                         def Y[r, c] = let M_v @register = max(k < C: X[r, k])
                                                                 in exp(X[r, c] - M_v) / L[r]

FUSE (`fuse`) copies the producer's body into every read; here every read of the producer in
the consumer is the same element P[a₁, …], so the consumer binds that element once and reads
the binding.  The value of the binding depends only on the read's indices: when they omit a loop
of the consumer (the row reductions of softmax / LayerNorm omit the column), the binding is
lane-invariant and the lowering computes it once per block (a block reduction).
Preconditions: the producer is a definition, not the output, with the plain untiled, unmapped,
unguarded store P[i, …]; the consumer reads it, always at the same index, and each index is a
loop of the consumer with the producer loop's extent (so the read is in range); nothing in the
consumer binds those loops' names.  The producer is removed when nothing else reads it.
Theorem: gen_inline (lean/Derivc/Rules/Fuse.lean, proofs_ci/coq): a read of a generated tensor
in range is its body at the index; a `let` is that substitution.
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import (
    Aff, Binding, Let, Program, Read, all_binders, names_in_program, replace_reads, tensors_read, walk,
)
from . import register
from .base import Facts, Rule, StepParams, drop_def
from .fuse import inlinable_producer, value_at


class FuseLetParams(StepParams):
    producer: str
    """the per-row definition to compute once, as a `let` at the top of the consumer"""
    def_: str = Field(alias="def")
    """the consumer that reads the producer"""
    name: str | None = None
    """the binding's name (default: <producer>_v)"""
    new_names = ("name",)


class FuseLet(Rule):
    name = "fuse_let"
    kind = "FUSE"
    theorem = "gen_inline"
    Params = FuseLetParams

    def check(self, prog: Program, p: FuseLetParams) -> Facts:
        prod = inlinable_producer(self, prog, p.producer)
        cons = self.get_def(prog, p.def_)
        if prod.name == cons.name:
            raise self.fail(f"{prod.name} cannot be bound inside itself")
        reads = [x for x in walk(cons.body) if isinstance(x, Read) and x.tensor == prod.name]
        if not reads:
            raise self.fail(f"{cons.name} does not read {prod.name}")
        idx = reads[0].idx
        if any(r.idx != idx for r in reads):
            shown = sorted({f"{prod.name}[{', '.join(map(str, r.idx))}]" for r in reads})
            raise self.fail(f"{cons.name} reads {prod.name} at different indices ({', '.join(shown)}); "
                            "one binding holds one element (use fuse)")
        loops = {lp.var: lp for lp in cons.loops}
        bound = all_binders(cons.body)
        for k, (a, plp) in enumerate(zip(idx, prod.loops)):
            v = next(iter(a.names()), None)
            if a != Aff.of(v or "") or v not in loops:
                raise self.fail(f"index {a} of the read {prod.name}[{', '.join(map(str, idx))}] is not a loop of "
                                f"{cons.name}; the binding sits above every reduction")
            if loops[v].ext != plp.ext or v in bound:
                raise self.fail(f"loop {v} < {loops[v].ext} of {cons.name} is not the producer's {plp.var} < {plp.ext}: "
                                "the read may leave the producer's range")
        if p.name is not None:
            self.require_new_name(prog, p.name, "name")
        name = p.name or _fresh(f"{prod.name}_v", names_in_program(prog))
        others = [d.name for d in prog.defs if d.name not in (cons.name, prod.name) and prod.name in tensors_read(d.body)]
        return {"producer": prod.name, "into": [cons.name], "binding": name, "index": [str(a) for a in idx],
                "reads_bound": len(reads), "removes_producer": not others,
                "lane_invariant_over": [lp.var for lp in cons.loops if all(lp.var not in a.names() for a in idx)]}

    def rewrite(self, prog: Program, p: FuseLetParams, facts: Facts) -> Program:
        prod, cons = prog.def_named(p.producer), prog.def_named(p.def_)
        name = facts["binding"]
        # the producer's own names leave with it: renamed apart from the rest only (as `fuse`)
        others = replace(prog, defs=tuple(x for x in prog.defs if x.name != prod.name))
        taken = set(names_in_program(others)) | {name}
        idx = next(x.idx for x in walk(cons.body) if isinstance(x, Read) and x.tensor == prod.name)
        value = value_at(prod, idx, taken)
        body = replace_reads(cons.body, prod.name, lambda r: Read(name, ()))
        prog = prog.with_def(replace(cons, body=Let(Binding(name, (), value, "register"), body)))
        if facts["removes_producer"]:
            prog = drop_def(prog, prod.name)
        return prog


def _fresh(base: str, taken: frozenset[str]) -> str:
    from ..ir import fresh

    return fresh(base, taken)


register(FuseLet())
