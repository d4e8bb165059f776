"""The instruction wrappers' emulation against the real instructions on the GPU.

The `kernel` step of every build trusts codegen/emu to execute the wrappers of
constructs/instr.cu.j2 as the hardware does.  Here one probe source (tests/gpu/emu_probes.cu.j2,
calling the wrappers exactly as the templates do) runs on the GPU through NVRTC and on the CPU
through the emulation, on the same random inputs, and the outputs are compared bit for bit
(conversions, shared memory, ldmatrix, cp.async zero fill, TMA boxes, shuffles, named barriers)
or to the stated accuracy (ex2.approx / tanh.approx: the emulation computes exactly; mma and wgmma:
the hardware's fp32 summation order inside one instruction is not specified, so sums agree to
a few ulps of the sum of |products|).  wgmma covers every shape and operand layout the mappings
emit (N = 64, 128, 256 with K-major and MN-major B, MN-major A from shared memory (imm-trans-a, a
gradient's Aᵀ), the register-A form, 128-byte swizzle with the templates' descriptors and k-step
advances), plus random descriptors of the other swizzle modes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")
try:
    if cupy.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except Exception:  # noqa: BLE001
    pytest.skip("no CUDA device", allow_module_level=True)

import jinja2  # noqa: E402

from codegen.mappings.ctx_common import DEFAULT_OPTIONS  # noqa: E402
from codegen.mappings.templates_env import TEMPLATE_DIR  # noqa: E402

HERE = Path(__file__).resolve().parent
WGMMAS = ([{"n": n, "trans_b": tb, "trans_a": False} for n in (64, 128, 256) for tb in (False, True)]
          + [{"n": n, "trans_b": tb, "trans_a": True} for n in (64, 256) for tb in (False, True)])


def render(dt: str) -> str:
    env = jinja2.Environment(loader=jinja2.ChoiceLoader([jinja2.FileSystemLoader(str(HERE)),
                                                         jinja2.FileSystemLoader(str(TEMPLATE_DIR))]),
                             undefined=jinja2.StrictUndefined)
    return env.get_template("emu_probes.cu.j2").render(dt=dt, wgmmas=WGMMAS)


_MODULES: dict = {}


def modules(dt: str):
    """(cubin, emulated-source compiler) of the probe source for one operand dtype."""
    if dt not in _MODULES:
        from codegen.cuda.nvrtc import compile_cubin
        src = render(dt)
        _MODULES[dt] = (src, compile_cubin(src, f"emu_probes_{dt}", DEFAULT_OPTIONS).cubin)
    return _MODULES[dt]


def run_both(dt: str, entry: str, grid: tuple[int, int, int], threads: int, smem: int,
             args: list, outs: list[int], maps: tuple | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Run `entry` on the GPU and on the CPU; args are numpy arrays or ints; outs: the indices of
    the output arrays.  maps = (index of the maps argument, function ptr -> bytes)."""
    from codegen.emu import compile_emulated
    from codegen.cuda.launcher import DriverKernel

    src, cubin = modules(dt)
    kinds = "".join("p" if isinstance(a, np.ndarray) or (maps and i == maps[0]) else "i" for i, a in enumerate(args))
    dev = [cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
    host = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    if maps is not None:
        i, encode = maps
        data_dev, data_host = dev[i], host[i]
        dev[i] = cupy.asarray(np.frombuffer(encode(int(data_dev.data.ptr), "driver"), dtype=np.uint8))
        raw = encode(int(data_host.ctypes.data), "emulated")
        buf = np.zeros(len(raw) + 64, dtype=np.uint8)
        at = -buf.ctypes.data % 64
        buf[at:at + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        host[i] = buf[at:]
        keep = (data_dev, data_host)  # noqa: F841  (the maps point into them)
    k = DriverKernel(cubin, entry, smem, kinds)
    k.launch(grid, threads, smem, 0, [int(a.data.ptr) if isinstance(a, cupy.ndarray) else a for a in dev])
    cupy.cuda.runtime.deviceSynchronize()
    compile_emulated(src, entry).launch(grid, threads, smem, host)
    return [(cupy.asnumpy(dev[i]), host[i]) for i in outs]


def assert_bits(pair: tuple[np.ndarray, np.ndarray], what: str, inputs: np.ndarray | None = None) -> None:
    gpu, emu = pair
    bad = np.flatnonzero(gpu.view(np.uint8) != emu.view(np.uint8))
    if bad.size:
        items = sorted({int(b) // gpu.itemsize for b in bad[:400]})[:6]
        shown = ", ".join(f"[{i}] gpu {gpu.view(np.uint8)[i * gpu.itemsize:(i + 1) * gpu.itemsize].tobytes()[::-1].hex()} "
                          f"emu {emu.view(np.uint8)[i * gpu.itemsize:(i + 1) * gpu.itemsize].tobytes()[::-1].hex()}"
                          + (f" in {inputs[i]!r}" if inputs is not None else "") for i in items)
        raise AssertionError(f"{what}: {bad.size} bytes differ: {shown}")


def special_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    edge = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 65519.99, 6e-8, 5.96e-8, 2.9e-8,
                     1e-40, -1e-40, 3.4e38, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 126.9, -150.0, 0.5, -0.5], np.float32)
    x[:edge.size] = edge
    return x


@pytest.mark.parametrize("dt", ["f16"])
def test_conversions_ex2_tanh(dt):
    rng = np.random.default_rng(1)
    n = 1 << 16
    x = special_floats(rng, n)
    u16, f32, u32 = (lambda: np.zeros(n, np.uint16)), (lambda: np.zeros(n, np.float32)), (lambda: np.zeros(n, np.uint32))
    args = [x, u16(), u16(), f32(), f32(), u32(), u32(), f32(), f32(), n]
    res = run_both(dt, "probe_convert", (n // 256, 1, 1), 256, 0, args, [1, 2, 3, 4, 5, 6, 7, 8])
    for pair, what in zip(res[:6], ("cvt.rn.f16.f32", "cvt.rn.bf16.f32", "cvt.f32.f16", "bf16 -> f32",
                                    "cvt.rn.f16x2.f32", "cvt.rn.bf16x2.f32")):
        assert_bits(pair, what, x)
    (e_gpu, e_emu), (t_gpu, t_emu) = res[6], res[7]
    fin = np.isfinite(e_emu) & (np.abs(x) < 126) & (np.abs(e_emu) > 1e-37)
    assert np.all(np.abs(e_gpu[fin] - e_emu[fin]) <= 2.0 ** -21 * np.abs(e_emu[fin])), "ex2.approx beyond 2^-21"
    assert np.array_equal(np.isnan(e_gpu), np.isnan(e_emu))
    ok = np.isfinite(x)
    assert np.all(np.abs(t_gpu[ok] - t_emu[ok]) <= 2.0 ** -10.9), "tanh.approx beyond its 2^-10.99 bound"


def test_shared_stores_loads_stream_shuffles_sched_fence():
    rng = np.random.default_rng(2)
    src = rng.integers(0, 2**32, 4096, dtype=np.uint32)
    src[7] = 0x7fffffff  # sched_fence rewrites this NaN
    res = run_both("f16", "probe_shared", (1, 1, 1), 128, 128 * 64, [src, np.zeros(2560, np.uint32),
                                                                        np.zeros(256, np.uint32)], [1, 2])
    assert_bits(res[0], "st.shared / ld.shared / streaming copies")
    assert_bits(res[1], "shfl.xor / sched_fence")


def test_cp_async_zero_fill():
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, 4096, dtype=np.uint8)
    nbytes = rng.choice(np.array([0, 4, 8, 12, 16], np.int32), 256).astype(np.int32)
    res = run_both("f16", "probe_cp_async", (1, 1, 1), 128, 4096, [src, nbytes, np.zeros(4096, np.uint8)], [2])
    assert_bits(res[0], "cp.async.cg 16 with src-size")


def test_ldmatrix_x4_and_trans():
    rng = np.random.default_rng(4)
    for trial in range(4):
        tile = rng.integers(0, 2**32, 64 * 64 // 2, dtype=np.uint32)
        rows = rng.integers(0, 64, 32).astype(np.int32)
        cols = (rng.integers(0, 8, 32) * 8).astype(np.int32)
        res = run_both("f16", "probe_ldmatrix", (1, 1, 1), 32, 64 * 64 * 2, [tile, rows, cols, np.zeros(256, np.uint32)], [3])
        assert_bits(res[0], f"ldmatrix trial {trial}")


def halves(rng: np.random.Generator, n: int, dt: str, scale: float = 1.0) -> np.ndarray:
    """n random 16-bit values of dtype dt (finite), as uint16 bits."""
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    if dt == "f16":
        return x.astype(np.float16).view(np.uint16)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def close_sums(gpu: np.ndarray, emu: np.ndarray, bound: np.ndarray, what: str) -> None:
    tol = 2.0 ** -20 * bound + 1e-30
    bad = np.flatnonzero(np.abs(gpu.astype(np.float64) - emu) > tol)
    assert bad.size == 0, (f"{what}: {bad.size} of {gpu.size} accumulators differ beyond fp32 summation order, "
                           f"first at {bad[0]}: gpu {gpu.flat[bad[0]]} emu {emu.flat[bad[0]]}")


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_mma_sync_m16n8k16(dt):
    rng = np.random.default_rng(5)
    reps = 8
    a = halves(rng, reps * 32 * 8, dt).view(np.uint32)
    b = halves(rng, reps * 32 * 4, dt).view(np.uint32)
    c = rng.standard_normal(128).astype(np.float32)
    res = run_both(dt, "probe_mma", (1, 1, 1), 32, 0, [a, b, c, np.zeros(128, np.float32), reps], [3])
    gpu, emu = res[0]
    scale = np.abs(c).max() + reps * 16 * 16.0  # a loose bound on sum |products| (normal inputs)
    close_sums(gpu, emu, np.full(gpu.shape, scale), f"mma.sync {dt}")


def desc(addr: int, lbo: int, sbo: int, layout: int) -> int:
    return ((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32) | (layout << 62)


def template_descs(n: int, trans_b: bool, ksteps: int, trans_a: bool = False) -> tuple[list[int], int]:
    """The descriptors the templates issue (constructs/wgmma.cu.j2, contraction_wgmma.cu.j2): A at
    0, K-major [k/64][64 rows][64 k] or MN-major [k rows][64 m]; B after it, K-major
    [k/64][n rows][64 k] or MN-major [n/64][k rows][64 n]; 128-byte swizzle; k-step ks: +32 bytes
    in the swizzle row (K-major), +2048 bytes (MN-major)."""
    panels = -(-ksteps // 4)
    rows_k = 16 * ksteps
    a_bytes = rows_k * 128 if trans_a else panels * 64 * 128
    b_base = a_bytes
    out = []
    for ks in range(ksteps):
        if trans_a:
            da = desc(ks * 2048, rows_k * 128, 1024, 1)
        else:
            da = desc((ks >> 2) * 64 * 128 + (ks & 3) * 32, 16, 1024, 1)
        if trans_b:
            db = desc(b_base + ks * 2048, rows_k * 128, 1024, 1)
        else:
            db = desc(b_base + (ks >> 2) * n * 128 + (ks & 3) * 32, 16, 1024, 1)
        out += [da, db]
    b_bytes = (n // 64) * rows_k * 128 if trans_b else panels * n * 128
    return out, a_bytes + b_bytes


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("w", range(len(WGMMAS)), ids=[f"n{w['n']}_{'mn' if w['trans_b'] else 'k'}"
                                                      f"{'_a_mn' if w['trans_a'] else ''}" for w in WGMMAS])
def test_wgmma_template_descriptors(dt, w):
    cfg = WGMMAS[w]
    n, ksteps = cfg["n"], 8
    descs, nbytes = template_descs(n, cfg["trans_b"], ksteps, cfg["trans_a"])
    _wgmma_case(dt, w, np.array(descs, dtype=np.uint64), nbytes, ksteps, seed=10 + w)


@pytest.mark.parametrize("layout,lbo,sbo", [(2, 16, 512), (3, 16, 256), (0, 128, 256), (0, 256, 128)])
def test_wgmma_other_swizzle_modes(layout, lbo, sbo):
    """Swizzle 64B / 32B / none with K-major A and B (no mapping emits them today)."""
    w = 0  # n = 64, K-major B
    descs = []
    for ks in range(2):
        descs += [desc(ks * 32 if layout else ks * 2 * lbo, lbo, sbo, layout),
                  desc(16384 + (ks * 32 if layout else ks * 2 * lbo), lbo, sbo, layout)]
    _wgmma_case("f16", w, np.array(descs, dtype=np.uint64), 32768, 2, seed=40 + layout)


def _wgmma_case(dt: str, w: int, descs: np.ndarray, nbytes: int, ksteps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = WGMMAS[w]["n"]
    img = halves(rng, nbytes // 2, dt).view(np.uint32)
    a_regs = halves(rng, ksteps * 128 * 8, dt).view(np.uint32)
    out = [np.zeros(128 * n // 2, np.float32), np.zeros(128 * n // 2, np.float32)]
    res = run_both(dt, f"probe_wgmma_{w}", (1, 1, 1), 128, nbytes + 1024,
                   [img, img.size, descs, ksteps, a_regs, *out], [5, 6])
    bound = np.full(128 * n // 2, ksteps * 16 * 16.0)
    close_sums(*res[0], bound, f"wgmma ss m64n{n} {dt}")
    close_sums(*res[1], bound, f"wgmma rs m64n{n} {dt}")


TMA_CASES = [
    # dims (innermost first), box, element strides of dims 1.. (None: contiguous), coordinate tuples
    ([128, 200], [64, 128], None, [(0, 0), (64, 128), (64, 72), (0, 190), (-64, -8), (128, 0)]),
    ([64, 77], [64, 64], None, [(0, 0), (0, 64), (0, 13)]),
    ([128, 300, 6], [64, 128, 1], None, [(0, 256, 5), (64, 0, 0), (0, 200, 6)]),
    ([128, 150, 3, 2], [64, 128, 1, 1], [3 * 128, 128, 150 * 3 * 128], [(0, 128, 2, 1), (64, 0, 0, 0)]),
    ([64, 90, 2, 2, 3], [64, 64, 1, 1, 1], None, [(0, 64, 1, 1, 2), (0, 0, 0, 0, 0)]),
]


@pytest.mark.parametrize("case", range(len(TMA_CASES)))
def test_tma_tile_loads(case):
    from codegen.cuda.tma import encode_driver, encode_emulated, tiled_map

    dims, box, strides, coords = TMA_CASES[case]
    rank = len(dims)
    rng = np.random.default_rng(50 + case)
    elems = 1
    if strides is None:
        for d in dims:
            elems *= d
    else:
        elems = strides[-1] * dims[-1]
    data = rng.integers(0, 2**16, elems, dtype=np.uint16)
    box_bytes = 2
    for b in box:
        box_bytes *= b

    def encode(ptr: int, how: str) -> bytes:
        m = tiled_map("f16", ptr, list(dims), list(box), strides)
        return encode_driver(m) if how == "driver" else encode_emulated(m)

    cs = np.array(coords, dtype=np.int32).reshape(-1)
    out = np.zeros(len(coords) * box_bytes, np.uint8)
    res = run_both("f16", f"probe_tma_{rank}d", (1, 1, 1), 128, box_bytes + 2048,
                   [data, cs, len(coords), out, box_bytes], [3], maps=(0, encode))
    assert_bits(res[0], f"TMA {rank}d box {box} at {coords}")


def test_named_barrier_and_setmaxnreg():
    src = np.arange(128, dtype=np.uint32) * 7
    res = run_both("f16", "probe_named_barrier", (1, 1, 1), 256, 1024, [src, np.zeros(128, np.uint32)], [1])
    assert_bits(res[0], "bar.sync 1, 256")
