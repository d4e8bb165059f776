"""The CPU execution model (codegen/emu): hand-written kernels against the emulation API —
barriers, named barriers, shuffles, mbarrier phases and transaction counts, a producer / consumer
ring, the scheduling orders, deadlock reports, guard zones and poison, late asynchronous copies.
The examples' emitted kernels run in test_exec_kernels.py."""
from __future__ import annotations

import numpy as np
import pytest

from codegen.emu import EmuError, compile_emulated
from codegen.emu.run import POISON, _Guarded
from codegen.emu.tensor_map import encode_tiled_emulated

ORDERS = ("forward", "reverse", "random")


def kernel(body: str, params: str = "float* __restrict__ y"):
    return compile_emulated('extern "C" __global__ void __launch_bounds__(128) k(' + params + ") {\n"
                            "    DERIVC_DYNAMIC_SMEM(smem_, 16);\n" + body + "\n}\n", "k")


def run(mod, args, threads=128, smem=1024, order="forward", seed=0, grid=(1, 1, 1)):
    mod.launch(grid, threads, smem, args, order, seed)


# ---------------------------------------------------------------- barriers
EXCHANGE = """
    float* s = reinterpret_cast<float*>(smem_);
    const int t = threadIdx.x;
    s[t] = (float)(t + 1);
    {sync}
    y[t] = s[(t + 37) % blockDim.x];
"""


@pytest.mark.parametrize("order", ORDERS)
def test_syncthreads_orders_the_exchange(order):
    y = np.zeros(128, np.float32)
    run(kernel(EXCHANGE.replace("{sync}", "__syncthreads();")), [y], order=order, seed=5)
    assert np.array_equal(y, (np.arange(128) + 37) % 128 + 1.0)


def test_a_missing_barrier_reads_poison_under_some_order():
    mod = kernel(EXCHANGE.replace("{sync}", ""))
    bad = []
    for order in ("forward", "reverse"):
        y = np.zeros(128, np.float32)
        run(mod, [y], order=order)
        bad.append(int(np.isnan(y).sum()))
    assert bad[0] > 0 and bad[1] > 0  # forward: reads ahead of the writers; reverse: behind


def test_exited_threads_count_at_syncthreads():
    y = np.zeros(128, np.float32)
    run(kernel("""
    float* s = reinterpret_cast<float*>(smem_);
    const int t = threadIdx.x;
    if (t >= 64) return;
    s[t] = 2.0f * t;
    __syncthreads();
    y[t] = s[63 - t];"""), [y])
    assert np.array_equal(y[:64], 2.0 * (63 - np.arange(64)))


NAMED = """
    float* s = reinterpret_cast<float*>(smem_);
    const int t = threadIdx.x, half = t / 64;
    s[t] = (float)t;
    derivc_emu::bar_sync(1 + half, {count});
    y[t] = s[half * 64 + (t + 1) % 64];
"""


