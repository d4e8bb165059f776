"""report.md: a human-readable account of a derivation, step by step."""
from __future__ import annotations

import json
from typing import Any

from .derive import Derivation, StepRecord
from .printer import show_program


def _value(v: Any) -> str:
    if isinstance(v, str):
        return v
    return json.dumps(v)


def _code(text: str) -> str:
    text = str(text)
    if "\n" in text:
        return "\n\n```\n" + text.rstrip("\n") + "\n```\n"
    tick = "``" if "`" in text else "`"
    return f"{tick}{text}{tick}"


def format_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in params.items()) or "(none)"


def format_sizes(sizes: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


def format_draw(x: dict[str, Any], sizes: dict[str, int]) -> str:
    """One draw of a step's numeric check, in a few words (its sizes where not `sizes`)."""
    what = x["kind"]
    if x.get("scale", 1.0) != 1.0:
        what += f" x{x['scale']:.3g}"
    if x["kind"] == "large" and x.get("score_max"):
        what += f" (score {x['score_max']:.0f})"
    changed = {k: v for k, v in x.get("sizes", {}).items() if sizes.get(k) != v}
    if changed:
        what += f" at {format_sizes(changed)}"
    if x.get("masked_rows"):
        what += f", {x['masked_rows']} masked rows"
    return f"{what}, seed {x['seed']}: {x['rel_error']:.2g}"


def proof_markdown(record: dict[str, Any]) -> str:
    """A step's proof line (its `proof` in derivation.json)."""
    if not record.get("checked"):
        return f"- proof obligation: NOT checked ({record.get('reason', '')})"
    how = "passed earlier, from the cache" if record["cached"] else f"{record['seconds']:.2f} s"
    return f"- proof obligation: checked by {record['by']} ({how})"


def step_markdown(s: StepRecord, proof: dict[str, Any] | None = None) -> str:
    lines = [f"## Step {s.index}: {s.rule} ({s.kind})", ""]
    lines.append(f"- parameters: {_code(format_params(s.params))}")
    lines.append(f"- theorem: `{s.theorem}`")
    if s.facts:
        lines.append("- precondition facts:")
        for k, v in s.facts.items():
            lines.append(f"  - {k}: {_code(_value(v))}")
    else:
        lines.append("- precondition facts: (none)")
    if s.numeric:
        n = s.numeric
        verdict = "passed" if n.get("passed") else "FAILED"
        draws = "; ".join(format_draw(x, n["sizes"]) for x in n.get("draws", ()))
        lines.append(
            f"- numeric check: {verdict} at {format_sizes(n['sizes'])} (tolerance {n['tolerance']:g}"
            + (", relative to the magnitude of the terms" if n.get("error_scale") == "terms" else "") + "): "
            + (draws or f"seed {n['seed']}, relative error {n['rel_error']:.3g}")
        )
    else:
        lines.append("- numeric check: not run")
    if proof is not None:
        lines.append(proof_markdown(proof))
    lines.append(f"- program: `{s.before_hash}` → `{s.after_hash}`")
    return "\n".join(lines) + "\n"


def _plan_lines(d: Derivation) -> list[str]:
    plan = d.draw_plan
    if plan is None:
        return []
    lines = ["Draws of every step: plain (standard normal); large (standard normal × "
             f"{plan.large_scale:.3g}·(1 + 3t) along each input"
             + (f", largest softmax score {plan.score_max:.0f}: exp without the right shift overflows"
                if plan.score_max else "") + ")"]
    if plan.masked_rows:
        lines[0] += f"; {plan.masked_rows} rows without a live element at the check sizes"
    elif plan.masked_sizes is not None:
        changed = {k: v for k, v in plan.masked_sizes.items() if d.check_sizes.get(k) != v}
        lines[0] += (f"; masked at {format_sizes(changed)} "
                     f"({plan.masked_draw_rows} rows without a live element)")
    else:
        lines[0] += "; no size leaves a row without a live element"
    lines[0] += "."
    lines += [f"- {note}" for note in d.check_notes]
    return lines + [""]


def write_report(d: Derivation) -> str:
    """The content of report.md."""
    spec = d.spec
    out = [f"# derivc: {spec.name}", ""]
    if spec.description:
        out += [spec.description.strip(), ""]
    if d.file:
        out += [f"Spec file: `{d.file}`", ""]
    out += ["## Spec", "", "```"]
    out += [f"sizes: {', '.join(f'{k}={v}' for k, v in spec.sizes.items())}"]
    out += [f"input {n}[{', '.join(t.shape)}] : {t.dtype}" for n, t in spec.inputs.items()]
    out += list(spec.statements)
    out += [f"output {spec.output.tensor} : {spec.output.dtype}", "```", ""]
    out += [f"Spec program (IR₀): `{d.initial.digest()}`", ""]
    if d.check_sizes:
        seed = f"{d.seed}" + ("" if d.seed_given else " (random)")
        out += [f"Numeric checks at {format_sizes(d.check_sizes)}; base seed {seed}, step k uses seed + k "
                "(its n-th draw seed + k + n·2³²).", ""]
        out += _plan_lines(d)
    check = getattr(d, "proof_check", None)
    if check is not None:
        out += [("Proofs: " + check.line().removeprefix("proofs: ")) if check.checked
                else f"**Proofs NOT checked** ({check.reason}): the per-step obligations were not run through coqc.", ""]
    grad = getattr(d, "grad_trace", None)
    if grad:
        out += grad_markdown(grad)
    chain = getattr(d, "chain_kernel", None)
    if chain:  # one kernel of a chain (compiler.kernel_chain)
        out += [f"Kernel {chain['kernel']} of a chain of kernels ({', '.join(chain['chain'])}, run in that order): "
                f"this kernel's program (IR₀ and final) is the derivation's final program (`{chain['chain_digest']}`) cut at "
                f"{chain['kernel']}; the steps, their checks and proof obligations are the build directory's "
                "two levels up (`../../report.md`).", ""]
    elif not d.steps:
        out += ["The schedule is empty: the final program is the spec program.", ""]
    for s in d.steps:
        out.append(step_markdown(s, check.step_record(s.index) if check is not None else None))
    out += ["## Final program", "", f"Digest `{d.final.digest()}`.", "", "```", show_program(d.final).rstrip("\n"), "```", ""]
    low = getattr(d, "lowering", None)
    if low:
        n = low["numeric"]
        out += [f"## Step {low['index']}: lowering (kernel IR)", "",
                "The final program, translated to the tile-level kernel IR (`kir.txt`) that the printers print.",
                f"- validated {low['validated']}",
                f"- check at {format_sizes(n['sizes'])}, seed {n['seed']}: relative error {n['rel_error']:.1e} "
                f"(tolerance {n['tolerance']:.0e}) — {'passed' if n['passed'] else 'FAILED'}",
                "- not proved: the kernel IR's semantics has no Coq / Lean export yet; this step is checked numerically only",
                ""]
    kc = getattr(d, "kernel_check", None)
    if kc:
        out += kernel_step_markdown(kc)
    return "\n".join(out)


def grad_markdown(grad: dict[str, Any]) -> list[str]:
    """How a backward kernel's program came from the spec: GRAD, grad.schedule, the cut."""
    g = grad["grad"]
    grads = ", ".join(f"d{g['of']}/d{x} = {dx}" for x, dx in g["grads"].items())
    out = [f"## Backward kernel {grad['kernel']}", "",
           f"This kernel computes `{grad['kernel']}` of the backward of `{g['of']}` (seed adjoint `{g['seed_tensor']}`).",
           "", "### Step 0: grad (GRAD)", "",
           f"- reverse-mode differentiation of the spec's statements: {grads}",
           "- **validated numerically, not proved**: no Coq / Lean theorem covers GRAD yet"]
    n = g.get("numeric")
    if n:
        for r in n["draws"]:
            errs = ", ".join(f"{x} {e:.1e}" for x, e in r["rel_error"].items())
            out.append(f"- {n['method']}, draw {r['draw']} (×{r['scale']:.3g}, seed {r['seed']}) at "
                       f"{format_sizes(r['sizes'])}: relative error {errs} (tolerance {n['tolerance']:g})")
    else:
        out.append("- numeric check: not run")
    for s in grad.get("schedule_steps", []):
        num = s.get("numeric") or {}
        err = f"relative error {num['rel_error']:.1e}" if num else "not checked"
        out.append(f"- grad.schedule step {s['index']}: {s['rule']} ({s['kind']}), theorem `{s['theorem']}`, "
                   f"{err} on every gradient")
    out += [f"- the gradient program (`{grad['gradient_digest']}`) read at `{grad['kernel']}`: the spec program "
            "of the steps below; tensors other build steps write are marked `(read from …)`"]
    for t in grad.get("stored", []):
        who = t["written_by"] or "this kernel"
        out.append(f"- `{t['tensor']}` is stored in {t['dtype']} (the gradient program's {t['program_dtype']}), written by "
                   f"{who}: a storage choice of `grad.kernels` (`dtype:`), not part of GRAD and not proved; validated "
                   f"numerically only — the kernel that writes it is compared with the float64 reference rounded to "
                   f"{t['dtype']}, a kernel that reads it gets the rounded values and is compared with the reference "
                   "computed from them (the rounding's effect on the gradients is measured by the GPU test against "
                   "float64 torch.autograd)")
    return out + [""]


def kernel_step_markdown(kc: dict) -> list[str]:
    """The `kernel` step: the printed text run on the CPU, one line per variant and draw."""
    out = [f"## Step {kc['index']}: kernel (the kernel text on the CPU)", "",
           f"The printed kernel ({', '.join(kc['facts']['variants'])}, mapping `{kc['facts']['mapping']}`), "
           "compiled by the host C++ compiler with the instruction wrappers emulated, run against the final "
           "program in float64.", f"- validated {kc['validated']}"]
    n = kc["numeric"]
    if n.get("skipped"):
        out.append(f"- NOT RUN: {n['skipped']}")
    for r in n.get("draws", []):
        out.append(f"- {r['variant']}.cu, draw {r['draw']} (inputs ×{r['scale']:g}, seed {r['seed']}, "
                   f"{r['order']} order) at {format_sizes(r['sizes'])}: relative error {r['rel_error']:.1e}, "
                   f"worst element {r['max_elem_error']:.1e} of max|ref| (tolerance {r['tolerance']:.0e}) — "
                   f"{'passed' if r['passed'] else 'FAILED'}")
    out += ["- trusted: the emulation of the instruction wrappers (checked against the GPU by "
            "tests/gpu/test_emu_instr_gpu.py), the host C++ compiler, NVRTC / ptxas and the hardware", ""]
    return out
