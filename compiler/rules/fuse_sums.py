"""FUSE-SUMS: two sums over the same tiles, in the same loop nest, become one fold with two
accumulators: one kernel writing two outputs (the attention backward's dK and dV, as
FlashAttention-2 computes them: one pass over the query tiles per key tile).

    before:  def A[i, ..] = sum(t < E: f(i, .., t))          for i, .. where G
             def B[i, ..] = sum(t < E: g(i, .., t))          (the same nest, store and guard)
    after:   def A[i, ..] = fold(t < E) state (a = 0, b = 0):
                              a := a + f(i, .., t);  b := b + g(i, .., t)
                            result a
               also B[i, ..] = result[1] (= b)

B's loop indices, store, guard and tile index are renamed to A's (its inner binders renamed
apart first), so the two bodies share the loop nest and the tile loop: later steps (CACHE at the
tile index, PARALLEL, MAP-MMA) schedule both sums at once, and one tile staged for the step
serves both.  A value both bodies compute (the recomputed probabilities and scores) is still
written twice in the IR; the kernel computes it once per tile (the printer's common terms).

Sums under a shared outer sum (GQA's dV and dK: sum(g < G: sum(io < T: ..)), the sum over the
query heads g of a K / V head around the query-tile sum): the outer sums over g are the ones
fused, and `inner: io` names A's sum directly inside; B's sum there, over the same extent, is
given the index io (its binders are apart from A's, so this is a renaming of a bound index).  Each
accumulator then adds a sum over io: CACHE at io stages one tile for both and the lowering runs
them as one tile loop carrying both sums inside each group step (codegen/kir/lower.py).

Preconditions: A and B are definitions of this kernel (not written by another step), B an
output of the program (the output or a further one) read by no definition, A writing no
further output yet; both bodies are a sum over the same extent, with no tensor-core or
accumulator facts on that sum; the loop nests have equal extents and mappings, the stores and
guards are equal once B's loop indices are renamed to A's, and A and B have the same dtype
class of store (B keeps its own type).
Theorem: fold_pair_sum (proofs_ci/coq/Rules/FuseSums.v, lean/Derivc/Rules/FuseSums.lean): the
fold of two independent accumulators from (0, 0) ends at (sumTo E f, sumTo E g).  The step's
obligation instantiates it for A's value; B's value is the same theorem's second component,
checked numerically here (every output on every draw) like FOLD-STAT's statistic.  With `inner`
the theorem is the same: the fused sums are the outer ones, over one range (f and g of the
theorem are the inner sums as functions of the outer index), and the inner sums' shared index is
a bound variable's name, invisible in the exported terms (the two lambdas are alpha-equivalent to
the ones before the renaming), so the step's obligation has the same form and proof.
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..ir import AlsoStore, Aff, Bin, Const, Def, Fold, Program, Read, Reduce, names_in_program, subst_index, fresh
from . import register
from .base import Facts, Rule, StepParams, drop_def, freshen_binders, readers_of


class FuseSumsParams(StepParams):
    def_: str = Field(alias="def")
    """the definition whose sum becomes the fold carrying both accumulators"""
    with_: str = Field(alias="with")
    """the definition of the second sum (same tiles, same loop nest), written by the fold as a further output"""
    inner: str | None = None
    """a sum directly inside the fused one (the tile sum under GQA's group sum over g): the second
    body's sum at that place, over the same extent, takes its index, so later steps (CACHE at it,
    the lowering) see one tile loop carrying both sums inside each step of the shared outer sum"""


def shared_inner(a: Reduce, b: Reduce, inner: str) -> str | None:
    """Why b's sum directly inside its outer sum cannot take the index of a's inner sum `inner`
    (None: it can)."""
    ia, ib = a.body, b.body
    if not (isinstance(ia, Reduce) and ia.op == "sum" and ia.var == inner):
        return f"the sum over {a.var} does not hold a sum over {inner} directly"
    if not (isinstance(ib, Reduce) and ib.op == "sum"):
        return f"the second sum over {b.var} does not hold a sum directly"
    if ia.ext != ib.ext:
        return f"the inner sums differ: {inner} < {ia.ext} and {ib.var} < {ib.ext}"
    if ia.mma is not None or ia.acc is not None or ib.mma is not None or ib.acc is not None:
        return "the inner sums carry tensor-core or accumulator facts: fuse the sums before MAP-MMA"
    return None


def with_inner_index(b: Reduce, inner: str) -> Reduce:
    """b with its inner sum's index renamed to `inner` (alpha-renaming of a bound index: b's
    binders are apart from a's names, so `inner` is free in b)."""
    ib: Reduce = b.body  # type: ignore[assignment]
    return replace(b, body=replace(ib, var=inner, body=subst_index(ib.body, ib.var, Aff.of(inner))))


