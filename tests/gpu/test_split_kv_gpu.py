"""SPLIT-KV decode on the GPU: examples/decode_splitkv.yaml built by `derivc build` into a chain
of kernels (OUT/kernels/O_part/, OUT/kernels/O/: the partial folds, then the combine;
compiler/kernel_chain.py), loaded by `derivc.load` (codegen/chain.py) and run one after the other.

The partial kernel is the mma.sync online fold (codegen/mappings/online_fold.py: a 16-row query
tile per warp, split ks folding the key tiles ks, S + ks, …, its state (acc, m, l) stored), the
combine SIMT.  Against float64 torch on the fp16 inputs at Nk = 1 (fifteen of sixteen splits
empty), 63, 65, 100 (twelve empty), 1000, 4097 (tails), B / H mixed, for the example's 16 splits
and variants with 3, 8 and 32 (a 3-stage ring); several query rows (Nq = 5, 17: speculative
decoding); determinism: two runs give the same bits (no atomics: each split writes its own
slot, the combine adds them in split order).

    python -m pytest -q -m gpu tests/gpu/test_split_kv_gpu.py -s
    python tests/gpu/test_split_kv_gpu.py          # decode timings vs torch SDPA
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.gpu
DECODE = ROOT / "examples" / "decode_splitkv.yaml"
GQA = ROOT / "examples" / "decode_splitkv_gqa.yaml"
SHAPES = [(1, 32, 32768), (4, 32, 32768), (8, 32, 4096), (64, 8, 2048)]  # (B, H, Nk), the decode targets
SPLITS_BENCH = ((16, 2), (8, 2), (32, 2), (64, 2), (16, 3), (32, 3))  # (splits, stages) timed; the example's first


@lru_cache(maxsize=None)
def load_decode(path: Path = DECODE):
    """The example built by `derivc build` (codegen, NVRTC, no proofs) and loaded by `derivc.load`:
    a KernelChain of the partial kernel and the combine kernel."""
    import derivc
    from compiler.cli import build_to

    out = Path(tempfile.mkdtemp(prefix="derivc-splitkv-")) / path.stem
    build_to(path, out, seed=0, proofs=False)
    chain = derivc.load(out)
    assert [k.name for k in chain.kernels] == ["O_part", "O"]
    return chain


@lru_cache(maxsize=None)
def load_splits(splits: int, stages: int = 2):
    """The example with `splits` splits and a K / V ring of `stages` (the same schedule otherwise)."""
    text = re.sub(r"splits: \d+}", f"splits: {splits}}}", DECODE.read_text())
    text = re.sub(r"stages: \d+}", f"stages: {stages}}}", text)
    path = Path(tempfile.mkdtemp(prefix="derivc-splitkv-src-")) / f"decode_splitkv_{splits}_{stages}.yaml"
    path.write_text(text)
    return load_decode(path)


def run_decode(chain, q, k, v):
    """(O, (the partial states O_part, O_part_m, O_part_l)) of one call."""
    t = chain.tensors(q, k, v)
    return t["O"], (t["O_part"], t["O_part_m"], t["O_part_l"])


def reference(torch, q, k, v):
    s = torch.einsum("bhie,bhje->bhij", q.double(), k.double()) / math.sqrt(q.shape[-1])
    return torch.einsum("bhij,bhjd->bhid", torch.softmax(s, dim=-1), v.double())


@pytest.fixture(scope="module")
def chain():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return load_decode()


@pytest.mark.parametrize("b,h,nk", [(1, 4, 1), (2, 4, 63), (1, 2, 65), (2, 3, 100), (2, 3, 1000), (1, 8, 4097)])
@pytest.mark.parametrize("logits", [1.0, 8.0])
@pytest.mark.parametrize("splits,stages", [(16, 2), (3, 2), (8, 2), (32, 3)])
def test_decode_against_float64(chain, splits, stages, b, h, nk, logits):
    _check_decode(chain if (splits, stages) == (16, 2) else load_splits(splits, stages), splits, b, h, 1, nk, logits)


@pytest.mark.parametrize("nq,nk", [(5, 300), (17, 4097)])
def test_several_query_rows_against_float64(chain, nq, nk):
    """Speculative decoding's query rows: one 16-row tile (Nq = 5), two with a one-row tail (17)."""
    _check_decode(chain, 16, 2, 4, nq, nk, 1.0)


