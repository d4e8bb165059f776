"""A final program of several definitions built as a chain of kernels (compiler/kernel_chain.py):
split-KV decode's partial folds, then the combine, each an ordinary build directory under
OUT/kernels/, loaded by `derivc.load` as one callable and run through the CPU emulation
(codegen/chain.py, device "emu") against float64 at odd key lengths; `derivc verify`'s file
comparison rebuilds all of it and catches a tampered kernel; a program with several definitions
and no `kernels` fact is one kernel that lacks a FUSE, as before.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import derivc
from codegen.emu import host_compiler
from compiler.cli import BuildError, ProofPolicy, build_to, write_one_or_chain
from compiler.derive import derive
from compiler.errors import DerivationError
from compiler.outdir import BUILD_MARKER
from compiler.spec import load_spec_file
from compiler.verify import check_files

pytestmark = pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler")

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "examples" / "decode_splitkv.yaml"
GQA = ROOT / "examples" / "decode_splitkv_gqa.yaml"


@pytest.fixture(scope="module")
def built(example_build):
    """The two examples' builds (the run's shared ones, seed 0; a test that changes one copies it)."""
    out = {}
    for path in (DECODE, GQA):
        b = example_build(path)
        assert b.rc == 0, b.stderr
        out[path.stem] = b.out
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = np.einsum("...ie,...je->...ij", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("...ij,...jd->...id", p / p.sum(-1, keepdims=True), v.astype(np.float64))


def rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


def test_layout_kernels_in_order_each_an_ordinary_build(built):
    out = built["decode_splitkv"]
    m = json.loads((out / "kernels.json").read_text())
    assert [k["name"] for k in m["kernels"]] == ["O_part", "O"]
    assert m["inputs"] == ["Q", "K", "V"] and m["output"] == "O"
    assert m["kernels"][1]["inputs"] == ["O_part", "O_part_m", "O_part_l"]
    assert [(o["name"], o["dtype"]) for o in m["kernels"][0]["outputs"]] == \
        [("O_part", "f32"), ("O_part_m", "f32"), ("O_part_l", "f32")]
    assert (out / BUILD_MARKER).is_file() and not (out / "kernel.cu").exists()
    assert "facts kernels=O_part,O" in (out / "program.txt").read_text()
    for k in m["kernels"]:
        sub = out / k["dir"]
        assert all((sub / f).is_file() for f in ("kernel.cu", "report.md", "derivation.json", BUILD_MARKER))
        trace = json.loads((sub / "derivation.json").read_text())
        assert trace["chain_kernel"]["kernel"] == k["name"]
        assert [s["rule"] for s in trace["steps"]] == ["lowering", "kernel"]
        assert trace["steps"][-1]["numeric"]["passed"]


@pytest.mark.parametrize("nk", [1, 63, 1000])
def test_decode_chain_on_the_cpu_against_float64(built, nk):
    chain = derivc.load(built["decode_splitkv"], device="emu")
    rng = np.random.default_rng(nk)
    q = (rng.standard_normal((2, 3, 1, 128)) * 4).astype(np.float16)
    k, v = (rng.standard_normal((2, 3, nk, 128)).astype(np.float16) for _ in range(2))
    t = chain.tensors(q, k, v)
    o = t["O"]
    assert o.shape == (2, 3, 1, 128) and o.dtype == np.float16
    assert rel(o, attention(q, k, v)) < 2e-3
    assert t["O_part"].dtype == np.float32 and t["O_part_m"].shape == (2, 3, 1, 16)
    tiles = -(-nk // 32)  # splits past the last key tile keep (-inf, 0, 0)
    assert np.all(np.isneginf(t["O_part_m"][..., tiles:])) and np.all(t["O_part_l"][..., tiles:] == 0)
    assert np.all(np.isfinite(t["O_part_m"][..., :min(tiles, 16)]))


@pytest.mark.parametrize("nk", [1, 63, 1000])
def test_gqa_chain_on_the_cpu_against_float64(built, nk):
    """Q [B, HK, G, Nq, D]: the G query heads of a group share their K / V head."""
    chain = derivc.load(built["decode_splitkv_gqa"], device="emu")
    rng = np.random.default_rng(nk + 1)
    q = rng.standard_normal((1, 2, 4, 1, 128)).astype(np.float16)
    k, v = (rng.standard_normal((1, 2, nk, 128)).astype(np.float16) for _ in range(2))
    o = chain(q, k, v)
    want = attention(q, k[:, :, None], v[:, :, None])
    assert o.shape == (1, 2, 4, 1, 128) and rel(o, want) < 2e-3


def test_the_chain_checks_its_arguments(built):
    chain = derivc.load(built["decode_splitkv"], device="emu")
    q = np.zeros((1, 1, 1, 128), np.float16)
    with pytest.raises(ValueError, match=r"expected 3 inputs \(Q, K, V\), got 2"):
        chain(q, q)
    with pytest.raises(ValueError, match="D"):
        chain(q, np.zeros((1, 1, 5, 64), np.float16), np.zeros((1, 1, 5, 64), np.float16))
    with pytest.raises(ValueError, match="device"):
        derivc.load(built["decode_splitkv"], device="tpu")
    with pytest.raises(ValueError, match="out"):
        chain(q, q, q, out=q)


def test_load_refuses_a_tampered_kernel_or_manifest(built, tmp_path):
    out = tmp_path / "dec"
    shutil.copytree(built["decode_splitkv"], out)
    manifest = out / "kernels.json"
    m = json.loads(manifest.read_text())
    m["kernels"].reverse()  # the combine first: it reads what no kernel wrote yet
    manifest.write_text(json.dumps(m))
    with pytest.raises(ValueError, match="kernels.json"):
        derivc.load(out, device="emu")
    shutil.copyfile(built["decode_splitkv"] / "kernels.json", manifest)
    cu = out / "kernels" / "O" / "kernel.cu"
    cu.write_text(cu.read_text().replace("0.0f", "1.0f", 1))
    with pytest.raises(ValueError, match="differs from the kernel the derivation gives"):
        derivc.load(out, device="emu")


def test_verify_rebuilds_the_chain_and_catches_a_tampered_kernel(built, tmp_path):
    out = tmp_path / "dec"
    shutil.copytree(built["decode_splitkv"], out)
    mismatches, same = check_files(out)
    assert mismatches == [] and same > 20
    cu = out / "kernels" / "O_part" / "kernel.cu"
    cu.write_text(cu.read_text() + "// edited\n")
    mismatches, _ = check_files(out)
    assert [(m.path, m.what) for m in mismatches] == [("kernels/O_part/kernel.cu", "altered")]


def test_several_definitions_without_the_fact_still_need_a_fuse(tmp_path):
    """The chain is the derivation's decision: the same program without its `kernels` fact is
    one kernel with two definitions, refused as before."""
    d = derive(load_spec_file(DECODE), str(DECODE), seed=1)
    d.programs[-1] = replace(d.final, facts=())
    with pytest.raises(BuildError, match=r"one kernel needs them fused into one \(FUSE\)"):
        write_one_or_chain(d, tmp_path, codegen=True, proofs=False, policy=ProofPolicy())


def test_a_fact_that_no_longer_names_the_definitions_is_refused(tmp_path):
    d = derive(load_spec_file(DECODE), str(DECODE), seed=1, check=False)
    d.programs[-1] = replace(d.final, facts=(("kernels", "O"),))
    with pytest.raises(DerivationError, match="kernels fact names the kernels O, but its definitions are O_part, O"):
        write_one_or_chain(d, tmp_path, codegen=True, proofs=False, policy=ProofPolicy())


def test_an_unfused_example_is_still_refused_with_the_fuse_message(tmp_path):
    with pytest.raises(BuildError, match=r"one kernel needs them fused into one \(FUSE\)"):
        build_to(ROOT / "examples" / "attention_naive.yaml", tmp_path / "out", seed=0, proofs=False)
    assert not (tmp_path / "out").exists()


def test_a_failing_kernel_of_the_chain_fails_the_build_naming_it(tmp_path, monkeypatch):
    import codegen.build as build

    check = build.check_text

    def failing_combine(d, printed):
        if d.chain_kernel["kernel"] == "O":
            raise build.CodegenError("kernel: the combine disagrees (test)")
        return check(d, printed)

    monkeypatch.setattr(build, "check_text", failing_combine)
    with pytest.raises(BuildError, match=r"the combine disagrees \(test\) \(kernel O of the chain: kernels/O/\)") as err:
        build_to(DECODE, tmp_path / "out", seed=1, proofs=False)
    assert err.value.keep == ("kernels/O/kernel.cu",)
    assert not (tmp_path / "out").exists()
