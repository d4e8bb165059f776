"""`derivc build`'s codegen stage: final program → plan → kernel.cu → cubin → SASS promises.

Writes into the build directory: `plan.json` (what the lowering read off the derivation),
`kernel.cu`, and where NVRTC is present `kernel.cubin`, `compile.log` and `sass.json` with
the promises the schedule made (tensor-core instructions where MAP-MMA was applied, async
copies where CACHE asked for a pipeline, no local-memory spills in tensor-core kernels).
A broken promise fails the build.  A program with no CUDA lowering (e.g. the naive 3-pass
attention branch) is reported in `codegen.txt` and the build still succeeds.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .lower import LoweringError, UnsupportedMapping, lower_to_plan
from .plan import AttentionPlan, ContractionPlan, Plan, inputs


class CodegenError(Exception):
    """The kernel failed to compile or broke a promise of its schedule."""


def plan_json(plan: Plan) -> dict[str, Any]:
    out = dataclasses.asdict(plan)
    out["family"] = "contraction" if isinstance(plan, ContractionPlan) else "online_fold"
    return out


def plan_from_json(data: dict[str, Any]) -> Plan:
    from .plan import GridAxis, Operand

    data = dict(data)
    family = data.pop("family")
    for key in ("a", "b", "c", "q", "k", "v", "o"):
        if isinstance(data.get(key), dict):
            data[key] = Operand(**{**data[key], "dims": tuple(data[key]["dims"])})
    data["grid"] = tuple(GridAxis(**g) for g in data["grid"])
    data["fixed"] = tuple(tuple(x) for x in data["fixed"])
    for key in ("dynamic", "batch"):
        data[key] = tuple(data[key])
    cls = ContractionPlan if family == "contraction" else AttentionPlan
    return cls(**data)


def promises(plan: Plan) -> dict[str, Any]:
    """What the schedule promised about the machine code."""
    staged = [op for op in inputs(plan) if op.level == "shared"]
    return {
        "expect_mma": plan.mma,
        "expect_async_copy": bool(staged) and plan.stages > 1,
        "forbid_spills": plan.mma is not None,
    }


def emit(derivation: Any, outdir: Path) -> dict[str, Any]:
    """Lower, render, compile and check the final program of a derivation into outdir."""
    outdir = Path(outdir)
    try:
        plan = lower_to_plan(derivation.final, derivation.spec.name)
    except UnsupportedMapping as exc:
        raise CodegenError(str(exc)) from None
    except LoweringError as exc:
        (outdir / "codegen.txt").write_text(f"no CUDA kernel: {exc}\n")
        return {"kernel": None, "reason": str(exc)}
    (outdir / "plan.json").write_text(json.dumps(plan_json(plan), indent=2) + "\n")
    variants = [("kernel", False)]
    if isinstance(plan, ContractionPlan) and plan.mma == "wgmma":
        variants.append(("kernel_tma", True))  # warp-specialized TMA variant, chosen at launch
    result: dict[str, Any] = {}
    for stem, tma in variants:
        result[stem] = _emit_one(plan, outdir, stem, tma)
    return result


def _emit_one(plan: Plan, outdir: Path, stem: str, tma: bool) -> dict[str, Any]:
    """Render, compile and check one kernel source: STEM.cu, STEM.cubin, STEM.log, STEM.sass.json."""
    from .nvrtc import CompileError, compile_cubin, nvrtc_available
    from .render import render

    ks = render(plan, tma=tma)
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
        raise CodegenError(f"NVRTC failed to compile {stem}.cu ({ks.entry}): {str(exc).splitlines()[0]}") from None
    (outdir / f"{stem}.cubin").write_bytes(comp.cubin)
    (outdir / log_name).write_text(comp.log)
    result["compiled"] = True
    sass_name = "sass.json" if stem == "kernel" else f"{stem}.sass.json"
    try:
        from .sass import check_promises, disassemble

        report = disassemble(comp.cubin, ptxas_log=comp.log)
    except Exception as exc:  # disassembler missing: the cubin still stands
        (outdir / sass_name).write_text(json.dumps({"error": str(exc)}) + "\n")
        return result
    promised = promises(plan)
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