def _check_decode(chain, splits, b, h, nq, nk, logits):
    import torch

    g = torch.Generator(device="cuda").manual_seed(nk * 7 + b)
    q = (torch.randn(b, h, nq, 128, device="cuda", generator=g) * logits).half()
    k = torch.randn(b, h, nk, 128, device="cuda", generator=g).half()
    v = torch.randn(b, h, nk, 128, device="cuda", generator=g).half()
    o, (o_part, m, l) = run_decode(chain, q, k, v)
    torch.cuda.synchronize()
    want = reference(torch, q, k, v)
    assert not torch.isnan(o).any()
    err = (o.double() - want).norm() / want.norm()
    assert err < 5e-3, f"relative error {err:.3g} at S={splits} B={b} H={h} Nq={nq} Nk={nk} logits x{logits}"
    tiles = -(-nk // 32)  # key tiles of 32
    assert m.shape == (b, h, nq, splits)
    if tiles < splits:  # splits past the last tile: (-inf, 0, 0)
        assert torch.isneginf(m[..., tiles:]).all() and (l[..., tiles:] == 0).all()


@pytest.mark.parametrize("b,nk", [(1, 1), (2, 100), (1, 4097)])
def test_gqa_decode_against_float64(b, nk):
    """32 query heads over 8 K / V heads: Q [B, 8, 4, 1, D] is torch's [B, 32, 1, D]."""
    import torch

    chain = load_decode(GQA)
    g = torch.Generator(device="cuda").manual_seed(nk)
    q = torch.randn(b, 32, 1, 128, device="cuda", generator=g).half()
    k = torch.randn(b, 8, nk, 128, device="cuda", generator=g).half()
    v = torch.randn(b, 8, nk, 128, device="cuda", generator=g).half()
    o = chain(q.view(b, 8, 4, 1, 128), k, v)
    torch.cuda.synchronize()
    want = reference(torch, q, k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1))
    err = (o.reshape(b, 32, 1, 128).double() - want).norm() / want.norm()
    assert err < 5e-3, f"relative error {err:.3g} at B={b} Nk={nk}"


def test_two_runs_same_bits(chain):
    import torch

    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(4, 32, 1, 128, device="cuda", generator=g).half()
    k = torch.randn(4, 32, 3000, 128, device="cuda", generator=g).half()
    v = torch.randn(4, 32, 3000, 128, device="cuda", generator=g).half()
    o1, p1 = run_decode(chain, q, k, v)
    o2, p2 = run_decode(chain, q, k, v)
    torch.cuda.synchronize()
    assert torch.equal(o1, o2) and all(torch.equal(x, y) for x, y in zip(p1, p2))



TUNED_DECODE = {"decode_splitkv_tuned.yaml": ("B", "H", 1), "decode_splitkv_gqa_tuned.yaml": ("B", "HK", 4)}


