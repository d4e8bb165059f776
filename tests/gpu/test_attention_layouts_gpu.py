"""[B, N, H, D] attention and grouped-query attention on the tensor-core fold mappings, on the GPU.

Every new example (and its mma.sync twin: the same spec, the mma.sync schedule of
flash_attention.yaml; GQA also on SIMT, whose printer decodes the shared grid axis the same way)
at odd sequence lengths, against the float64 interpreter (two input sets,
one with logits x8) and against torch SDPA (K / V repeat_interleave'd over the group for GQA).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("flash_attention_wgmma_bnhd", "attention_gqa")
MAPPINGS = ("wgmma", "mma_sync")


def spec_text(example: str, mapping: str) -> str:
    """The example, or its mma.sync twin (64-key tiles, two stages: flash_attention.yaml's schedule)."""
    text = (ROOT / "examples" / f"{example}.yaml").read_text()
    if mapping == "wgmma":
        return text
    if mapping == "wgmma_gx":  # g and the query tiles share grid.x: the query tile is decoded (mod), heaviest first
        for old, new in (("index: g, to: grid.y}", "index: g, to: grid.x}"), (f"name: {example}", f"name: {example}_gx")):
            assert old in text, old
            text = text.replace(old, new)
        return text
    if mapping == "simt":  # the generic printer: shared grid axes there too
        text = re.sub(r"  - \{rule: map_mma.*\n", "", text)
        for old, new in (("size: 128", "size: 32"), ("stages: 3", "stages: 1"), ("count: 8", "count: 1"),
                         ("tensor: Q, over: [ii, e], level: register", "tensor: Q, over: [ii, e], level: shared"),
                         (f"name: {example}", f"name: {example}_simt")):
            assert old in text, old
            text = text.replace(old, new)
        return text
    for old, new in (("instr: wgmma", "instr: mma_sync"), ("index: j, size: 128", "index: j, size: 64"),
                     ("index: j_, size: 128", "index: j_, size: 64"), ("stages: 3", "stages: 2"),
                     (f"name: {example}", f"name: {example}_mma_sync")):
        assert old in text, old
        text = text.replace(old, new)
    return text


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import derivc
    from compiler.cli import build_to

    root = tmp_path_factory.mktemp("layouts")
    cache = {}

    def get(example: str, mapping: str):
        key = (example, mapping)
        if key not in cache:
            path = root / f"{example}_{mapping}.yaml"
            path.write_text(spec_text(example, mapping))
            out = root / f"{example}_{mapping}"
            d = build_to(path, out, proofs=False)
            kernel = derivc.load(out)
            assert (kernel.plan.mma if kernel.plan else "simt") == mapping.removesuffix("_gx")
            cache[key] = (d, kernel)
        return cache[key]

    return get


def _sizes(example: str, n: int, g: int) -> dict[str, int]:
    return {"B": 2, "H": 3, "N": n} if example.endswith("bnhd") else {"B": 2, "HK": 2, "G": g, "N": n}


CASES = [(e, m, n, g) for e in EXAMPLES for m in MAPPINGS for n in (1, 77, 333)
         for g in ((1, 2, 4) if e == "attention_gqa" else (1,))]
CASES += [("attention_gqa", "simt", n, g) for n in (1, 77) for g in (1, 2, 4)]
CASES += [("attention_gqa", "wgmma_gx", n, g) for n in (1, 77, 333) for g in (1, 2, 4)]


@pytest.mark.parametrize("example,mapping,n,g", CASES)
def test_matches_the_float64_interpreter(built, example, mapping, n, g):
    from codegen.run_cmd import check_kernel

    derivation, kernel = built(example, mapping)
    for seed, scale in ((1, 1.0), (2, 8.0)):
        r = check_kernel(kernel, derivation.programs[0], _sizes(example, n, g), seed=seed, scale=scale)
        assert not r["nan"], f"{example} {mapping} N={n} G={g}: NaN in the output"
        assert r["passed"], f"{example} {mapping} N={n} G={g}: rel error {r['rel_error']:.3e} > {r['tolerance']:.0e}"


@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("n", (1, 77, 333, 1000))
def test_bnhd_matches_torch_sdpa(built, mapping, n):
    import torch.nn.functional as F

    _, kernel = built("flash_attention_wgmma_bnhd", mapping)
    q, k, v = (torch.randn(2, n, 4, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    out = kernel(q, k, v)
    assert out.shape == (2, n, 4, 128)
    ref = F.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q, k, v)), is_causal=True)
    err = float((out.float().transpose(1, 2) - ref).norm() / ref.norm())
    assert err < 2e-3, err


@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("g", (1, 2, 4, 8))
@pytest.mark.parametrize("n", (1, 77, 333, 1000))
def test_gqa_matches_torch_sdpa_with_repeated_kv(built, mapping, g, n):
    import torch.nn.functional as F

    _, kernel = built("attention_gqa", mapping)
    b, hk = 2, 3
    q = torch.randn(b, hk * g, n, 128, device="cuda", dtype=torch.float16)  # torch's [B, H, N, D]
    k, v = (torch.randn(b, hk, n, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    out = kernel(q.view(b, hk, g, n, 128), k, v).view(b, hk * g, n, 128)
    ref = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(g, dim=1),
                                         v.float().repeat_interleave(g, dim=1), is_causal=True)
    err = float((out.float() - ref).norm() / ref.norm())
    assert err < 2e-3, f"G={g} N={n}: {err}"
