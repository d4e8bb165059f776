"""`derivc build`'s codegen stage: final program → kernel IR → checked → printed → cubin → SASS.

1. `lower`: the final program becomes a kernel IR (codegen.kir.lower, total or refused by name).
2. `lowering` step: the kernel-IR interpreter is compared with the final program's interpreter at
   the derivation's check sizes on fresh random inputs (≤ 1e-12); recorded as the last step of
   derivation.json and report.md.  A mismatch stops the build (exit 3).
3. The mapping registry prints the kernel IR (SIMT, mma.sync, wgmma + TMA); the printer's
   instruction choices go to plan.json, the kernel IR to kir.txt.
4. `kernel` step: the printed text of every variant runs on the CPU (codegen.kernel_check:
   g++ with the instruction wrappers' emulation, codegen.emu) against the final program in
   float64 at the check sizes, on several draws; recorded after `lowering`.  A mismatch stops
   the build (exit 3).
5. NVRTC compiles each variant; the SASS must keep the schedule's promises (tensor-core
   instructions where MAP-MMA was applied, async copies where CACHE asked for a pipeline, no
   local-memory spills in tensor-core kernels).

Every failure raises `CodegenError` (the CLI exits 3 with its one-line reason): a build that
cannot produce a kernel never looks like one that did.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from compiler.ir import Program

from .kir.ir import Kernel, show_kernel
from .kir.interp import KirError, validate
from .kir.lower import LoweringError, lower
from .mappings import Printed, print_kernel
from .source import KernelSource

TOLERANCE = 1e-12
LOWERING_SEED_OFFSET = 1000  # the lowering check's seed: base seed + number of steps + this


class CodegenError(Exception):
    """No kernel: the program has no kernel IR, the kernel IR disagrees with the program, no
    mapping prints it, it failed to compile, or it broke a promise of its schedule."""


def lower_checked(program: Program, name: str, sizes: dict[str, int], seed: int) -> tuple[Kernel, dict[str, Any]]:
    """The kernel IR of the final program and the record of its translation validation."""
    try:
        kernel = lower(program, name)
    except LoweringError as exc:
        raise CodegenError(f"lowering: {exc}") from None
    try:
        check = validate(kernel, program, sizes, seed)
    except KirError as exc:
        raise CodegenError(f"lowering: the kernel IR is not well formed: {exc}") from None
    ok = check["rel_error"] <= TOLERANCE
    record = {
        "index": None, "rule": "lowering", "kind": "LOWERING", "params": {}, "theorem": None,
        "facts": {"kernel": kernel.name, "grid": [f"{g.var} < {g.ext} @{g.axis}" for g in kernel.grid],
                  "lanes": [f"{ln.var} < {ln.bound()}" for ln in kernel.lanes]},
        "validated": "numerically: kernel-IR interpreter vs the final program (no proof export yet)",
        "numeric": {**check, "tolerance": TOLERANCE, "passed": ok},
    }
    if not ok:
        raise CodegenError(f"lowering: the kernel IR disagrees with the final program at {sizes} "
                           f"(seed {seed}): relative error {check['rel_error']:.3g} > {TOLERANCE}")
    return kernel, record


def lowering_seed(derivation: Any) -> int:
    return int(derivation.seed or 0) + len(derivation.steps) + LOWERING_SEED_OFFSET


def prepare(derivation: Any) -> tuple[Kernel, dict[str, Any]]:
    """Lower and validate a derivation's final program; stores the record on the derivation so
    that derivation.json and report.md carry the `lowering` step."""
    kernel, record = lower_checked(derivation.final, kernel_name(derivation), dict(derivation.check_sizes),
                                   lowering_seed(derivation))
    record["index"] = len(derivation.steps) + 1
    derivation.lowering = record
    return kernel, record


def kernel_name(derivation: Any) -> str:
    """The kernel's entry name: the spec's, a chain kernel's own (compiler.kernel_chain)."""
    chain = getattr(derivation, "chain_kernel", None)
    return chain["name"] if chain else derivation.spec.name


def print_checked(kernel: Kernel) -> Printed:
    """The kernel IR printed by the mapping its facts ask for (CodegenError when none does)."""
    from .mappings.ctx_common import DEFAULT_OPTIONS
    from .kir.lower import UnsupportedMapping

    try:
        return print_kernel(kernel, DEFAULT_OPTIONS)
    except UnsupportedMapping as exc:
        raise CodegenError(str(exc)) from None


