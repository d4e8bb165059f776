"""Every example's kernel run the way the README says kernels run: through CuPy, in Python.

Each examples/*.yaml with a kernel (all but test_codegen_examples.NO_KERNEL) is built as `derivc
build` builds it and loaded with derivc.load; its kernel (a chain's kernels in order) runs on
CuPy arrays at the build's check sizes with a NaN-poisoned CuPy output, against the spec's IR₀
in the float64 interpreter (codegen.run_cmd.check_kernel, as the torch tests run it).  A call
without `out` returns CuPy arrays; a non-contiguous input and a wrong-dtype input get the
runtime's documented ValueError naming the input; a bf16 kernel refuses CuPy arrays by name
(CuPy has no bfloat16: such kernels take torch tensors only).  Each *_grad example's forward and
backward (derivc.load_training) run on CuPy arrays too, at the middle-sized case of
test_grad_examples_gpu.REFERENCES, checked by that test's check_gradients against float64
torch.autograd (torch is needed for that reference only; the arrays cross by DLPack, no copy).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

ROOT = Path(__file__).resolve().parents[2]
for where in (ROOT / "tests", ROOT / "tests" / "gpu"):  # the CPU suite's and the GPU suite's helpers
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))

import test_grad_examples_gpu as grad_tests  # noqa: E402
from test_codegen_examples import NO_KERNEL  # noqa: E402

EXAMPLES = [p for p in sorted((ROOT / "examples").glob("*.yaml")) if p.stem not in NO_KERNEL]
GRAD_EXAMPLES = [p for p in grad_tests.EXAMPLES + grad_tests.RUNNABLE_PENDING if p.stem in grad_tests.REFERENCES]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(derivation, build directory) per example, built once per module (per xdist worker) as
    CI builds them (seed 0, no proofs); a *_grad build serves its forward test and its grad test."""
    from compiler.cli import build_to

    root = tmp_path_factory.mktemp("cupy_examples")
    cache: dict[str, Any] = {}

    def get(path: Path) -> Any:
        if path.stem not in cache:
            cache[path.stem] = (build_to(path, root / path.stem, seed=0, proofs=False), root / path.stem)
        return cache[path.stem]

    return get


def _input_dtypes(program: Any) -> set[str]:
    return {t.dtype for _, t in program.inputs}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_kernel_on_cupy_arrays_matches_spec(built, path: Path):
    from codegen.run_cmd import check_kernel, random_inputs_cupy, sizes_by_name
    from compiler.machine import DTYPES

    import derivc

    d, out_dir = built(path)
    kernel = derivc.load(out_dir)
    program, sizes = d.programs[0], dict(d.check_sizes)
    if "bf16" in _input_dtypes(program):
        _refuses_cupy_for_bf16(kernel, program, sizes)
        return
    for seed in (1, 2):
        r = check_kernel(kernel, program, sizes, seed=seed, arrays="cupy")
        assert not r["nan"], f"{path.stem} at {r['sizes']}: NaN in the output"
        assert r["passed"], f"{path.stem} at {r['sizes']}: {r['outputs']}"

    full = {**{n: v for n, v in program.sizes if v is not None}, **sizes}
    xs = random_inputs_cupy(program, full, seed=3)
    args = [xs[n] for n in kernel.inputs]
    by_name = sizes_by_name(program, full)
    got = kernel(*args, **by_name)  # no `out`: allocated, of the inputs' kind
    cupy.cuda.get_current_stream().synchronize()
    outputs = got if isinstance(got, tuple) else (got,)
    for array, name in zip(outputs, (program.output, *program.also_outputs())):
        t = program.tensor_type(name)
        assert isinstance(array, cupy.ndarray), f"{path.stem}: {name} came back as {type(array).__name__}"
        assert array.dtype.name == DTYPES[t.dtype].numpy, name
        assert array.shape == tuple(a.evaluate(full) for a in t.dims), name

    # the largest input is handed over wrong: a strided view of the same shape, then another dtype
    name = max(kernel.inputs, key=lambda n: xs[n].size)
    i = list(kernel.inputs).index(name)
    x = xs[name]
    strided = cupy.empty(x.shape + (2,), dtype=x.dtype)[..., 0]
    strided[...] = x
    assert strided.shape == x.shape and not strided.flags.c_contiguous
    with pytest.raises(ValueError, match=f"^{re.escape(name)}: must be C-contiguous"):
        kernel(*args[:i], strided, *args[i + 1:], **by_name)
    other = cupy.float32 if x.dtype != cupy.float32 else cupy.float16
    with pytest.raises(ValueError, match=f"^{re.escape(name)}: dtype {cupy.dtype(other).name}, kernel expects"):
        kernel(*args[:i], x.astype(other), *args[i + 1:], **by_name)


def _refuses_cupy_for_bf16(kernel: Any, program: Any, sizes: dict[str, int]) -> None:
    full = {**{n: v for n, v in program.sizes if v is not None}, **sizes}
    from compiler.machine import DTYPES

    args = [cupy.zeros(tuple(a.evaluate(full) for a in program.tensor_type(n).dims),  # bf16's: float32
                       dtype=DTYPES[program.tensor_type(n).dtype].numpy or cupy.float32) for n in kernel.inputs]
    first_bf16 = next(n for n in kernel.inputs if program.tensor_type(n).dtype == "bf16")
    with pytest.raises(ValueError, match=f"^{re.escape(first_bf16)}: dtype bf16 needs a torch tensor \\(CuPy has no bf16\\)"):
        kernel(*args)


def _middle_case(ref: Any) -> int:
    """The case of middle size (by element count over its sizes): tails, not the largest run."""
    order = sorted(range(len(ref.cases)), key=lambda i: _elements(ref.cases[i].sizes))
    return order[len(order) // 2]


def _elements(sizes: dict[str, int]) -> int:
    n = 1
    for v in sizes.values():
        n *= max(v, 1)
    return n


@pytest.mark.parametrize("path", GRAD_EXAMPLES, ids=lambda p: p.stem)
def test_grad_example_on_cupy_arrays_matches_autograd(built, path: Path):
    import derivc

    torch = pytest.importorskip("torch")  # the float64 reference is torch.autograd
    ref = grad_tests.REFERENCES[path.stem]
    index = _middle_case(ref)
    t = derivc.load_training(built(path)[1])
    kinds: list[type] = []

    def to_torch(x: Any) -> Any:
        kinds.append(type(x))
        return torch.from_dlpack(x)

    grad_tests.check_gradients(torch, t, ref, ref.cases[index], seed=17 + index, where=f"{path.stem} (CuPy)",
                               to_runtime=cupy.from_dlpack, to_torch=to_torch)
    assert kinds and set(kinds) == {cupy.ndarray}, f"{path.stem}: results came back as {kinds}"
