"""The CUDA toolchain: from a printed kernel to a launch on the GPU.

`toolchain` finds the CUDA libraries and tools; `nvrtc` compiles a `codegen.source.KernelSource`
to a cubin through the on-disk `cache`; `sass` disassembles the cubin and checks the schedule's
promises against the machine code (HMMA/HGMMA, LDGSTS/TMA, no local memory); `tma` encodes the
TMA tensor maps a mapping asks for (for the emulation too, `codegen.emu.tensor_map`); `launcher`
calls the CUDA driver; `runtime` ties them together for `derivc run` / `bench` and the GPU
tests.  Importing any of them needs neither CuPy nor a GPU.
"""
