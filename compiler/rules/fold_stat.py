"""FOLD-STAT: the streaming fold also writes its rows' log-sum-exp, a second output.

    before:  def O[b, h, i, d] = <lets> fold(jo < E) state (m = -inf, l = 0, acc = 0):
                                   let m_new = max(m, ...)
                                   m := m_new;  l := l * rescale(m, m_new) + sum(...);  acc := ...
                                 result acc / l
             def LSE[b, h, i] = Mx[b, h, i] + log(sum(j | mask: exp(S[b, h, i, j] - Mx[b, h, i])))
    after:   def O[b, h, i, d] = <lets> fold(...) (unchanged) result acc / l
                                 result[1] m + log(l)
               also LSE[b, h, i] = result[1] where d == 0

The definition of O writes a second tensor from the same final state of its fold: at every row
index (the positions of O's store index that LSE's shape keeps), by the lanes whose other store
coordinates are 0 (d == 0: once per row).  LSE's own definition (and what only it read, Mx) is
removed.  The store index is O's own (`AlsoStore.keep`), so later TILE renames carry it along.

Exactness: ONLINE-AGG's invariant (theorem online_agg's `onlineInv`) says the fold's final
state has l = Σ_{j live} exp(s_j − m) with m the row max of the live scores; so for a row with
a live key m + log l = m + log(e^{−m} Σ exp s_j) = log Σ_{j live} exp(s_j) = LSE.  A row with no
live key ends with m = −∞, l = 0 and log 0 = −∞: the kernel writes −∞, as the spec does
(max over nothing is −∞, log 0 = −∞).
Preconditions: `def`'s body is lets around a fold whose first two states are ONLINE-AGG's
running max and running sum (m := max(m, …), l := l · rescale(m, m') + …, from (−∞, 0));
`stat` is a further output of the program (`output.also`), a plain untiled, unmapped,
unguarded statement read by no other definition, whose shape is O's with some dimensions left
out (one way only).  That `stat` is the log-sum-exp of the fold's scores under the fold's mask
is what the step's numeric check compares (every output, on every draw, −∞ rows exactly);
structurally it is not matched.
Theorem: online_lse (lean/Derivc/Rules/OnlineLse.lean, proofs_ci/coq/Rules/OnlineLse.v): the
fold's final m + log l is log Σ exp of the live scores (log of the algebra's KAlgLog), and a row
with no live key ends at (−∞, 0).  The per-step obligation proves the definition's own value
unchanged; the statistic is not instantiated per step (validated numerically).
"""
from __future__ import annotations

from dataclasses import replace
from itertools import combinations

from pydantic import Field

from ..ir import (
    AlsoStore, Aff, Bin, Const, Def, Expr, Fold, Let, Program, Read, Reduce, Un, tail_fold, tensors_read,
)
from . import register
from .base import Facts, Rule, StepParams, drop_def, readers_of


class FoldStatParams(StepParams):
    def_: str = Field(alias="def")
    """the definition that ends in ONLINE-AGG's (m, l) fold"""
    stat: str
    """the further output (`output.also`) the fold writes as m + log(l), once per row"""


def online_pair(fold: Fold) -> tuple[str, str] | None:
    """The fold's (running max, running sum) states when they have ONLINE-AGG's shape."""
    if len(fold.state) < 2 or fold.init[:2] != (Const(float("-inf")), Const(0.0)):
        return None
    m, l = fold.state[:2]
    new = fold.update[0]
    if not isinstance(new, Read) or new.idx:
        return None
    bind = next((b for b in fold.binds if b.name == new.tensor and not b.dims), None)
    if bind is None or not (isinstance(bind.value, Bin) and bind.value.op == "max" and bind.value.a == Read(m, ())):
        return None
    lu = fold.update[1]
    alpha = Bin("rescale", Read(m, ()), new)
    if not (isinstance(lu, Bin) and lu.op == "+" and lu.a == Bin("*", Read(l, ()), alpha)
            and isinstance(lu.b, Reduce) and lu.b.op == "sum"):
        return None
    return m, l


