"""Every example's kernel is emitted, compiled to a cubin and its SASS keeps the schedule's
promises; the schedule decides the kernel (change the YAML, the kernel changes)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from codegen.cuda.nvrtc import nvrtc_available
from compiler.cli import build_to
from derivc_testing import EXAMPLES_DIR, NO_KERNEL

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# builds with gradients take 10-35 s each (every backward kernel runs on the CPU): one stays in the
# quick set, the others are marked slow (CI runs them; `-m 'not slow'` leaves them out)
QUICK_GRAD = {"flash_attention_grad"}


def _marked(path: Path):
    slow = path.stem.endswith("_grad") and path.stem not in QUICK_GRAD
    return pytest.param(path, id=path.stem, marks=[pytest.mark.slow] if slow else [])


def test_ci_has_nvrtc():
    if os.environ.get("CI") == "true":
        assert nvrtc_available(), "CI must compile every kernel: run .ci/install_cuda_tools.sh"


@pytest.fixture(scope="module")
def builds(tmp_path_factory, example_build):
    """get(spec) -> its build directory (seed 0, no proofs); an example's is the run's shared one."""
    root = tmp_path_factory.mktemp("kernels")
    cache: dict[str, Path] = {}

    def get(path: Path) -> Path:
        if path.parent == EXAMPLES_DIR:
            b = example_build(path)
            assert b.rc == 0, b.stderr
            return b.out
        if path.stem not in cache:
            out = root / path.stem
            build_to(path, out, seed=0, proofs=False)
            cache[path.stem] = out
        return cache[path.stem]

    return get


@pytest.mark.parametrize("example", [_marked(p) for p in EXAMPLES])
def test_example_kernel_compiles_and_keeps_promises(example: Path, builds, example_build, tmp_path):
    if example.stem in NO_KERNEL:  # derives and checks, but has no kernel: the build says so (exit 3)
        from compiler.cli import BuildError

        with pytest.raises(BuildError, match="definitions"):
            build_to(example, tmp_path / "out", seed=0, proofs=False)
        assert not (tmp_path / "out").exists()
        derived = example_build(example, codegen=False)
        assert derived.rc == 0, derived.stderr
        return
    out = builds(example)
    if (out / "kernels.json").exists():  # a chain of kernels (split-KV decode): each one, in order
        kernels = json.loads((out / "kernels.json").read_text())["kernels"]
        assert len(kernels) >= 2 and not (out / "kernel.cu").exists()
        for k in kernels:
            _keeps_promises(out / k["dir"])
        return
    _keeps_promises(out)
    if yaml.safe_load(example.read_text()).get("grad"):  # and every backward kernel, the same way
        kernels = json.loads((out / "grad.json").read_text())["kernels"]
        assert kernels and all((out / k["dir"] / "kernel.cu").exists() for k in kernels)
        for k in kernels:
            _keeps_promises(out / k["dir"])


def _keeps_promises(out: Path) -> None:
    plan = json.loads((out / "plan.json").read_text())["plan"] or {"mma": None}
    assert (out / "kernel.cu").read_text().count("__global__") == 1
    # the kernel step ran every variant's text on the CPU, every draw within tolerance
    kern = json.loads((out / "derivation.json").read_text())["steps"][-1]
    assert kern["rule"] == "kernel" and kern["numeric"]["passed"]
    variants = {d["variant"] for d in kern["numeric"]["draws"]}
    assert variants == {p.stem for p in out.glob("kernel*.cu")}, variants
    assert all(d["passed"] for d in kern["numeric"]["draws"])
    if not nvrtc_available():
        pytest.skip("NVRTC not installed")
    for stem in ("kernel", "kernel_tma"):
        if not (out / f"{stem}.cu").exists():
            continue
        assert (out / f"{stem}.cubin").read_bytes()[:4] == b"\x7fELF"
        sass = json.loads((out / ("sass.json" if stem == "kernel" else f"{stem}.sass.json")).read_text())
        assert sass.get("violations") == [], sass
        if plan["mma"] == "mma_sync":
            assert sass["hmma"] and sass["local_memory_ops"] == 0
        if plan["mma"] == "wgmma":
            assert sass["hgmma"] and sass["local_memory_ops"] == 0
        if plan["mma"] is None:
            assert not sass["hmma"] and not sass["hgmma"]


def _with(example: str, old: str, new: str, tmp_path: Path) -> Path:
    text = (ROOT / "examples" / example).read_text()
    assert old in text
    path = tmp_path / ("changed_" + example)
    path.write_text(text.replace(old, new))
    return path


def test_tile_size_in_yaml_decides_the_kernel(builds, tmp_path):
    base = builds(ROOT / "examples" / "gemm.yaml")
    changed = builds(_with("gemm.yaml", "{rule: tile, def: C, index: j, size: 256}",
                           "{rule: tile, def: C, index: j, size: 128}", tmp_path))
    p0, p1 = (json.loads((d / "plan.json").read_text())["plan"] for d in (base, changed))
    assert (p0["block_n"], p1["block_n"]) == (256, 128)
    assert (base / "kernel.cu").read_text() != (changed / "kernel.cu").read_text()


def test_spilling_schedule_is_refused(tmp_path):
    """4 warps for 128 query rows at d=128 would spill: the build fails on the SASS promise."""
    if not nvrtc_available():
        pytest.skip("NVRTC not installed")
    from compiler.cli import BuildError

    path = _with("flash_attention.yaml", "index: ii, to: warp, count: 8}", "index: ii, to: warp, count: 4}", tmp_path)
    with pytest.raises(BuildError, match="local memory"):
        build_to(path, tmp_path / "out", seed=0)
    assert not (tmp_path / "out").exists()


def test_staging_and_warps_in_yaml_decide_the_kernel(builds, tmp_path):
    base = builds(ROOT / "examples" / "flash_attention.yaml")
    text = (ROOT / "examples" / "flash_attention.yaml").read_text()
    text = text.replace("{rule: tile, def: O, index: i, size: 128}", "{rule: tile, def: O, index: i, size: 64}")
    text = text.replace("index: ii, to: warp, count: 8}", "index: ii, to: warp, count: 4}")
    (tmp_path / "fewer_warps.yaml").write_text(text)
    fewer = builds(tmp_path / "fewer_warps.yaml")
    p0, p1 = (json.loads((d / "plan.json").read_text())["plan"] for d in (base, fewer))
    assert (p0["warps"], p1["warps"]) == (8, 4)
    assert "__launch_bounds__(256" in (base / "kernel.cu").read_text()
    assert "__launch_bounds__(128" in (fewer / "kernel.cu").read_text()


def test_uncached_operand_reads_global_memory(tmp_path):
    doc = yaml.safe_load((ROOT / "examples" / "gemm_f32_simt.yaml").read_text())
    doc["name"] = "gemm_f32_uncached_b"
    doc["schedule"] = [s for s in doc["schedule"] if s.get("tensor") != "B"]
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "out"
    build_to(path, out, seed=0, proofs=False)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["mapping"] == "simt"
    src = (out / "kernel.cu").read_text()
    assert "sb_A_s[" in src and "sb_B_s" not in src and "p_B[" in src  # A staged in shared, B read from global


def test_wgmma_attention_needs_one_warp_per_16_rows(tmp_path):
    """wgmma attention: a warpgroup per 64 query rows; a schedule with too few warps is refused."""
    from compiler.cli import BuildError

    path = _with("flash_attention_wgmma.yaml", "index: ii, to: warp, count: 8}", "index: ii, to: warp, count: 4}", tmp_path)
    with pytest.raises(BuildError, match="warps"):
        build_to(path, tmp_path / "out", seed=0, proofs=False)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "out").exists()


def test_wgmma_mapping_changes_the_attention_kernel(builds):
    sync = json.loads((builds(ROOT / "examples" / "flash_attention.yaml") / "plan.json").read_text())
    wg = builds(ROOT / "examples" / "flash_attention_wgmma.yaml")
    assert sync["mapping"] == "online_fold_mma_sync"
    assert json.loads((wg / "plan.json").read_text())["mapping"] == "online_fold_wgmma"
    assert "wgmma.mma_async" in (wg / "kernel.cu").read_text()
