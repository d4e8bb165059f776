"""The kernel IR and its tools.

`ir` defines the kernel IR (one thread block's tile-level program, printed to `kir.txt`);
`lower` lowers a derivation's final program to it (total: it refuses by name, never guesses);
`interp` is its independent interpreter, compared with the final program at build time;
`grid` is the convention by which several loops share one CUDA grid axis, used by the printers
and the runtime alike.  The C printer of kernel-IR expressions lives with the printers
(`codegen.mappings.cexpr`), its only users.  Nothing here imports the mappings or the toolchain.
"""
