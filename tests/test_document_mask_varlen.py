"""Packed variable-length attention (the cu_seqlens form; examples/pending/attention_varlen*.yaml):
the offsets become the sequence-id tensor Seq (compiler.int_inputs.sequence_ids), the mask
j <= i && Seq[i] == Seq[j] and MASK-DATA bound each query tile's key tiles by its sequences.

The printed kernels (wgmma, mma.sync) run through the CPU emulation against the reference computed
sequence by sequence from the offsets (causal attention of each sequence alone, no mask formula),
with sequences of length 1, one sequence, and random lengths across tile edges.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from codegen.emu import run_printed
from compiler.int_inputs import sequence_ids

from tests.test_int_tensors import EXAMPLES, _mutated, _printed

pytestmark = pytest.mark.xdist_group("document_mask")


def test_offsets_become_sequence_ids():
    assert sequence_ids(np.array([0, 1, 4, 4, 9])).tolist() == [0, 1, 1, 1, 3, 3, 3, 3, 3]
    assert sequence_ids(np.array([0])).tolist() == []
    for bad in ([1, 4], [0, 5, 3], []):
        with pytest.raises(ValueError, match="cu_seqlens must start at 0") as info:
            sequence_ids(np.array(bad, dtype=np.int64))
        assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def kernels():
    return {instr: _printed(EXAMPLES / "pending" / name) for instr, name in
            (("wgmma", "attention_varlen.yaml"), ("mma_sync", "attention_varlen_mma.yaml"))}


def _reference(Q, K, V, offsets):
    """Each sequence's causal attention on its own (float64)."""
    out = np.zeros_like(Q)
    D = Q.shape[-1]
    for a, b in zip(offsets[:-1], offsets[1:]):
        for h in range(Q.shape[1]):
            s = Q[a:b, h] @ K[a:b, h].T / math.sqrt(D)
            s = np.where(np.tril(np.ones((b - a, b - a), dtype=bool)), s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[a:b, h] = (p / p.sum(axis=1, keepdims=True)) @ V[a:b, h]
    return out


LENGTHS = {
    "mixed": [1, 130, 1, 77, 91],  # across tile edges (64 and 128), length-1 sequences among them
    "length_1": [1] * 300,
    "one_sequence": [300],
}


def _run(printed, lengths, seed=0):
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    T, H = int(offsets[-1]), 2
    D = printed.plan.head_dim
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.standard_normal((T, H, D)).astype(np.float16).astype(np.float64) for _ in range(3))
    seq = sequence_ids(offsets).astype(np.float64)
    got = np.asarray(run_printed(printed, len(printed.variants) - 1, [Q, K, V, seq], {"T": T, "H": H}), dtype=np.float64)
    return got, _reference(Q, K, V, offsets)


@pytest.mark.parametrize("instr", ["wgmma", "mma_sync"])
@pytest.mark.parametrize("layout", list(LENGTHS))
def test_the_varlen_kernels_match_each_sequence_alone(kernels, instr, layout):
    assert "span_lo_" in kernels[instr].variants[-1].source.source
    got, want = _run(kernels[instr], LENGTHS[layout])
    assert np.abs(got - want).max() <= 2e-2


@pytest.mark.parametrize("instr", ["wgmma", "mma_sync"])
def test_a_span_start_one_tile_late_is_caught(kernels, instr):
    bn = kernels[instr].plan.block_n
    bad = _mutated(kernels[instr], f"span_lo_ = f_ / {bn};", f"span_lo_ = f_ / {bn} + 1;")
    got, want = _run(bad, LENGTHS["mixed"])
    assert np.abs(got - want).max() > 5e-2
