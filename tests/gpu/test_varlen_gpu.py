"""Packed variable-length causal attention on the H200 against torch float64: the cu_seqlens form
(examples/pending/attention_varlen.yaml on wgmma, d128; attention_varlen_mma.yaml on mma.sync,
d64), Q, K, V [T, H, D] with the sequences packed back to back, Seq = the sequence ids from the
offsets (compiler.int_inputs.sequence_ids; here torch.repeat_interleave, the same map).  The
reference is each sequence's causal attention computed alone from the offsets (not the mask
formula): sequences of length 1, one sequence, random lengths 1 to 700 and 128 to 4096."""
from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

EXAMPLES = {"wgmma": ("attention_varlen", 128), "mma_sync": ("attention_varlen_mma", 64)}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    from prebuilt import load_pending

    return load_pending(tmp_path_factory.mktemp("varlen"), EXAMPLES)


def _lengths(layout: str, gen) -> list[int]:
    if layout == "length_1":
        return [1] * 333
    if layout == "one_sequence":
        return [1000]
    lo, hi, total = (1, 700, 4000) if layout == "short" else (128, 4096, 16384)
    out: list[int] = []
    while sum(out) < total:
        out.append(int(torch.randint(lo, hi + 1, (1,), generator=gen).item()))
    return out


def _reference(q, k, v, offsets):
    out = torch.zeros_like(q, dtype=torch.float64)
    D = q.shape[-1]
    for a, b in zip(offsets[:-1], offsets[1:]):
        qs, ks, vs = (x[a:b].double().transpose(0, 1) for x in (q, k, v))  # [H, n, D]
        s = qs @ ks.transpose(1, 2) / math.sqrt(D)
        causal = torch.ones(b - a, b - a, dtype=torch.bool, device=q.device).tril()
        out[a:b] = (torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) @ vs).transpose(0, 1)
    return out


@pytest.mark.parametrize("mapping", list(EXAMPLES))
@pytest.mark.parametrize("layout", ["length_1", "one_sequence", "short", "long"])
def test_varlen_attention_against_torch_float64(kernels, mapping, layout):
    D = EXAMPLES[mapping][1]
    gen = torch.Generator().manual_seed(len(layout))
    lengths = _lengths(layout, gen)
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    T, H = offsets[-1], 4
    g = torch.Generator(device="cuda").manual_seed(T)
    q, k, v = (torch.randn(T, H, D, device="cuda", generator=g).to(torch.float16) for _ in range(3))
    seq = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"), torch.tensor(lengths, device="cuda"))
    out = kernels[mapping](q, k, v, seq.to(torch.int32))
    torch.cuda.synchronize()
    err = (out.double() - _reference(q, k, v, offsets)).abs().max().item()
    assert err <= 2e-2, (mapping, layout, T, err)