def check_text(derivation: Any, printed: Printed) -> dict[str, Any]:
    """The `kernel` step: every variant's text run on the CPU against the final program; stores
    the record on the derivation (derivation.json and report.md carry it after `lowering`)."""
    from .emu import host_compiler
    from .kernel_check import KERNEL_SEED_OFFSET, KernelCheckError, check_kernel_text

    index = len(derivation.steps) + 2
    seed = int(derivation.seed or 0) + len(derivation.steps) + KERNEL_SEED_OFFSET
    record: dict[str, Any] = {
        "index": index, "rule": "kernel", "kind": "KERNEL", "params": {}, "theorem": None,
        "facts": {"mapping": printed.mapping, "variants": [f"{v.stem}.cu ({v.source.entry})" for v in printed.variants]},
        "validated": ("numerically: the kernel text compiled by the host C++ compiler with the instruction "
                      "wrappers emulated (codegen/emu), run on the CPU vs the final program in float64"),
    }
    compiler = host_compiler()
    if compiler is None:
        record["numeric"] = {"passed": None, "skipped": "no host C++ compiler (g++ / c++) on PATH"}
    else:
        try:
            plan = getattr(derivation, "draw_plan", None)
            record["numeric"] = check_kernel_text(printed, derivation.final, dict(derivation.check_sizes), seed,
                                                  getattr(derivation, "tiles", None) or largest_tiles(derivation), plan.masked_sizes if plan else None)
        except KernelCheckError as exc:
            raise CodegenError(f"kernel: {exc}") from None
    derivation.kernel_check = record
    return record


def largest_tiles(derivation: Any) -> dict[str, int]:
    """{dynamic size: the largest tile any step applied along it} (compiler.checksizes)."""
    from compiler.checksizes import tile_constraints

    out: dict[str, int] = {}
    for prog, step in zip(derivation.programs, derivation.steps):
        for size, ts in tile_constraints(prog, dict(step.params)).items():
            out[size] = max(out.get(size, 0), *ts)
    return out


def plan_json(printed: Printed) -> dict[str, Any]:
    plan = dataclasses.asdict(printed.plan) if printed.plan is not None else None
    return {"mapping": printed.mapping, "plan": plan,
            "variants": [{"stem": v.stem, "entry": v.source.entry, "threads": v.launch.threads,
                          "smem_bytes": v.launch.smem_bytes, "args": list(v.launch.tensor_args + v.launch.size_args
                                                                           + v.launch.extras)}
                         for v in printed.variants]}


def emit(derivation: Any, outdir: Path, kernel: Kernel | None = None,
         printed: Printed | None = None) -> dict[str, Any]:
    """Lower (unless given the kernel IR), print (unless given), compile and check the final
    program into outdir."""
    outdir = Path(outdir)
    if kernel is None:
        kernel, _ = prepare(derivation)
    (outdir / "kir.txt").write_text(show_kernel(kernel))
    if printed is None:
        printed = print_checked(kernel)
    (outdir / "plan.json").write_text(json.dumps(plan_json(printed), indent=2) + "\n")
    result: dict[str, Any] = {"mapping": printed.mapping}
    for v in printed.variants:
        result[v.stem] = _emit_one(v.source, printed.promises, outdir, v.stem)
    return result


def _emit_one(ks: KernelSource, promised: dict[str, Any], outdir: Path, stem: str) -> dict[str, Any]:
    """Compile and check one kernel source: STEM.cu, STEM.cubin, STEM.log, STEM.sass.json."""
    from .cuda.nvrtc import CompileError, compile_cubin, nvrtc_available

    (outdir / f"{stem}.cu").write_text(ks.source)
    result: dict[str, Any] = {"kernel": ks.entry, "threads": ks.threads, "smem_bytes": ks.smem_bytes,
                              "options": list(ks.options)}
    log_name = "compile.log" if stem == "kernel" else f"{stem}.log"
    if not nvrtc_available():
        (outdir / log_name).write_text("NVRTC not available: source written, not compiled\n")
        result["compiled"] = False
        return result
    try:
        comp = compile_cubin(ks.source, ks.entry, tuple(ks.options) + ("-Xptxas=-v",))
    except CompileError as exc:
        (outdir / log_name).write_text(exc.log)
        errors = [ln for ln in exc.log.splitlines() if "error" in ln][:3]
        raise CodegenError(f"NVRTC failed to compile {stem}.cu ({ks.entry}): "
                           + ("; ".join(errors) or str(exc).splitlines()[0])) from None
    (outdir / f"{stem}.cubin").write_bytes(comp.cubin)
    (outdir / log_name).write_text(comp.log)
    result["compiled"] = True
    sass_name = "sass.json" if stem == "kernel" else f"{stem}.sass.json"
    try:
        from .cuda.sass import check_promises, disassemble

        report = disassemble(comp.cubin, ptxas_log=comp.log)
    except Exception as exc:  # disassembler missing: the cubin still stands
        (outdir / sass_name).write_text(json.dumps({"error": str(exc)}) + "\n")
        result["sass_skipped"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return result
    violations = check_promises(report, **promised)
    sass = {
        "promises": promised, "violations": violations, "hmma": report.has_hmma, "hgmma": report.has_hgmma,
        "ldgsts": report.has_ldgsts, "ldsm": report.has_ldsm, "local_memory_ops": report.local_memory_ops,
        "registers": report.registers,
    }
    (outdir / sass_name).write_text(json.dumps(sass, indent=2) + "\n")
    if violations:
        raise CodegenError(f"{stem}: " + "; ".join(violations))
    result["sass"] = sass
    return result