def stat_value(m: str, l: str) -> Expr:
    """The statistic over the fold's final state: m + log(l)."""
    return Bin("+", Read(m, ()), Un("log", Read(l, ())))


def _keep(out: Def, stat: Def) -> list[tuple[int, ...]]:
    """Every way stat's dimensions are a subsequence of out's (positions of out's store index)."""
    n, k = len(out.type.dims), len(stat.type.dims)
    return [c for c in combinations(range(n), k) if tuple(out.type.dims[i] for i in c) == stat.type.dims]


class FoldStat(Rule):
    name = "fold_stat"
    kind = "FOLD-STAT"
    theorem = "online_lse"
    Params = FoldStatParams

    def check(self, prog: Program, p: FoldStatParams) -> Facts:
        d = self.get_def(prog, p.def_)
        s = self.get_def(prog, p.stat, "stat")
        if s.name == d.name:
            raise self.fail(f"{d.name} cannot write itself a second time")
        fold = tail_fold(d.body)
        if fold is None:
            raise self.fail(f"{d.name}'s body is not a fold (under lets): apply online_agg first")
        pair = online_pair(fold)
        if pair is None:
            raise self.fail(f"{d.name}'s fold does not carry ONLINE-AGG's running max and sum (m, l) as its "
                            "first two states (m from -inf by max, l from 0 rescaled by rescale(m, m_new))")
        if s.name not in prog.also_outputs():
            raise self.fail(f"{s.name} is not a further output of the program (list it in output.also)")
        if s.computed_by or s.also or s.guard or s.level != "global" or any(lp.mapping for lp in s.loops) \
                or s.store != tuple(Aff.of(lp.var) for lp in s.loops):
            raise self.fail(f"{s.name} is not a plain statement (untiled, unmapped, unguarded store {s.name}[loops])")
        readers = [x.name for x in readers_of(prog, s.name)]
        if readers:
            raise self.fail(f"{s.name} is read by {', '.join(readers)}: the fold writes it, nothing may read it first")
        ways = _keep(d, s)
        if len(ways) != 1:
            dims = ", ".join(map(str, s.type.dims))
            why = "is not" if not ways else "is in more than one way"
            raise self.fail(f"{s.name}'s shape [{dims}] {why} {d.name}'s shape with dimensions left out")
        # what only the statistic read (its row max, the scores) goes with it
        reach, todo = set(), [s.name]
        while todo:
            for n in tensors_read(prog.def_named(todo.pop()).body):
                if prog.has_def(n) and n not in reach:
                    reach.add(n)
                    todo.append(n)
        removes = [x.name for x in prog.defs if x.name in reach]
        return {"site": fold, "m": pair[0], "l": pair[1], "keep": list(ways[0]), "removes": removes,
                "value": f"{pair[0]} + log({pair[1]})"}

    def rewrite(self, prog: Program, p: FoldStatParams, facts: Facts) -> Program:
        d, s = prog.def_named(p.def_), prog.def_named(p.stat)
        fold: Fold = facts["site"]
        value = stat_value(facts["m"], facts["l"])
        new_fold = replace(fold, also=fold.also + (value,))
        body = _with_tail(d.body, new_fold)
        also = d.also + (AlsoStore(s.name, s.type, tuple(facts["keep"])),)
        prog = drop_def(prog.with_def(replace(d, body=body, also=also)), s.name)
        outputs = {prog.output, *prog.also_outputs()}
        dropped = True
        while dropped:  # readers first: a row max goes, then the scores only it read
            dropped = False
            for name in facts["removes"]:
                if name not in outputs and prog.has_def(name) and not any(readers_of(prog, name)):
                    prog, dropped = drop_def(prog, name), True
        return prog


def _with_tail(e, fold: Fold):
    if isinstance(e, Let):
        return Let(e.bind, _with_tail(e.body, fold))
    assert isinstance(e, Fold)
    return fold


register(FoldStat())
