"""examples/gemm_splitk_tiles_tuned.yaml: one tuned GEMM build over output tiles x split-K factors.

Every variant is built like a schedule (derived, lowered, printed, its text run on the CPU through
the emulation against float64 at the check sizes M = 150, N = 270, K = 300: tails on every tile,
fewer k tiles than S for S = 8, 16) or listed as refused with its reason; S = 1 is the one-kernel
GEMM (no SPLIT-K step, no chain: the derivation lists the dropped steps), S > 1 a chain of the
partial sums on wgmma and the vectorised combine.  A tuned build mixing both loads as a
TunedChain that runs the bucket's variant — one kernel or a chain — here through the emulation.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from codegen.emu import host_compiler

pytestmark = pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler")

ROOT = Path(__file__).resolve().parents[1]
TUNED = ROOT / "examples" / "gemm_splitk_tiles_tuned.yaml"
CHECK = {"M": 150, "N": 270, "K": 300}


@pytest.fixture(scope="module")
def built(example_build) -> Path:
    """The run's shared build of the example (seed 0, no proofs; read-only)."""
    b = example_build(TUNED)
    assert b.rc == 0, b.stderr
    return b.out


def _kernel_records(d: Path) -> list[dict]:
    trace = json.loads((d / "derivation.json").read_text())
    return [s for s in trace["steps"] if s.get("rule") == "kernel"]


def test_every_variant_is_a_checked_kernel_or_chain_or_refused(built):
    table = json.loads((built / "variants.json").read_text())
    rows = table["variants"]
    assert len(rows) == 30 and rows[0]["choice"] == {"tile_i": 128, "tile_j": 256, "split_k": 1}
    refused = {r["name"]: r["reason"] for r in rows if r["status"] == "refused"}
    assert all(refused.values())
    # 256 x 256: 4 stages of 256 x 64 and 64 x 256 f16 tiles need more shared memory than a block has
    assert set(refused) == {f"tile_i-256_tile_j-256_split_k-{s}" for s in (1, 2, 4, 8, 16)}
    assert all("shared memory" in why for why in refused.values())
    built_rows = [r for r in rows if r["status"] == "built"]
    assert len(built_rows) == 25
    for r in built_rows:
        d = built / r["dir"]
        trace = json.loads((d / "derivation.json").read_text())
        assert trace["variant"] == r["choice"]
        rules = [s["rule"] for s in trace["steps"]]
        if r["choice"]["split_k"] == 1:
            assert (d / "kernel.cu").is_file() and not (d / "kernels.json").exists()
            assert "split_k" not in rules
            assert "split_k" in [x["rule"] for x in trace["variant_dropped_steps"]]
            kernels = [d]
        else:
            manifest = json.loads((d / "kernels.json").read_text())
            assert [k["name"] for k in manifest["kernels"]] == ["C_part", "C"]
            assert manifest["kernels"][0]["outputs"][0]["shape"][0] == str(r["choice"]["split_k"])
            assert "split_k" in rules
            kernels = [d / "kernels" / "C_part", d / "kernels" / "C"]
            combine = _kernel_records(kernels[1])[0]
            assert combine["facts"]["mapping"] == "combine"
        for k in kernels:
            recs = _kernel_records(k)
            assert recs and all(rec["numeric"]["passed"] for rec in recs)
            assert any(dr["sizes"] == CHECK for rec in recs for dr in rec["numeric"]["draws"])


def _fake_table(built: Path, rows: dict[str, tuple[dict, str]]) -> None:
    from compiler.tuning_table import TUNING_FILE, bucket

    names = {r["name"] for r in json.loads((built / "variants.json").read_text())["variants"] if r["status"] == "built"}
    buckets = {}
    for key_sizes, winner in rows.values():
        assert winner in names
        ms = {n: 2.0 for n in names}
        ms[winner] = 1.0
        buckets[bucket(key_sizes, ("M", "N", "K"))] = {"sizes": key_sizes, "variant": winner, "ms": ms}
    (built / TUNING_FILE).write_text(json.dumps({"dynamic": ["M", "N", "K"], "device": "test", "buckets": buckets}))


def test_the_tuned_build_runs_the_bucket_variant_one_kernel_or_chain(built, tmp_path):
    """A square bucket recorded for the one-kernel GEMM, a skinny one for S = 8 on 64 x 128 tiles,
    a deep one for S = 4: each call runs its bucket's variant (the default elsewhere), and every
    one gives the float64 product."""
    import derivc
    from codegen.tuned import OneKernel, TunedChain
    from codegen.chain import KernelChain

    built = Path(shutil.copytree(built, tmp_path / "tuned", symlinks=True))  # the shared build stays as built
    square, skinny, deep = {"M": 130, "N": 260, "K": 150}, {"M": 20, "N": 40, "K": 600}, {"M": 40, "N": 24, "K": 1000}
    _fake_table(built, {"square": (square, "tile_i-128_tile_j-128_split_k-1"),
                        "skinny": (skinny, "tile_i-64_tile_j-128_split_k-8"),
                        "deep": (deep, "tile_i-128_tile_j-128_split_k-4")})
    k = derivc.load(built, device="emu")
    assert isinstance(k, TunedChain)
    rng = np.random.default_rng(0)
    cases = ((square, "tile_i-128_tile_j-128_split_k-1", OneKernel),
             (skinny, "tile_i-64_tile_j-128_split_k-8", KernelChain),
             (deep, "tile_i-128_tile_j-128_split_k-4", KernelChain),
             ({"M": 3, "N": 5, "K": 7}, "tile_i-128_tile_j-256_split_k-1", OneKernel))
    for sizes, want, kind in cases:
        a = rng.standard_normal((sizes["M"], sizes["K"])).astype(np.float16)
        b = rng.standard_normal((sizes["K"], sizes["N"])).astype(np.float16)
        assert k.variant_at((a.shape, b.shape)) == want
        c = k(a, b)
        assert isinstance(k._by_shape[((a.shape, b.shape), ())], kind)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert np.linalg.norm(np.asarray(c, np.float64) - ref) / np.linalg.norm(ref) < 2e-3
