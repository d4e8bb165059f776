"""Split-K's factor as a schedule variant (examples/gemm_splitk_tuned.yaml): every variant is a
chain of kernels of its own; a tuned chain (DIR/tuning.json, as `derivc tune` writes it) loads
as `derivc.TunedChain`, which runs the recorded variant per shape bucket — here on the CPU
through the emulation (device "emu"); `derivc tune` itself needs the GPU (tests/gpu).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from codegen.emu import host_compiler

pytestmark = pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler")

ROOT = Path(__file__).resolve().parents[1]
TUNED = ROOT / "examples" / "gemm_splitk_tuned.yaml"


pytestmark = [pytestmark, pytest.mark.xdist_group("example-gemm_splitk_tuned")]  # with the build it reads


@pytest.fixture(scope="module")
def built(tmp_path_factory, example_build):
    """A copy of the example's build (the run's shared one, conftest.example_build): a test writes
    a tuning table into it."""
    import shutil

    b = example_build(TUNED)
    assert b.rc == 0, b.stderr[-2000:]
    out = tmp_path_factory.mktemp("splitk_tuned") / "out"
    shutil.copytree(b.out, out, symlinks=True)
    return out


def test_every_variant_is_a_chain(built):
    table = json.loads((built / "variants.json").read_text())
    assert [(r["name"], r["status"]) for r in table["variants"]] == [
        (f"split_k-{s}", "built") for s in (4, 1, 2, 8, 16)]
    for r in table["variants"]:
        manifest = json.loads((built / r["dir"] / "kernels.json").read_text())
        assert [k["name"] for k in manifest["kernels"]] == ["C_part", "C"]
        assert manifest["kernels"][0]["outputs"][0]["shape"][0] == str(r["choice"]["split_k"])


def test_a_tuned_chain_runs_the_recorded_variant(built):
    import derivc
    from codegen.tuned import TunedChain
    from compiler.tuning_table import TUNING_FILE, bucket

    small, skinny = {"M": 130, "N": 260, "K": 150}, {"M": 20, "N": 40, "K": 600}
    rows = {bucket(s, ("M", "N", "K")): {"sizes": s, "variant": v, "ms": {"split_k-2": t2, "split_k-8": t8}}
            for s, v, t2, t8 in ((small, "split_k-2", 1.0, 2.0), (skinny, "split_k-8", 2.0, 1.0))}
    (built / TUNING_FILE).write_text(json.dumps({"dynamic": ["M", "N", "K"], "device": "test", "buckets": rows}))
    try:
        k = derivc.load(built, device="emu")
        assert isinstance(k, TunedChain)
        rng = np.random.default_rng(0)
        default = json.loads((built / "variants.json").read_text())["default"]
        assert default == "split_k-4"  # the example's first value: unmeasured shapes run it
        for sizes, want in ((small, "split_k-2"), (skinny, "split_k-8"), ({"M": 3, "N": 5, "K": 7}, default)):
            a = rng.standard_normal((sizes["M"], sizes["K"])).astype(np.float16)
            b = rng.standard_normal((sizes["K"], sizes["N"])).astype(np.float16)
            assert k.variant_at((a.shape, b.shape)) == want
            c = k(a, b)
            ref = a.astype(np.float64) @ b.astype(np.float64)
            assert np.linalg.norm(np.asarray(c, np.float64) - ref) / np.linalg.norm(ref) < 2e-3
    finally:
        (built / TUNING_FILE).unlink()
