"""A final program built as a chain of kernels: OUT/kernels/<definition>/, OUT/kernels.json.

A rule that leaves several definitions on purpose says so with the program's `kernels` fact
(compiler.kernel_view.kernel_chain; SPLIT-KV: the partial folds, then the combine).  Such a
program builds as one kernel per definition, in order; without the fact, several definitions
are one kernel that lacks a FUSE (the lowering's error).

    OUT/derivation.json, report.md, steps/, program.txt, proofs/   the whole derivation (as today)
    OUT/kernels/<def>/     an ordinary build directory per kernel: its derivation.json records the
                           cut (`chain_kernel`), so it replays from the spec; kernel.cu, report.md, …
    OUT/kernels.json       the order, each kernel's inputs and outputs (dtype, shape)

Kernel k's program is the final program cut at definition k (`chain_cuts`): the definitions
before it are marked written by their kernel (the kernel receives them as arguments; every
check still computes them), the ones after it are dropped.  Its derivation has no steps of its
own: IR₀ is the cut, and the build's codegen checks (lowering, the text on the CPU) run on it at
the whole derivation's check sizes, draws and tiles.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .derive import Derivation
from .errors import DerivationError
from .ir import Program
from .kernel_view import kernel_chain, kernel_inputs, written_by
from .spec import SpecFile

MANIFEST = "kernels.json"
KERNELS_DIR = "kernels"
KERNEL_PROOFS = "no steps of its own: the chain's obligations are OUT/proofs"


def chain_cuts(prog: Program) -> list[Program]:
    """The program cut at each definition, in order; ValueError when it is not a chain (fewer
    than two definitions, or the last one is not the output alone)."""
    if len(prog.defs) < 2:
        raise ValueError(f"the program has {len(prog.defs)} definition: one kernel, not several")
    if prog.defs[-1].name != prog.output or prog.also_outputs():
        raise ValueError(f"the last definition must be the output {prog.output} (and no further outputs): "
                         "each definition is one kernel, the last writes the output")
    cuts = []
    for k, d in enumerate(prog.defs):
        earlier = tuple(replace(x, computed_by=f"kernel {x.name}") for x in prog.defs[:k])
        also = ",".join(a.name for a in d.also)
        cuts.append(replace(prog, defs=(*earlier, d), output=d.name,
                            facts=(("also_outputs", also),) if also else ()))
    return cuts


def chain_of(d: Derivation) -> tuple[str, ...]:
    """The kernels a derivation's final program runs as (() for one kernel); DerivationError
    when its `kernels` fact no longer matches its definitions."""
    try:
        names = kernel_chain(d.final)
        if names:
            chain_cuts(d.final)
    except ValueError as exc:
        raise DerivationError("kernels", str(exc), None, d.file) from None
    return names


def kernel_derivations(d: Derivation) -> list[Derivation]:
    """One derivation per kernel of the chain: IR₀ its cut, no steps, the whole derivation's
    spec, seed, check sizes, draws and tiles (the codegen checks run on these)."""
    from codegen.build import largest_tiles

    tiles = largest_tiles(d)
    out = []
    for cut in chain_cuts(d.final):
        k = Derivation(d.spec, d.file, [cut], [], dict(d.check_sizes), d.draw_plan, (), d.seed, d.seed_given)
        k.chain_kernel = {"kernel": cut.output, "name": kernel_name(d.spec.name, cut.output),  # type: ignore[attr-defined]
                          "chain": list(kernel_chain(d.final)), "chain_digest": d.final.digest()}
        k.tiles = tiles  # type: ignore[attr-defined]
        if hasattr(d, "spec_text"):
            k.spec_text = d.spec_text  # type: ignore[attr-defined]
        if getattr(d, "variant_choice", None) is not None:
            k.variant_choice = d.variant_choice  # type: ignore[attr-defined]
        out.append(k)
    return out


def kernel_name(spec_name: str, kernel: str) -> str:
    """The kernel's entry name: the spec's, then the definition's."""
    return f"{spec_name}_{kernel}"


def chain_kernel_program(spec: SpecFile, kernel: str, file: str = "") -> Program:
    """A chain kernel's IR₀ again, without checks (replay, verify, load): the spec's schedule
    applied, the final program cut at `kernel`."""
    from .derive import derive

    final = derive(spec, file, check=False).final
    for cut in chain_cuts(final):
        if cut.output == kernel:
            return cut
    raise DerivationError("replay", f"the trace names kernel {kernel}; the chain's kernels are "
                                    f"{', '.join(kernel_chain(final))}", None, file)


def manifest(kernels: list[Derivation]) -> dict[str, Any]:
    """kernels.json: the order, and what each kernel reads and writes (what the runtime needs)."""
    final = kernels[-1].final
    rows = []
    for k in kernels:
        prog = k.final
        d = prog.def_named(prog.output)
        outs = [{"name": n, "dtype": prog.tensor_type(n).dtype, "shape": [str(a) for a in prog.tensor_type(n).dims]}
                for n in written_by(d)]
        rows.append({"name": prog.output, "dir": f"{KERNELS_DIR}/{prog.output}", "entry": k.chain_kernel["name"],
                     "inputs": kernel_inputs(prog), "outputs": outs})
    return {"inputs": [n for n, _ in final.inputs], "output": final.output, "kernels": rows}


def write_chain(d: Derivation, outdir: Path, write: Callable[[Derivation, Path], Any]) -> list[Derivation]:
    """OUT/kernels/<def>/ (each written by `write`, the build's writer of one directory) and
    OUT/kernels.json; the caller writes OUT's own files and the marker over everything."""
    kernels = kernel_derivations(d)
    for k in kernels:
        sub = outdir / KERNELS_DIR / k.final.output
        sub.mkdir(parents=True)
        write(k, sub)
    (outdir / MANIFEST).write_text(json.dumps(manifest(kernels), indent=2, allow_nan=False) + "\n")
    d.chain_kernels = kernels  # type: ignore[attr-defined]
    return kernels
