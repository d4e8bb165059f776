"""Schedule variants: one schedule file, several proved schedules.

A schedule names its free choices in `variants:` and refers to them in schedule steps as
`$name` (a whole value, e.g. `size: $tile_j`):

    variants: {tile_j: [256, 128], stages: [4, 3]}
    schedule:
      - {rule: tile, def: C, index: j, size: $tile_j}
      - {rule: cache, def: C, tensor: A, at: ko, over: [ii, ki], level: shared, stages: $stages}

Every combination of the values is a complete spec (`resolve`), derived, checked, proved,
lowered and run through the CPU emulation like any other; an illegal one (a precondition that
fails, a tile the mapping refuses) is reported and skipped, never built.  The first value of
each choice gives the default variant: the build directory itself.  The others land in
DIR/variants/<name>/, listed with every refusal in DIR/variants.json, from which `derivc tune`
picks per shape.

A step may apply to some variants only: `when: {split_k: [1]}` (a value or a list of values per
named choice) keeps the step in the variants whose choices are all among the listed values and
drops it from the others.  That is how one file holds a one-kernel GEMM and its split-K chains
(examples/gemm_splitk_tiles_tuned.yaml: the split step and the partial tensor's schedule apply to
S > 1, the plain GEMM's schedule on C to S = 1): a dropped step is not applied at all, so the
variant's derivation is exactly the schedule that remains, and derivation.json lists the
dropped steps (`variant_dropped_steps`).
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from .errors import SpecError
from .spec import ScheduleStep, SpecFile

MAX_VARIANTS = 64  # each is a full derivation and build: more is a search, not a schedule
_PLACEHOLDER = re.compile(r"^\$([A-Za-z_]\w*)$")
WHEN = "when"  # a step's key naming the variants it applies to


@dataclass(frozen=True)
class ScheduleVariant:
    """One combination of the choices and the spec it makes."""

    choice: tuple[tuple[str, int | str], ...]  # in the order `variants:` declares them
    spec: SpecFile                               # no `variants`, no `$name` left

    @property
    def name(self) -> str:
        """A directory name: tile_j-256_stages-4 (values are ints or plain identifiers)."""
        return "_".join(f"{k}-{v}" for k, v in self.choice)

    def as_dict(self) -> dict[str, int | str]:
        return dict(self.choice)


def _placeholders(value: Any) -> list[str]:
    if isinstance(value, str):
        m = _PLACEHOLDER.match(value)
        return [m.group(1)] if m else []
    if isinstance(value, list):
        return [n for x in value for n in _placeholders(x)]
    return []


def _substitute(value: Any, choice: dict[str, int | str]) -> Any:
    if isinstance(value, str):
        m = _PLACEHOLDER.match(value)
        return choice[m.group(1)] if m else value
    if isinstance(value, list):
        return [_substitute(x, choice) for x in value]
    return value


def _when(spec: SpecFile, k: int, step: ScheduleStep) -> dict[str, list[int | str]] | None:
    """Step k's `when:` as {choice: [values]} (checked against `variants:`), None without one."""
    raw = step.params().get(WHEN)
    if raw is None:
        return None
    where = f"schedule[{k}].{WHEN}"
    if not spec.variants:
        raise SpecError(where, "applies a step to some schedule variants: the spec declares no variants:")
    if not isinstance(raw, dict) or not raw:
        raise SpecError(where, "expected {choice: value or [values]}, e.g. {split_k: [1]}")
    out: dict[str, list[int | str]] = {}
    for name, values in raw.items():
        if name not in spec.variants:
            raise SpecError(where, f"{name} is not declared in variants:")
        values = values if isinstance(values, list) else [values]
        for v in values:
            if v not in spec.variants[name] or isinstance(v, bool):
                raise SpecError(where, f"{name}: {v!r} is not one of {spec.variants[name]}")
        out[name] = values
    return out


def _applies(when: dict[str, list[int | str]] | None, choice: dict[str, int | str]) -> bool:
    return when is None or all(choice[n] in vs for n, vs in when.items())


def dropped_steps(spec: SpecFile, choice: dict[str, int | str]) -> list[dict[str, Any]]:
    """The steps of `spec` (with variants) that `choice` does not apply: schedule index, rule, when."""
    out = []
    for k, step in enumerate(spec.schedule):
        when = _when(spec, k, step)
        if not _applies(when, choice):
            out.append({"schedule_index": k, "rule": step.rule, WHEN: when})
    return out


def _check(spec: SpecFile) -> None:
    used: dict[str, str] = {}
    for k, step in enumerate(spec.schedule):
        when = _when(spec, k, step)
        for name in when or {}:
            used.setdefault(name, f"schedule[{k}].{WHEN}")
        for key, value in step.params().items():
            for name in _placeholders(value):
                if name not in spec.variants:
                    raise SpecError(f"schedule[{k}].{key}", f"${name} is not declared in variants:")
                used.setdefault(name, f"schedule[{k}]")
    grad_steps = [] if spec.grad is None else list(enumerate(spec.grad.schedule)) + [
        (k, s) for kd in spec.grad.kernels for k, s in enumerate(kd.schedule)]
    for k, step in grad_steps:
        for key, value in step.params().items():
            if _placeholders(value):
                raise SpecError(f"grad: step {k}.{key}", "variants apply to the forward schedule only")
    for name, values in spec.variants.items():
        if name not in used:
            raise SpecError(f"variants.{name}", f"not used by any schedule step (write ${name} where it applies)")
        if len(set(map(repr, values))) != len(values):
            raise SpecError(f"variants.{name}", "lists a value twice")
        for v in values:
            if isinstance(v, str) and not re.fullmatch(r"[A-Za-z_]\w*", v):
                raise SpecError(f"variants.{name}", f"value {v!r}: a number or a plain identifier")
    count = 1
    for values in spec.variants.values():
        count *= len(values)
    if count > MAX_VARIANTS:
        raise SpecError("variants", f"{count} combinations > {MAX_VARIANTS}: split the schedule file")


def resolve(spec: SpecFile, choice: dict[str, int | str]) -> SpecFile:
    """The spec with `choice` written into the schedule and `variants` gone."""
    if set(choice) != set(spec.variants):
        raise SpecError("variants", f"choice {sorted(choice)} does not name exactly {sorted(spec.variants)}")
    for name, v in choice.items():
        if v not in spec.variants[name]:
            raise SpecError(f"variants.{name}", f"{v!r} is not one of {spec.variants[name]}")
    schedule = [ScheduleStep.model_validate({"rule": s.rule, **{k: _substitute(x, choice) for k, x in s.params().items()
                                                                if k != WHEN}})
                for n, s in enumerate(spec.schedule) if _applies(_when(spec, n, s), choice)]
    return spec.model_copy(update={"schedule": schedule, "variants": {}})


def expand(spec: SpecFile) -> list[ScheduleVariant]:
    """Every combination, the default (first values) first; [the spec itself] without variants."""
    if not spec.variants:
        for k, step in enumerate(spec.schedule):
            _when(spec, k, step)  # a `when:` without variants is refused by name
        return [ScheduleVariant((), spec)]
    _check(spec)
    names = list(spec.variants)
    out = []
    for values in itertools.product(*(spec.variants[n] for n in names)):
        choice = tuple(zip(names, values))
        out.append(ScheduleVariant(choice, resolve(spec, dict(choice))))
    return out
