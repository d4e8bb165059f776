"""Document masking on the H200 against torch float64: causal attention within documents,
j <= i && Doc[b, i] == Doc[b, j] with Doc an i32 input (examples/pending/attention_document_mask.yaml on
wgmma, d128; attention_document_mask_mma.yaml on mma.sync, d64), at odd lengths (1, 77, 333,
1000, 4096), over document layouts: every document one token, one document, distinct ids (no
two tokens share a document, unsorted), random runs (1 to 4 tokens) and random lengths averaging
256 tokens.  Both kernels bound their key tiles by MASK-DATA's span (computed per block from Doc):
interleaved ids (distinct_ids) make the span every tile, long documents make it narrow.  The
reference is the formula in float64 (not the IR)."""
from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

LENGTHS = (1, 77, 333, 1000, 4096)
LAYOUTS = ("length_1", "one_document", "distinct_ids", "runs", "long_documents")
EXAMPLES = {"wgmma": ("attention_document_mask", 128), "mma_sync": ("attention_document_mask_mma", 64)}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """Each example built once (without proofs: the check here is the run against float64)."""
    from prebuilt import load_pending

    return load_pending(tmp_path_factory.mktemp("docmask"), EXAMPLES)


def _documents(layout: str, B: int, N: int, gen) -> "torch.Tensor":
    if layout == "length_1":
        return torch.arange(N, device="cuda").repeat(B, 1)
    if layout == "one_document":
        return torch.zeros(B, N, device="cuda", dtype=torch.int64)
    if layout == "distinct_ids":
        return torch.randperm(B * N, device="cuda", generator=gen).view(B, N)
    mean = 2.5 if layout == "runs" else 256
    starts = torch.rand(B, N, device="cuda", generator=gen) < 1.0 / mean
    starts[:, 0] = False
    return torch.cumsum(starts.long(), dim=-1)


def _reference(q, k, v, doc):
    q, k, v = q.double(), k.double(), v.double()
    s = torch.einsum("bhie,bhje->bhij", q, k) / math.sqrt(q.shape[-1])
    n = q.shape[2]
    i = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(n, device=q.device)[None, :]
    keep = (j <= i)[None, None] & (doc[:, None, :, None] == doc[:, None, None, :])
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


@pytest.mark.parametrize("mapping", list(EXAMPLES))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", LENGTHS)
def test_document_masked_attention_against_torch_float64(kernels, mapping, layout, n):
    kernel = kernels[mapping]
    D = EXAMPLES[mapping][1]
    B, H = 2, 3
    gen = torch.Generator(device="cuda").manual_seed(n + len(layout))
    q, k, v = (torch.randn(B, H, n, D, device="cuda", generator=gen).to(torch.float16) for _ in range(3))
    doc = _documents(layout, B, n, gen)
    out = kernel(q, k, v, doc.to(torch.int32))
    torch.cuda.synchronize()
    ref = _reference(q, k, v, doc)
    err = (out.double() - ref).abs().max().item()
    assert err <= 2e-2, (mapping, layout, n, err)