def renamed_like(a: Def, b: Def, taken: set[str]) -> Def:
    """b with its inner binders renamed apart from `taken`, then its loop indices and its outer
    sum's index renamed to a's (same nest: the caller checked the extents)."""
    body = freshen_binders(b.body, taken)
    assert isinstance(body, Reduce) and isinstance(a.body, Reduce)
    tmp = fresh("__fs", taken | {lp.var for lp in a.loops})
    body = replace(body, var=tmp, body=subst_index(body.body, body.var, Aff.of(tmp)))
    store, guard = b.store, b.guard
    temps = [f"{tmp}_{k}" for k in range(len(b.loops))]
    for lp, t in zip(b.loops, temps):  # two passes: a's names may be b's names in another order
        body = subst_index(body, lp.var, Aff.of(t))
        store = tuple(x.subst(lp.var, Aff.of(t)) for x in store)
        guard = tuple(c.subst(lp.var, Aff.of(t)) for c in guard)
    for lp, t in zip(a.loops, temps):
        body = subst_index(body, t, Aff.of(lp.var))
        store = tuple(x.subst(t, Aff.of(lp.var)) for x in store)
        guard = tuple(c.subst(t, Aff.of(lp.var)) for c in guard)
    body = replace(body, var=a.body.var, body=subst_index(body.body, tmp, Aff.of(a.body.var)))
    return replace(b, loops=a.loops, store=store, guard=guard, body=body)


class FuseSums(Rule):
    name = "fuse_sums"
    kind = "FUSE-SUMS"
    theorem = "fold_pair_sum"
    Params = FuseSumsParams

    def check(self, prog: Program, p: FuseSumsParams) -> Facts:
        a = self.get_def(prog, p.def_)
        b = self.get_def(prog, p.with_, "with")
        if a.name == b.name:
            raise self.fail(f"{a.name} cannot be fused with itself")
        for d in (a, b):
            if d.computed_by:
                raise self.fail(f"{d.name} is written by the {d.computed_by}, not by this kernel")
            if not isinstance(d.body, Reduce) or d.body.op != "sum":
                raise self.fail(f"{d.name}'s body is not a sum (FUSE-SUMS pairs two sums over the same tiles)")
            if d.body.mma is not None or d.body.acc is not None:
                raise self.fail(f"{d.name}'s sum over {d.body.var} carries tensor-core or accumulator facts: "
                                "fuse the sums before MAP-MMA")
        if a.also:
            raise self.fail(f"{a.name} already writes further outputs ({', '.join(x.name for x in a.also)})")
        if b.also:
            raise self.fail(f"{b.name} writes further outputs ({', '.join(x.name for x in b.also)})")
        if b.name not in (prog.output, *prog.also_outputs()):
            raise self.fail(f"{b.name} is not an output of the program: a sum nothing else reads is no kernel output")
        readers = [x.name for x in readers_of(prog, b.name)]
        if readers:
            raise self.fail(f"{b.name} is read by {', '.join(readers)}: it cannot become a further output")
        if a.level != b.level or len(a.loops) != len(b.loops):
            raise self.fail(f"{a.name} and {b.name} do not have the same loop nest")
        for la, lb in zip(a.loops, b.loops):
            if la.ext != lb.ext or la.mapping != lb.mapping:
                raise self.fail(f"loops {la.var} < {la.ext} of {a.name} and {lb.var} < {lb.ext} of {b.name} "
                                "differ (extent or mapping): the sums are not over the same nest")
        if a.body.ext != b.body.ext:
            raise self.fail(f"{a.name} sums {a.body.var} < {a.body.ext}, {b.name} sums {b.body.var} < {b.body.ext}")
        if a.type.dims != b.type.dims:
            raise self.fail(f"{a.name} and {b.name} have different shapes")
        # apart from A's names (and every tensor's): B's own names may stay as they are
        taken = set(names_in_program(replace(prog, defs=(a,)))) | {d.name for d in prog.defs}
        nb = renamed_like(a, b, set(taken))
        if p.inner is not None:
            why = shared_inner(a.body, nb.body, p.inner)
            if why:
                raise self.fail(f"inner: {why}")
            nb = replace(nb, body=with_inner_index(nb.body, p.inner))
        if nb.store != a.store or nb.guard != a.guard:
            raise self.fail(f"{b.name}'s store or guard differs from {a.name}'s once its loops are renamed")
        sa, sb = fresh(f"acc_{a.name}", taken), fresh(f"acc_{b.name}", taken | {f"acc_{a.name}"})
        return {"with_body": nb.body, "states": [sa, sb], "index": a.body.var, "extent": str(a.body.ext)}

    def rewrite(self, prog: Program, p: FuseSumsParams, facts: Facts) -> Program:
        a, b = prog.def_named(p.def_), prog.def_named(p.with_)
        sa, sb = facts["states"]
        ra: Reduce = a.body  # type: ignore[assignment]
        rb: Reduce = facts["with_body"]
        fold = Fold(ra.var, ra.ext, (sa, sb), (Const(0.0), Const(0.0)), (),
                    (Bin("+", Read(sa, ()), ra.body), Bin("+", Read(sb, ()), rb.body)),
                    Read(sa, ()), (Read(sb, ()),))
        also = (AlsoStore(b.name, b.type, tuple(range(len(a.store)))),)
        return drop_def(prog.with_def(replace(a, body=fold, also=also)), b.name)


register(FuseSums())