@pytest.mark.parametrize("order", ORDERS)
def test_named_barriers_sync_their_own_threads(order):
    y = np.zeros(128, np.float32)
    run(kernel(NAMED.replace("{count}", "64")), [y], order=order, seed=2)
    t = np.arange(128)
    assert np.array_equal(y, (t // 64) * 64 + (t + 1) % 64)


def test_named_barrier_count_mismatch_and_bad_counts():
    with pytest.raises(EmuError, match=r"bar.sync 1: thread count 96, but threads already waiting there passed 64"):
        run(kernel("derivc_emu::bar_sync(1, threadIdx.x < 32 ? 64 : 96);"), [np.zeros(1, np.float32)])
    with pytest.raises(EmuError, match=r"multiple of 32"):
        run(kernel("derivc_emu::bar_sync(1, 48);"), [np.zeros(1, np.float32)])


def test_named_barrier_counts_warps():
    # warp 1's upper half has exited: the warp arrives with its live lanes (PTX: arrivals per warp)
    y = np.zeros(128, np.float32)
    run(kernel("""
    const int t = threadIdx.x;
    if (t >= 48) return;
    float* s = reinterpret_cast<float*>(smem_);
    s[t] = (float)t;
    derivc_emu::bar_sync(1, 64);
    y[t] = s[47 - t];"""), [y])
    assert np.array_equal(y[:48], 47.0 - np.arange(48))


def test_named_barrier_does_not_count_exited_threads():
    # a count below the block size: only arrivals count (a whole-block count treats exits as arrived)
    with pytest.raises(EmuError, match=r"deadlock.*threads 0-63: bar.sync 1, 96 \(64 arrived, 64 exited\)"):
        run(kernel("if (threadIdx.x >= 64) return; derivc_emu::bar_sync(1, 96);"), [np.zeros(1, np.float32)])


# ---------------------------------------------------------------- shuffles
def test_shuffles_match_their_definitions():
    y = np.zeros((4, 128), np.float32)
    run(kernel("""
    const int t = threadIdx.x;
    const float v = (float)(t * t);
    y[t] = __shfl_xor_sync(0xffffffffu, v, 5);
    y[128 + t] = __shfl_sync(0xffffffffu, v, 7, 16);
    y[256 + t] = __shfl_down_sync(0xffffffffu, v, 3, 8);
    y[384 + t] = __shfl_up_sync(0xffffffffu, v, 2);"""), [y])
    t = np.arange(128)
    lane, base = t % 32, t - t % 32
    v = lambda src: (base + src).astype(np.float32) ** 2  # noqa: E731
    assert np.array_equal(y[0], v(lane ^ 5))
    assert np.array_equal(y[1], v(lane // 16 * 16 + 7))
    assert np.array_equal(y[2], v(np.where(lane % 8 + 3 < 8, lane + 3, lane)))
    assert np.array_equal(y[3], v(np.where(lane >= 2, lane - 2, lane)))


def test_partial_mask_shuffles():
    y = np.zeros(128, np.float32)
    run(kernel("""
    const int t = threadIdx.x;
    if ((t & 31) < 16) y[t] = __shfl_xor_sync(0x0000ffffu, (float)t, 1);"""), [y])
    t = np.arange(128)
    assert np.array_equal(y[t % 32 < 16], (t ^ 1)[t % 32 < 16])
    with pytest.raises(EmuError, match=r"lanes disagree.*mask 0x"):
        run(kernel("__shfl_xor_sync(threadIdx.x % 2 ? 0xffffffffu : 0x5555ffffu, 1.0f, 1);"), [y])
    with pytest.raises(EmuError, match=r"lane 15 reads lane 16, which is not in the mask"):
        run(kernel("if ((threadIdx.x & 31) < 16) y[threadIdx.x] = __shfl_xor_sync(0xffffu, 1.0f, 16 - 15 + 30);"
                   .replace("16 - 15 + 30", "(threadIdx.x & 31) == 15 ? 31 : 0")), [y])
    with pytest.raises(EmuError, match=r"thread 20 \(warp 0 lane 20\): exits while lanes of its warp wait for it in "
                                       r"a warp shuffle|lane 20 of the mask 0xffffffff has exited"):
        run(kernel("if ((threadIdx.x & 31) == 20) return; __shfl_xor_sync(0xffffffffu, 1.0f, 1);"), [y])


# ---------------------------------------------------------------- scheduling orders
def test_orders_differ_and_random_is_seeded():
    mod = kernel("""
    static int ticket;
    if (threadIdx.x == 0) ticket = 0;
    __syncthreads();
    y[threadIdx.x] = (float)(ticket++);""")
    seen = {}
    for order, seed in (("forward", 0), ("reverse", 0), ("random", 1), ("random", 1), ("random", 2)):
        y = np.zeros(128, np.float32)
        run(mod, [y], order=order, seed=seed)
        seen[(order, seed)] = y.copy()
    assert np.array_equal(seen[("forward", 0)], np.arange(128))
    assert np.array_equal(seen[("reverse", 0)], 127 - np.arange(128))
    rnd = seen[("random", 1)]
    assert sorted(rnd) == list(range(128)) and not np.array_equal(rnd, np.arange(128))
    assert not np.array_equal(rnd, seen[("random", 2)])


# ---------------------------------------------------------------- deadlock
def test_deadlock_names_each_blocked_thread():
    with pytest.raises(EmuError) as e:
        run(kernel("if (threadIdx.x != 5) __syncthreads(); else derivc_emu::bar_sync(3, 32);"),
            [np.zeros(1, np.float32)])
    msg = str(e.value)
    assert "deadlock" in msg
    assert "threads 0-4: bar.sync 0, 128 (127 arrived, 0 exited)" in msg
    assert "thread 5: bar.sync 3, 32 (1 arrived, 0 exited)" in msg
    assert "threads 6-127: bar.sync 0, 128" in msg


# ---------------------------------------------------------------- mbarriers
MBAR = """
    const int t = threadIdx.x;
    const unsigned bar = derivc_emu::smem_addr(smem_);
    if (t == 0) derivc_emu::mbar_init(bar, 2);
    __syncthreads();
    {body}
"""


def test_mbarrier_phases_and_parity():
    y = np.zeros(128, np.float32)
    run(kernel(MBAR.replace("{body}", """
    float* s = reinterpret_cast<float*>(smem_ + 64);
    for (int round = 0; round < 3; ++round) {
        if (t < 2) { s[t] = (float)(10 * round + t); derivc_emu::mbar_arrive(bar); }
        derivc_emu::mbar_wait_parity(bar, round & 1);
        if (t == 100 + round) y[round] = s[0] + s[1];
        __syncthreads();
    }
    derivc_emu::mbar_wait_parity(bar, 0);  // phase 3 runs; the phase before it (parity 0) is complete
    """)), [y])
    assert list(y[:3]) == [1.0, 21.0, 41.0]


def test_mbarrier_errors():
    y = np.zeros(4, np.float32)
    with pytest.raises(EmuError, match=r"more arrivals than its count 2 in phase 0"):  # the phase waits for tx only
        run(kernel(MBAR.replace("{body}", "if (t == 0) derivc_emu::mbar_arrive_expect_tx(bar, 16);"
                                          "if (t == 1 || t == 2) derivc_emu::mbar_arrive(bar);")), [y])
    with pytest.raises(EmuError, match=r"no mbarrier initialized at shared address"):
        run(kernel("derivc_emu::mbar_arrive(derivc_emu::smem_addr(smem_) + 8);"), [y])
    with pytest.raises(EmuError, match=r"deadlock.*mbarrier 0x[0-9a-f]+ parity 0 \(phase 0, 1 of 2 arrivals pending"):
        run(kernel(MBAR.replace("{body}", "if (t == 0) derivc_emu::mbar_arrive(bar); derivc_emu::mbar_wait_parity(bar, 0);")),
            [y])


TMA = """
    const int t = threadIdx.x;
    const unsigned base = derivc_emu::smem_addr(smem_);
    const unsigned bar = (base + 7) / 8 * 8, tile = (base + 8 + 127) / 128 * 128;
    if (t == 0) derivc_emu::mbar_init(bar, 1);
    __syncthreads();
    if (t == 0) {
        const int c[3] = {0, 4, 0};
        std::memset(smem_ + (tile - base), 0, 8 * 16 * 2);  // the load poisons what was there at issue
        derivc_emu::mbar_arrive_expect_tx(bar, {expect});
        derivc_emu::tma_load(tile, map, bar, RANK, c);
    }
    {wait}
    const unsigned short* s = reinterpret_cast<const unsigned short*>(smem_ + (tile - base));
    for (int i = t; i < 8 * 16; i += blockDim.x) y[i] = derivc_emu::cvt_f32_f16(s[i]);
    {after}
"""


def tma_case(expect="8 * 16 * 2", wait="derivc_emu::mbar_wait_parity(bar, 0);", order="forward", after="", rank=2):
    x = (np.arange(10 * 16) % 97).astype(np.float16).reshape(10, 16)
    y = np.zeros(8 * 16, np.float32)
    raw = encode_tiled_emulated("f16", x.ctypes.data, [16, 10], [16, 8], swizzle="none")
    maps = np.zeros(192, np.uint8)
    at = -maps.ctypes.data % 64
    maps[at:at + 128] = np.frombuffer(raw, np.uint8)
    mod = kernel(TMA.replace("{expect}", expect).replace("{wait}", wait).replace("{after}", after)
                 .replace("RANK", str(rank)),
                 "const void* map, float* __restrict__ y")
    run(mod, [maps.ctypes.data + at, y], smem=4096, order=order)
    want = np.zeros((8, 16), np.float32)
    want[:6] = x[4:]
    return y.reshape(8, 16), want


@pytest.mark.parametrize("order", ORDERS)
def test_tma_lands_on_its_mbarrier_with_zero_fill(order):
    y, want = tma_case(order=order)
    assert np.array_equal(y, want)


def test_tma_transaction_counts():
    with pytest.raises(EmuError, match=r"deadlock.*arrivals pending, tx 2\)"):
        tma_case(expect="8 * 16 * 2 + 2")
    with pytest.raises(EmuError, match=r"completed 2 bytes more than its expect_tx"):
        tma_case(expect="8 * 16 * 2 - 2")


def test_tma_read_before_its_wait_reads_poison():
    y, _ = tma_case(wait="", after="derivc_emu::mbar_wait_parity(bar, 0);")
    # poisoned at issue, landed when thread 0 (the first to read, forward order) waited
    assert np.isnan(y.flat[0]) and not np.isnan(y.flat[1:]).any()
    with pytest.raises(EmuError, match=r"never waited"):
        tma_case(wait="__syncthreads();")


# ---------------------------------------------------------------- producer / consumer ring
RING = """
    // warp 0 produces ROUNDS tiles of 32 floats into a 2-slot ring; warps 1..3 consume
    const int t = threadIdx.x, lane = t & 31;
    const unsigned base = derivc_emu::smem_addr(smem_);
    const unsigned full = base + 0, empty = base + 16, data = base + 64;
    if (t == 0) {
        for (int s = 0; s < 2; ++s) { derivc_emu::mbar_init(full + 8 * s, 32); derivc_emu::mbar_init(empty + 8 * s, 3); }
    }
    __syncthreads();
    if (t < 32) {
        for (int r = 0; r < ROUNDS; ++r) {
            const int s = r % 2;
            {producer_wait}
            const float v = (float)(r * 32 + lane);
            derivc_emu::st_shared(data + 128 * s + 4 * lane, &v, 4);
            derivc_emu::mbar_arrive(full + 8 * s);
        }
        return;
    }
    float acc = 0.0f;
    for (int r = 0; r < ROUNDS; ++r) {
        const int s = r % 2;
        derivc_emu::mbar_wait_parity(full + 8 * s, (r / 2) & 1);
        float v;
        derivc_emu::ld_shared(data + 128 * s + 4 * lane, &v, 4);
        acc += v * (float)(1 + (r % 3));
        __syncwarp();
        if (lane == 0) derivc_emu::mbar_arrive(empty + 8 * s);
    }
    y[t - 32] = acc;
"""


def test_producer_consumer_ring():
    rounds = 9
    mod = kernel(RING.replace("ROUNDS", str(rounds)).replace(
        "{producer_wait}", "derivc_emu::mbar_wait_parity(empty + 8 * s, ((r / 2) & 1) ^ 1);"))
    lane = np.arange(96) % 32
    want = sum((r * 32 + lane) * (1 + r % 3) for r in range(rounds)).astype(np.float32)
    for order, seed in (("forward", 0), ("reverse", 0), ("random", 1), ("random", 7)):
        y = np.zeros(96, np.float32)
        run(mod, [y], order=order, seed=seed)
        assert np.array_equal(y, want), order


@pytest.mark.parametrize("mutation", ["no empty wait", "no syncwarp"])
def test_ring_mutations_are_caught(mutation):
    src = RING.replace("ROUNDS", "9").replace(
        "{producer_wait}", "" if mutation == "no empty wait" else
        "derivc_emu::mbar_wait_parity(empty + 8 * s, ((r / 2) & 1) ^ 1);")
    if mutation == "no syncwarp":
        src = src.replace("__syncwarp();", "")
    mod = kernel(src)
    lane = np.arange(96) % 32
    want = sum((r * 32 + lane) * (1 + r % 3) for r in range(9)).astype(np.float32)
    wrong = []
    for order, seed in (("forward", 0), ("reverse", 0), ("random", 1), ("random", 2), ("random", 3)):
        y = np.zeros(96, np.float32)
        try:
            run(mod, [y], order=order, seed=seed)
            wrong.append(not np.array_equal(y, want))
        except EmuError:
            wrong.append(True)
    assert any(wrong)


# ---------------------------------------------------------------- cp.async
CP = """
    const int t = threadIdx.x;
    const unsigned dst = derivc_emu::smem_addr(smem_) + 16 * t;
    const float before[4] = {7.0f, 7.0f, 7.0f, 7.0f};
    derivc_emu::st_shared(dst, before, 16);  // the copy poisons what was there at issue
    derivc_emu::cp_async_cg16(dst, x + 4 * t, t < 100 ? 16 : 4);
    derivc_emu::cp_async_commit_group();
    {wait}
    float v[4];
    derivc_emu::ld_shared(dst, v, 16);
    for (int i = 0; i < 4; ++i) y[4 * t + i] = v[i];
    {after}
"""


def cp_case(wait, after=""):
    x = np.arange(512, dtype=np.float32)
    y = np.zeros(512, np.float32)
    run(kernel(CP.replace("{wait}", wait).replace("{after}", after), "const float* __restrict__ x, float* __restrict__ y"), [x, y], smem=2048)
    return x, y


def test_cp_async_lands_at_its_wait_with_zero_fill():
    x, y = cp_case("derivc_emu::cp_async_wait_group(0);")
    want = x.copy().reshape(128, 4)
    want[100:, 1:] = 0.0
    assert np.array_equal(y, want.reshape(-1))


def test_cp_async_read_before_its_wait_reads_poison():
    with pytest.raises(EmuError, match=r"cp.async to shared 0x[0-9a-f]+ \(group 0\) never waited"):
        cp_case("")
    _, y = cp_case("derivc_emu::cp_async_commit_group(); derivc_emu::cp_async_wait_group(1);",
                   after="derivc_emu::cp_async_wait_group(0);")
    assert not np.isnan(y).any()  # the older group of two completes at wait_group 1
    _, y = cp_case("derivc_emu::cp_async_commit_group(); derivc_emu::cp_async_wait_group(2);",
                   after="derivc_emu::cp_async_wait_group(0);")
    assert np.isnan(y).all()  # wait_group 2 with two groups committed completes nothing


# ---------------------------------------------------------------- checks
def test_out_of_window_shared_access():
    with pytest.raises(EmuError, match=r"st.shared: shared access \[0x[0-9a-f]+, 0x[0-9a-f]+\) outside the dynamic "
                                       r"shared window"):
        run(kernel("float v = 1.0f; derivc_emu::st_shared(derivc_emu::smem_addr(smem_) + 1024, &v, 4);"),
            [np.zeros(1, np.float32)])
    with pytest.raises(EmuError, match=r"ld.shared: shared access"):
        run(kernel("float v; derivc_emu::ld_shared(derivc_emu::smem_addr(smem_) - 4, &v, 4);"),
            [np.zeros(1, np.float32)])


def test_dynamic_smem_is_16_but_not_1024_aligned():
    y = np.zeros(1, np.float32)
    run(kernel("if (threadIdx.x == 0) y[0] = (float)(derivc_emu::smem_addr(smem_) % 1024);"), [y])
    assert y[0] % 16 == 0 and y[0] != 0


def test_shared_memory_is_poisoned_at_block_start():
    y = np.zeros(2, np.float32)
    run(kernel("""
    float* s = reinterpret_cast<float*>(smem_);
    if (threadIdx.x == 0) { y[blockIdx.x] = s[3]; s[3] = 1.0f; }"""), [y], grid=(2, 1, 1))
    assert np.isnan(y).all()


def test_static_shared_is_poisoned_at_block_start():
    y = np.zeros(4, np.float32)
    run(kernel("""
    __shared__ float red[8];
    if (threadIdx.x == 0) { y[2 * blockIdx.x] = red[5]; red[5] = 1.0f; }
    __syncthreads();
    if (threadIdx.x == 1) y[2 * blockIdx.x + 1] = red[5];"""), [y], grid=(2, 1, 1))
    assert np.isnan(y[0::2]).all() and (y[1::2] == 1.0).all()


def test_wgmma_never_waited_and_setmaxnreg():
    with pytest.raises(EmuError, match=r"wgmma.mma_async \(m64n16k16, group 0\) issued and never waited"):
        run(kernel("""
        float d[8] = {};
        derivc_emu::wgmma_fence();
        derivc_emu::wgmma_ss(derivc_emu::Dtype::F16, 16, d, 0, 0, 0, 0, 0);
        derivc_emu::wgmma_commit_group();"""), [np.zeros(1, np.float32)])
    with pytest.raises(EmuError, match=r"setmaxnreg.inc 260"):
        run(kernel("derivc_emu::setmaxnreg(260, true);"), [np.zeros(1, np.float32)])
    with pytest.raises(EmuError, match=r"setmaxnreg.dec 44"):
        run(kernel("derivc_emu::setmaxnreg(44, false);"), [np.zeros(1, np.float32)])


def test_guard_zones_catch_a_write_past_the_end():
    mod = kernel("if (threadIdx.x == 0) y[n] = 1.0f;", "float* __restrict__ y, int n")
    buf = _Guarded("O", 64 * 4)
    mod.launch((1, 1, 1), 128, 0, [buf.ptr, 64], "forward")
    assert (buf.data() == POISON).all()
    with pytest.raises(EmuError, match=r"wrote outside O: 4 bytes after it changed \(first at byte offset 256\)"):
        buf.check_guards()


def test_tma_issued_after_its_waiters_blocked_wakes_them():
    # warp 1 waits while only the transaction count is missing and no load is in flight yet;
    # warp 0 issues the load after a named barrier with warp 2
    x = np.arange(16 * 8, dtype=np.float16).reshape(8, 16)
    raw = encode_tiled_emulated("f16", x.ctypes.data, [16, 8], [16, 8], swizzle="none")
    maps = np.zeros(192, np.uint8)
    at = -maps.ctypes.data % 64
    maps[at:at + 128] = np.frombuffer(raw, np.uint8)
    y = np.zeros(32, np.float32)
    mod = kernel("""
    const int t = threadIdx.x, w = t / 32;
    const unsigned base = derivc_emu::smem_addr(smem_);
    const unsigned bar = (base + 7) / 8 * 8, tile = (base + 8 + 127) / 128 * 128;
    if (t == 0) { derivc_emu::mbar_init(bar, 1); derivc_emu::mbar_arrive_expect_tx(bar, 256); }
    __syncthreads();
    if (w == 0 || w == 2) derivc_emu::bar_sync(1, 64);
    if (t == 0) { const int c[2] = {0, 0}; derivc_emu::tma_load(tile, map, bar, 2, c); }
    if (w == 1) {
        derivc_emu::mbar_wait_parity(bar, 0);
        y[t - 32] = derivc_emu::cvt_f32_f16(reinterpret_cast<const unsigned short*>(smem_ + (tile - base))[t]);
    }""", "const void* map, float* __restrict__ y")
    run(mod, [maps.ctypes.data + at, y], smem=4096)
    assert np.array_equal(y, x.reshape(-1)[32:64])


# ---------------------------------------------------------------- tensor maps: one computation, two encodings
def test_tensor_map_parameters_reach_both_encoders(monkeypatch):
    import ctypes

    from codegen.cuda import tma
    from codegen.emu.tensor_map import decode_emulated

    calls = []

    class FakeDriver:
        @staticmethod
        def cuTensorMapEncodeTiled(out, dtype, rank, ptr, dims, strides, box, es, *rest):
            n = rank.value
            calls.append((dtype.value, n, ptr.value, list(dims), list(strides)[:n - 1], list(box), [r.value for r in rest]))
            ctypes.memset(out.value, 0xAB, 128)
            return 0

    monkeypatch.setattr(tma, "_libcuda", lambda: FakeDriver)
    m = tma.tiled_map("f16", 4096, [72, 150, 3], [64, 128, 1])
    assert m.strides_elems == (72, 72 * 150)
    assert tma.encode_driver(m) == b"\xab" * 128
    assert calls == [(6, 3, 4096, [72, 150, 3], [144, 144 * 150], [64, 128, 1], [0, 3, 3, 0])]
    view = tma.tiled_map("bf16", 8192, [128, 200, 2], [64, 128, 1], [256, 128 * 200 * 2])
    fields = decode_emulated(tma.encode_emulated(view))
    assert fields.dims == (128, 200, 2) and fields.box == (64, 128, 1)
    assert fields.strides == (2, 512, 2 * 128 * 200 * 2)
    with pytest.raises(ValueError, match="multiples of 16 bytes"):
        tma.tiled_map("f16", 0, [72, 150], [64, 128], [4])


def test_a_wild_access_or_a_stack_overflow_fails_the_launch_not_the_process():
    y = np.zeros(4, np.float32)
    with pytest.raises(EmuError, match=r"thread 3 \(warp 0 lane 3\): invalid memory access at address 0x[0-9a-f]+, "
                                       r"outside every buffer"):
        run(kernel("if (threadIdx.x == 3) y[(long long)n << 36] = 1.0f;", "float* __restrict__ y, int n"), [y, 1])
    with pytest.raises(EmuError, match=r"thread 0: stack overflow"):
        run(kernel("""
        volatile float big[1 << 16];
        big[threadIdx.x] = 1.0f;
        y[threadIdx.x & 3] = big[(threadIdx.x * 7) & 1023];""", "float* __restrict__ y"), [y])
    run(kernel("y[threadIdx.x & 3] = 2.0f;"), [y])  # the module (and the process) still run
    assert (y == 2.0).all()


def test_tma_rank_must_be_the_maps():
    with pytest.raises(EmuError, match=r"a 3d load through a rank-2 tensor map"):
        tma_case(wait="derivc_emu::mbar_wait_parity(bar, 0);", rank=3)
