"""The training runtime on the GPU (tests/trainkit.py's hand-made build with gradients: row
softmax, backward in two kernels): the CuPy two-call API against float64, the torch custom op
against float64 torch.autograd and gradcheck, torch.compile(fullgraph=True), CUDA-graph capture
of forward + backward, and the emulation agreeing with the GPU."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import trainkit  # noqa: E402

TOL = {"f32": 1e-5, "f16": 3e-3}


@pytest.fixture(scope="module", params=["f32", "f16"])
def built(request, tmp_path_factory) -> tuple[str, Path]:
    dtype = request.param
    return dtype, trainkit.build_softmax_training(tmp_path_factory.mktemp(f"train_{dtype}"), dtype)


def _ref(x: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64)
    dy = dy.astype(np.float64)
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return p, p * (dy - (p * dy).sum(axis=1, keepdims=True))


def _rel(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _draw(dtype: str, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    npt = np.float32 if dtype == "f32" else np.float16
    return ((rng.standard_normal((rows, trainkit.C)) * 2).astype(npt),
            rng.standard_normal((rows, trainkit.C)).astype(npt))


def test_cupy_two_call_api_matches_float64(built):
    import derivc

    dtype, out = built
    t = derivc.load_training(out)
    for rows in (1, 37, 300):
        x, dy = _draw(dtype, rows, rows)
        y, saved = t.forward_with_saved(X=cupy.asarray(x))
        grads = t.backward(saved, cupy.asarray(dy))
        p, dx = _ref(x, dy)
        assert _rel(cupy.asnumpy(y), p) < TOL[dtype]
        assert grads["X"].dtype == x.dtype and grads["X"].shape == x.shape
        assert _rel(cupy.asnumpy(grads["X"]), dx) < TOL[dtype], rows


def test_emulation_agrees_with_the_gpu(built):
    import derivc

    dtype, out = built
    x, dy = _draw(dtype, 9, 5)
    gpu, emu = derivc.load_training(out), derivc.load_training(out, device="emu")
    y, saved = gpu.forward_with_saved(X=cupy.asarray(x))
    g = cupy.asnumpy(gpu.backward(saved, cupy.asarray(dy))["X"]).astype(np.float64)
    ye, saved_e = emu.forward_with_saved(X=x)
    ge = np.asarray(emu.backward(saved_e, dy)["X"], dtype=np.float64)
    assert _rel(ge, g) < TOL[dtype] and _rel(ye, cupy.asnumpy(y).astype(np.float64)) < TOL[dtype]


def test_cupy_graph_capture_of_forward_and_backward(built):
    import derivc

    dtype, out = built
    t = derivc.load_training(out)
    x, dy = _draw(dtype, 64, 11)
    xs, dys = cupy.asarray(x), cupy.asarray(dy)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        y, saved = t.forward_with_saved(X=xs)  # warm-up: the shapes' geometry is cached
        t.backward(saved, dys)
        stream.synchronize()
        stream.begin_capture()
        y, saved = t.forward_with_saved(X=xs)
        grads = t.backward(saved, dys)
        graph = stream.end_capture()
        x2, dy2 = _draw(dtype, 64, 12)
        xs[...] = cupy.asarray(x2)
        dys[...] = cupy.asarray(dy2)
        grads["X"].fill(float("nan"))
        graph.launch()
        stream.synchronize()
    p, dx = _ref(x2, dy2)
    assert _rel(cupy.asnumpy(grads["X"]), dx) < TOL[dtype]
    assert _rel(cupy.asnumpy(y), p) < TOL[dtype]


# -- torch ------------------------------------------------------------------------------------

def _torch_ref(torch, x, w):
    x64 = x.detach().double().requires_grad_(True)
    y = torch.softmax(x64, dim=1)
    (y * w.double()).sum().backward()
    return y.detach(), x64.grad


def test_torch_op_matches_float64_autograd(built, torch):
    import derivc

    dtype, out = built
    f = derivc.torch_op(out)
    tdt = {"f32": torch.float32, "f16": torch.float16}[dtype]
    for rows in (3, 129):
        x = (torch.randn(rows, trainkit.C, device="cuda") * 2).to(tdt).requires_grad_(True)
        w = torch.randn(rows, trainkit.C, device="cuda").to(tdt)
        y = f(x)
        (y * w).sum().backward()
        y_ref, g_ref = _torch_ref(torch, x, w)
        assert y.dtype == tdt and x.grad.dtype == tdt
        assert (torch.linalg.norm(y.double() - y_ref) / torch.linalg.norm(y_ref)).item() < TOL[dtype]
        assert (torch.linalg.norm(x.grad.double() - g_ref) / torch.linalg.norm(g_ref)).item() < TOL[dtype]
    assert derivc.torch_op(out) is f  # one registration per build and process


def test_torch_gradcheck_f32(built, torch):
    import derivc

    dtype, out = built
    if dtype != "f32":
        pytest.skip("gradcheck needs the f32 build")
    f = derivc.torch_op(out)
    x = torch.randn(2, trainkit.C, device="cuda", dtype=torch.float32, requires_grad=True)
    assert torch.autograd.gradcheck(f, (x,), eps=1e-3, atol=1e-3, rtol=1e-2, nondet_tol=1e-6)


def test_torch_gradcheck_f64(torch, tmp_path):
    """examples/softmax_f64_grad.yaml (SIMT kernels computing in double): torch's float64
    gradcheck at its default tolerances, rows 1 and 5."""
    import derivc
    from compiler.cli import build_to

    out = tmp_path / "softmax_f64"
    build_to(ROOT / "examples" / "softmax_f64_grad.yaml", out, seed=0, proofs=False)
    f = derivc.torch_op(out)
    for rows in (1, 5):
        x = torch.randn(rows, 128, device="cuda", dtype=torch.float64, requires_grad=True)
        assert f(x).dtype == torch.float64
        assert torch.autograd.gradcheck(f, (x,))


def test_torch_compile_fullgraph(built, torch):
    import derivc

    dtype, out = built
    f = derivc.torch_op(out)
    tdt = {"f32": torch.float32, "f16": torch.float16}[dtype]

    def loss(x, w):
        return (f(x * 1.5) * w).sum()

    compiled = torch.compile(loss, fullgraph=True)  # a graph break raises
    for rows in (8, 40):  # a second shape: recompiled (or dynamic), still no break
        x = torch.randn(rows, trainkit.C, device="cuda").to(tdt).requires_grad_(True)
        w = torch.randn(rows, trainkit.C, device="cuda").to(tdt)
        compiled(x, w).backward()
        _, g_ref = _torch_ref(torch, (x * 1.5).detach(), w)
        g_ref = g_ref * 1.5
        assert (torch.linalg.norm(x.grad.double() - g_ref) / torch.linalg.norm(g_ref)).item() < TOL[dtype]
    explained = torch._dynamo.explain(loss)(x, w)
    assert explained.graph_break_count == 0


def test_torch_graph_capture_of_the_two_call_api(built, torch):
    import derivc

    dtype, out = built
    tdt = {"f32": torch.float32, "f16": torch.float16}[dtype]
    t = derivc.load_training(out)
    x = torch.randn(64, trainkit.C, device="cuda").to(tdt)
    dy = torch.randn(64, trainkit.C, device="cuda").to(tdt)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _, saved = t.forward_with_saved(X=x)  # warm-up on the capture stream
        t.backward(saved, dy)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y, saved = t.forward_with_saved(X=x)
        grads = t.backward(saved, dy)
    x.copy_(torch.randn_like(x))
    dy.copy_(torch.randn_like(dy))
    grads["X"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    x64 = x.double().requires_grad_(True)
    torch.softmax(x64, dim=1).backward(dy.double())
    assert (torch.linalg.norm(grads["X"].double() - x64.grad) / torch.linalg.norm(x64.grad)).item() < TOL[dtype]


def test_torch_graph_capture_of_autograd(built, torch):
    """The op's forward and its autograd backward (the backward ops) captured in one graph."""
    import derivc

    dtype, out = built
    tdt = {"f32": torch.float32, "f16": torch.float16}[dtype]
    f = derivc.torch_op(out)
    x = torch.randn(32, trainkit.C, device="cuda").to(tdt).requires_grad_(True)
    w = torch.randn(32, trainkit.C, device="cuda").to(tdt)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            (gx,) = torch.autograd.grad((f(x) * w).sum(), (x,))
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        (gx,) = torch.autograd.grad((f(x) * w).sum(), (x,))
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
    gx.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    _, g_ref = _torch_ref(torch, x, w)
    assert (torch.linalg.norm(gx.double() - g_ref) / torch.linalg.norm(g_ref)).item() < TOL[dtype]


