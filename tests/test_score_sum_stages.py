"""codegen.mappings.score_sum_stages: the order a phased score-sum printer forms the values in (the
terms a value can form before its last score tile lands, the row / column reads and the group
that first needs each)."""
from __future__ import annotations

from compiler.ir import Bin, Const, Read, Reduce, Un
from compiler.ir_index import Aff, Ext

from codegen.mappings.score_sum_stages import early_terms, last_group, staged_reads


def _score(name: str) -> Reduce:
    return Reduce("sum", "e", Ext.of(64), Bin("*", Read(f"{name}_a", (Aff.of("i"), Aff.of("e"))),
                                             Read(f"{name}_b", (Aff.of("j"), Aff.of("e")))))


S, DP = _score("S"), _score("dP")
GROUP = {S: 0, DP: 1}
LSE = Read("LSE", (Aff.of("b"), Aff.of("it", 64) + Aff.of("j")))
DSUM = Read("Dsum", (Aff.of("b"), Aff.of("it", 64) + Aff.of("j")))
P = Un("exp", Bin("-", Bin("*", Const(0.125), S), LSE))
DS = Bin("*", P, Bin("-", DP, DSUM))


def test_p_is_an_early_term_of_ds_and_nothing_is_early_in_p():
    assert early_terms((DS,), GROUP) == (P,)
    assert early_terms((P,), GROUP) == ()
    assert early_terms((P, DS), GROUP) == (P,)
    # dP issued first: dP - Dsum is formed early, P once S lands
    assert early_terms((DS,), {S: 1, DP: 0}) == (Bin("-", DP, DSUM),)
    assert last_group(DS, GROUP) == 1 and last_group(P, GROUP) == 0 and last_group(LSE, GROUP) == -1


def test_row_and_column_reads_with_the_group_that_first_needs_them():
    reads = staged_reads((P, DS), (0, 1), "i", "j", "it")
    assert [(r.read.tensor, r.axis, r.first, r.invariant) for r in reads] == [("Dsum", "col", 1, False), ("LSE", "col", 0, False)]
    # rows: the same at every tile of the loop; the score sums' own reads are not the values'
    row_lse = Read("LSE", (Aff.of("b"), Aff.of("rt", 64) + Aff.of("i")))
    reads = staged_reads((Un("exp", Bin("-", S, row_lse)),), (0,), "i", "j", "it")
    assert [(r.read.tensor, r.axis, r.invariant) for r in reads] == [("LSE", "row", True)]
    both = Read("Bias", (Aff.of("i"), Aff.of("j")))
    assert staged_reads((Bin("+", S, both),), (0,), "i", "j", "it") == ()
