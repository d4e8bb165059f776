"""derivation.json: the trace of a derivation, and its replay.

The trace records the spec (the schedule file's text, canonical JSON and their hashes), IR₀'s
digest, and for every step the rule, its parameters as written, the facts its precondition
established, the theorem, the program digests before and after, and the numeric check (one
record per draw: kind, seed, scale, largest softmax score, rows without a live element,
relative error; the plan of draws and the tiles without a partial tile at the top level).  `replay` re-applies the recorded
(rule, parameters) to the spec without numeric checks; `verify_roundtrip` asserts that this
gives back exactly the derived program (same digest, equal dataclasses).
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import __version__
from .derive import Derivation, apply_step
from .errors import DerivationError, SpecError
from .ir import Program
from .lower_spec import lower_spec
from .spec import SpecFile, parse_spec_text

TRACE_FORMAT = 1


def spec_json(spec: SpecFile) -> dict[str, Any]:
    # a spec without schedule variants records no `variants` key (traces from before they existed)
    return spec.model_dump(mode="json", exclude=set() if spec.variants else {"variants"})


def spec_sha256(spec: SpecFile) -> str:
    canon = json.dumps(spec_json(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


@lru_cache(maxsize=8)
def _parsed_spec(text: str, file: str) -> SpecFile:
    """parse_spec_text once per text: a build writes (and round-trips) one trace per kernel, a
    gradient build a dozen, each re-reading the same file.  Only compared, never changed."""
    return parse_spec_text(text, file)


def spec_text_of(d: Derivation) -> str | None:
    """The schedule file's text the derivation was made from, or None when unknown.

    A derivation rebuilt from a trace carries the recorded text (`d.spec_text`); otherwise the
    file is read again, and its text is kept only if it still parses to the derived spec (the
    file may have changed since the build read it).
    """
    if hasattr(d, "spec_text"):
        return d.spec_text
    if not d.file:
        return None
    try:
        text = Path(d.file).read_bytes().decode("utf-8")
        spec = _parsed_spec(text, d.file)
        choice = getattr(d, "variant_choice", None)
        if choice is not None:  # one variant of a schedule with `variants:`
            from .schedule_variants import resolve

            spec = resolve(spec, choice)
        return text if spec == d.spec else None
    except (OSError, UnicodeDecodeError, SpecError):
        return None


CODEGEN_STEPS = ("lowering", "kernel")  # checks of codegen recorded after the rules' steps


def codegen_steps(d: Derivation) -> list[dict[str, Any]]:
    """The records of the codegen checks the build ran (kernel IR, then the kernel text)."""
    return [r for r in (getattr(d, "lowering", None), getattr(d, "kernel_check", None)) if r]


def write_trace(d: Derivation) -> dict[str, Any]:
    """The content of derivation.json (JSON-serialisable).

    `spec_text` (added in place, format 1 unchanged: readers ignore it) is the schedule file
    byte for byte, and `spec_file_sha256` its hash: `derivc verify` rebuilds from it.
    """
    text = spec_text_of(d)
    return {
        "format": TRACE_FORMAT,
        "derivc_version": __version__,
        "spec_file": d.file,
        "spec_file_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest() if text is not None else None,
        "spec_sha256": spec_sha256(d.spec),
        "spec_digest": d.initial.digest(),
        "spec": spec_json(d.spec),
        "spec_text": text,
        "check_sizes": dict(d.check_sizes),
        "seed": d.seed,
        "seed_given": d.seed_given,
        "draws": d.draw_plan.to_json() if d.draw_plan is not None else None,
        "check_notes": list(d.check_notes),
        "steps": [s.to_json() for s in d.steps] + codegen_steps(d),
        "final_digest": d.final.digest(),
        "output": d.final.output,
        **({"grad_kernel": d.grad_trace} if getattr(d, "grad_trace", None) else {}),
        **({"chain_kernel": d.chain_kernel} if getattr(d, "chain_kernel", None) else {}),
        **({"variant": d.variant_choice} if getattr(d, "variant_choice", None) is not None else {}),
        **_dropped(d, text),
    }


def _dropped(d: Derivation, text: str | None) -> dict[str, Any]:
    """{"variant_dropped_steps": [...]}: the file's steps this variant does not apply (`when:`),
    so the derivation says which schedule it is; {} when none are dropped."""
    choice = getattr(d, "variant_choice", None)
    if choice is None or text is None:
        return {}
    from .schedule_variants import dropped_steps

    dropped = dropped_steps(parse_spec_text(text, d.file or "<string>"), choice)
    return {"variant_dropped_steps": dropped} if dropped else {}


def spec_of_trace(trace: dict[str, Any]) -> SpecFile:
    """The spec recorded in a trace (so a build directory replays without the YAML file)."""
    return SpecFile.model_validate(trace["spec"])


def replay_programs(
    spec: SpecFile, trace: dict[str, Any], *, upto: int | None = None, strict: bool = True
) -> list[Program]:
    """IR₀ … IRₖ by re-applying the trace's steps (k = upto, default all); no numeric checks.

    With `strict`, the spec and every intermediate program must have the recorded digests.
    """
    file = trace.get("spec_file", "") or ""
    try:
        if trace.get("chain_kernel"):  # one kernel of a chain: the schedule, cut at its definition
            from .kernel_chain import chain_kernel_program

            prog = chain_kernel_program(spec, trace["chain_kernel"]["kernel"], file)
        elif trace.get("grad_kernel"):  # a backward kernel: GRAD, grad.schedule, cut at its output
            from .derive_grad import kernel_program

            prog = kernel_program(spec, trace["grad_kernel"]["kernel"], file)
        else:
            prog = lower_spec(spec)
    except SpecError as exc:
        raise exc.in_file(file) from None
    if strict and trace.get("spec_digest") not in (None, prog.digest()):
        raise DerivationError(
            "replay", f"the spec lowers to {prog.digest()}, the trace was made from {trace['spec_digest']}", None, file
        )
    programs = [prog]
    steps = [s for s in trace.get("steps", []) if s.get("rule") not in CODEGEN_STEPS]  # no rewrite
    if upto is not None:
        if not 0 <= upto <= len(steps):
            raise DerivationError("replay", f"step {upto} out of range: the trace has {len(steps)} steps", None, file)
        steps = steps[:upto]
    for k, step in enumerate(steps, start=1):
        if strict and step.get("before_hash") not in (None, prog.digest()):
            raise DerivationError(step["rule"], f"replay diverged before the step: {prog.digest()} != {step['before_hash']}", k, file)
        _, _, _, prog = apply_step(prog, k, step["rule"], dict(step.get("params", {})), file)
        if strict and step.get("after_hash") not in (None, prog.digest()):
            raise DerivationError(step["rule"], f"replay diverged: program {prog.digest()} != recorded {step['after_hash']}", k, file)
        programs.append(prog)
    return programs


def replay(spec: SpecFile, trace: dict[str, Any], *, upto: int | None = None) -> Program:
    """The program the trace's steps produce from the spec (the last one, or after step `upto`)."""
    return replay_programs(spec, trace, upto=upto)[-1]


def verify_roundtrip(d: Derivation) -> None:
    """Assert: JSON round trip of the trace, then replay, gives the identical final program."""
    trace = json.loads(json.dumps(write_trace(d), allow_nan=False))
    if trace["spec"] != spec_json(d.spec) or spec_of_trace(trace) != d.spec:
        raise AssertionError("the spec does not survive the trace's JSON round trip")
    programs = replay_programs(spec_of_trace(trace), trace, strict=False)
    if len(programs) != len(d.programs):
        raise AssertionError(f"replay gave {len(programs) - 1} steps, the derivation has {len(d.programs) - 1}")
    for k, (got, want) in enumerate(zip(programs, d.programs)):
        if got.digest() != want.digest():
            raise AssertionError(f"replay differs after step {k}: digest {got.digest()} != {want.digest()}")
        if got != want:
            raise AssertionError(f"replay differs after step {k}: same printed program, different IR")
    if trace["final_digest"] != d.final.digest():
        raise AssertionError("the trace's final digest is not the derived program's")
