"""Run an emitted kernel.cu on the CPU: the very text NVRTC compiles, compiled by the host g++
against an emulation layer (codegen/emu/include): threads as cooperative fibers with the real
semantics of barriers, mbarriers, warp / warpgroup collectives and asynchronous copies.

    compile_emulated(source, entry).launch(grid, threads, smem_bytes, args, "forward" | "reverse" | "random")
    run_printed(printed, variant_index, inputs, given_sizes, order=...)  # guarded, poisoned buffers

The model is adversarial where the hardware leaves room: shared memory (dynamic and static) is
poisoned (0xFF, NaN) at every block start and the dynamic window starts 16- but not 1024-byte
aligned; cp.async, TMA and wgmma poison their destination at issue and complete at the latest
point the program allows (cp.async.wait_group; a waiter blocked only on the mbarrier's
transaction count; each lane's wgmma.wait_group; wgmma's register A is checked unchanged at
the wait); generic-proxy shared writes (st.shared, cp.async) reach wgmma only after the writer's
fence.proxy.async; bar.sync counts arrivals per warp; threads switch only where they must wait
(and, in the random order, at some shared-memory accesses), so a missing barrier reads poison
in one order or another.  Deadlocks, out-of-window wrapper accesses, wild accesses, a wgmma or
cp.async never waited for, bad setmaxnreg / bar.sync counts and lanes that disagree in a
collective end the launch with an EmuError naming the thread.

Not modelled: blocks run one after another; plain C++ accesses to shared memory are neither
bounds-checked nor switch points; ex2.approx / tanh.approx are libm's exact functions and the
host does not contract a * b + c into an FMA (rounding differs from the GPU's in the last bits).
x86-64 only (the fibers' context switch); one launch at a time per compiled module.
"""
from .compile import EmuCompileError, host_compiler
from .launch import SCHEDULES, EmuError, EmuModule, compile_emulated
from .run import VariantUnavailable, from_storage, run_printed, to_storage

__all__ = ["EmuCompileError", "EmuError", "EmuModule", "SCHEDULES", "VariantUnavailable", "compile_emulated", "host_compiler",
           "from_storage", "run_printed", "to_storage"]
