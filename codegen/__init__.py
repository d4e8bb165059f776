"""derivc codegen: from a derivation's final program to a checked CUDA kernel.

The subpackages, in pipeline order:

- `codegen.kir`: the kernel IR and its tools — the IR (`ir`), the lowering of a derivation to
  it (`lower`), its independent interpreter (`interp`), and the grid convention (`grid`);
- `codegen.mappings`: the printers of a kernel IR, one per (family, instruction), found through
  a registry, each beside its jinja2 templates (`codegen/mappings/templates/`);
- `codegen.cuda`: the CUDA toolchain — NVRTC and its cache, SASS checks, TMA tensor maps, the
  driver launcher and the runtime;
- `codegen.emu`, beside them: the CPU executor of the printed CUDA (the `kernel` step's engine).

The top level keeps the pipeline's entry points — `build` (the codegen stage of `derivc
build`), `kernel_check` (the `kernel` step), `run_cmd` and `bench` (`derivc run` / `bench`) —
and `source`, the plain-data contract between the stages: what a printer hands to the toolchain,
the runtime and the emulation (`KernelSource`, `Launch`).  It imports nothing from codegen, so
it belongs to no one stage and every stage may use it.
"""