# -- attention: the example with gradients, where the repository has it ----------------------

FA_GRAD = ROOT / "examples" / "flash_attention_grad.yaml"


@pytest.mark.skipif(not FA_GRAD.exists(), reason="examples/flash_attention_grad.yaml not in this checkout")
def test_attention_torch_op_matches_float64_autograd(torch, tmp_path):
    """Causal attention's torch op: O and dQ, dK, dV against float64 torch.autograd, eager and
    under torch.compile(fullgraph=True)."""
    import derivc
    import yaml

    spec = yaml.safe_load(FA_GRAD.read_text())
    d = spec["sizes"]["D"]
    out = tmp_path / "fa"
    derivc.build(FA_GRAD, out)
    f = derivc.torch_op(out)
    q, k, v = (torch.randn(2, 3, 200, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    w = torch.randn(2, 3, 200, d, device="cuda", dtype=torch.float16)
    q64, k64, v64 = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    s = (q64 @ k64.transpose(-1, -2)) / d ** 0.5
    causal = torch.ones(200, 200, dtype=torch.bool, device="cuda").tril()
    o_ref = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) @ v64
    (o_ref * w.double()).sum().backward()

    def rel(a, b):
        return (torch.linalg.norm(a.double() - b) / torch.linalg.norm(b)).item()

    for fn in (f, torch.compile(f, fullgraph=True)):
        for x in (q, k, v):
            x.grad = None
        o = fn(q, k, v)
        (o * w).sum().backward()
        assert rel(o.detach(), o_ref.detach()) < 1e-2
        for x, x64 in ((q, q64), (k, k64), (v, v64)):
            assert rel(x.grad, x64.grad) < 1e-2