@pytest.mark.parametrize("example", sorted(TUNED_DECODE))
def test_tuned_decode_dispatch(example, tmp_path):
    """The tuned decode examples: `derivc tune` (the pruning rule) at a long-cache and a many-pairs
    shape, the table re-checked, and the loaded TunedChain running the recorded variant per
    bucket, against float64, same bits twice; a bucket nobody measured runs the default."""
    import json

    import torch

    import derivc
    from codegen import tune_cmd
    from prebuilt import build_or_prebuilt
    from compiler.tuning_table import bucket, read_tuning
    from compiler.variant_build import built_dirs

    heads, hk_name, group = TUNED_DECODE[example]
    out = tmp_path / "tuned"
    build_or_prebuilt(ROOT / "examples" / example, out)
    shapes = [(1, 32 // group, 8192), (16, 8 // group * 2, 1000)]  # (B, K/V heads, Nk)
    args = argparse.Namespace(dir=str(out), output=None, no_proofs=True, seed=0, budget=None, keep=2,
                              sizes=[f"B={b},{hk_name}={hk},Nq=1,Nk={nk}" for b, hk, nk in shapes])
    assert tune_cmd.main(args) == 0
    table = read_tuning(out, set(built_dirs(out)))
    chain = derivc.load(out)
    for b, hk, nk in shapes + [(3, 2, 77)]:
        g = torch.Generator(device="cuda").manual_seed(nk + b)
        q = torch.randn(b, hk * group, 1, 128, device="cuda", generator=g).half()
        k = torch.randn(b, hk, nk, 128, device="cuda", generator=g).half()
        v = torch.randn(b, hk, nk, 128, device="cuda", generator=g).half()
        qx = q if group == 1 else q.view(b, hk, group, 1, 128)
        row = table["buckets"].get(bucket({"B": b, hk_name: hk, "Nq": 1, "Nk": nk}, tuple(table["dynamic"])))
        want_variant = row["variant"] if row else json.loads((out / "variants.json").read_text())["default"]
        assert chain.variant_at(tuple(tuple(x.shape) for x in (qx, k, v))) == want_variant
        o1, o2 = chain(qx, k, v), chain(qx, k, v)
        torch.cuda.synchronize()
        assert torch.equal(o1, o2)
        want = reference(torch, q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1))
        err = (o1.reshape(b, hk * group, 1, 128).double() - want).norm() / want.norm()
        assert err < 5e-3, f"{example} {want_variant}: relative error {err:.3g} at B={b} Nk={nk}"

def bench(shapes=SHAPES, iters: int = 50) -> None:
    """Decode timings: derivc's two kernels vs torch SDPA, and the bandwidth of reading K and V."""
    import torch
    import torch.nn.functional as F

    chain = load_decode()

    def time_ms(fn) -> float:
        for _ in range(5):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(40_000_000)  # the host queues every call while the GPU waits: device time, not Python's
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters

    chains = {(16, 2): chain, **{v: load_splits(*v) for v in SPLITS_BENCH if v != (16, 2)}}
    print(f"{'B':>3} {'H':>3} {'Nk':>6} {'S':>3} {'st':>2}  {'derivc ms':>9}  {'SDPA ms':>8}  {'ratio':>6}  {'KV GB/s':>8}")
    for b, h, nk in shapes:
        q = torch.randn(b, h, 1, 128, device="cuda").half()
        k = torch.randn(b, h, nk, 128, device="cuda").half()
        v = torch.randn(b, h, nk, 128, device="cuda").half()
        sdpa = time_ms(lambda: F.scaled_dot_product_attention(q, k, v))
        for sp, st in SPLITS_BENCH:  # the example (16 splits, 2 stages) first, then the variants
            ours = time_ms(lambda: chains[sp, st](q, k, v))
            gbs = 2 * b * h * nk * 128 * 2 / (ours * 1e-3) / 1e9
            print(f"{b:>3} {h:>3} {nk:>6} {sp:>3} {st:>2}  {ours:>9.3f}  {sdpa:>8.3f}  {sdpa / ours:>6.2f}  {gbs:>8.0f}")
    gqa = load_decode(GQA)
    for b, nk in ((1, 32768), (4, 32768), (8, 4096)):  # 32 query / 8 K-V heads (packed rows: tests/gpu/test_gqa_decode_gpu.py)
        q = torch.randn(b, 32, 1, 128, device="cuda").half()
        k = torch.randn(b, 8, nk, 128, device="cuda").half()
        v = torch.randn(b, 8, nk, 128, device="cuda").half()
        ours = time_ms(lambda: gqa(q.view(b, 8, 4, 1, 128), k, v))
        try:
            sdpa = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        except TypeError:  # torch < 2.5: no enable_gqa, SDPA on K / V repeated per query head
            kr, vr = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
            sdpa = time_ms(lambda: F.scaled_dot_product_attention(q, kr, vr))
        gbs = 2 * b * 8 * nk * 128 * 2 / (ours * 1e-3) / 1e9
        print(f"GQA {b:>3} 32/8 {nk:>6}  {ours:>9.3f}  {sdpa:>8.3f}  {sdpa / ours:>6.2f}  {gbs:>8.0f}")


if __name__ == "__main__":
    bench()
