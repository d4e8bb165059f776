"""Row kernels on the GPU (softmax two-pass / online, LayerNorm, RMSNorm) against the float64
interpreter of the spec: the examples at R = 1 and 77, row lengths that are not a multiple of
the vector width or of a whole sweep (tails), other thread counts, large softmax logits, and the
same kernels printed by the generic SIMT mapping (the schedule without the thread mapping)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ["softmax_two_pass", "softmax_online", "layernorm", "rmsnorm"]


def load_spec(name: str) -> dict:
    return yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())


def variant(name: str, C: int | None = None, threads: int | None = None, tile: int | None = None,
            simt: bool = False) -> dict:
    """The example with another row length, thread count, streaming tile, or without the thread
    mapping (then the SIMT mapping prints it)."""
    spec = load_spec(name)
    if C is not None:
        spec["sizes"]["C"] = C
    steps = []
    for st in spec["schedule"]:
        if st["rule"] == "parallel" and st.get("to") == "thread":
            if simt:
                continue
            if threads is not None:
                st = {**st, "count": threads}
        if st["rule"] == "tile" and tile is not None:
            st = {**st, "size": tile}
        steps.append(st)
    spec["schedule"] = steps
    spec["name"] = f"{name}_c{C or 'x'}_t{threads or 'x'}{'_simt' if simt else ''}"
    return spec


def build(spec: dict, tmp_path: Path):
    import derivc
    from compiler.cli import build_to

    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    d = build_to(path, tmp_path / spec["name"], proofs=False, seed=1)
    mapping = json.loads((tmp_path / spec["name"] / "plan.json").read_text())["mapping"]
    return d, derivc.load(tmp_path / spec["name"]), mapping


def check(d, kernel, sizes, seed=1, scale=1.0):
    from codegen.run_cmd import check_kernel

    r = check_kernel(kernel, d.programs[0], sizes, seed=seed, scale=scale)
    assert not r["nan"] and r["passed"], r
    return r


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_rows(tmp_path, name):
    if not (ROOT / "examples" / f"{name}.yaml").exists():
        pytest.skip(f"no example {name}")
    d, k, mapping = build(variant(name), tmp_path)
    assert mapping == "rowwise"
    for r in (1, 77):
        check(d, k, {"R": r}, seed=r)
    if name.startswith("softmax"):
        check(d, k, {"R": 33}, seed=5, scale=30.0)  # large logits: exp overflows without the max shift


# (row length, threads, streaming tile): vector widths 1 / 4 / 8, idle threads past the count,
# several sweeps per thread, several tiles
ODD = [(1001, 143, 143), (1004, 251, 1004), (8200, 205, 1640), (8192, 256, 2048), (24, 3, 24)]


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("C,threads,tile", ODD)
def test_odd_rows_and_thread_counts(tmp_path, name, C, threads, tile):
    if not (ROOT / "examples" / f"{name}.yaml").exists():
        pytest.skip(f"no example {name}")
    d, k, mapping = build(variant(name, C, threads, tile), tmp_path)
    assert mapping == "rowwise"
    for r in (1, 77):
        check(d, k, {"R": r}, seed=r + C, scale=30.0 if name.startswith("softmax") else 1.0)


@pytest.mark.parametrize("name", EXAMPLES)
def test_simt_prints_the_same_kernels(tmp_path, name):
    if not (ROOT / "examples" / f"{name}.yaml").exists():
        pytest.skip(f"no example {name}")
    d, k, mapping = build(variant(name, 1000, tile=100, simt=True), tmp_path)
    assert mapping == "simt"
    for r in (1, 13):
        check(d, k, {"R": r}, seed=r, scale=30.0 if name.startswith("softmax") else 1.0)
