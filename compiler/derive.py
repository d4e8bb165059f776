"""The derivation driver: spec → IR₀ → IR₁ … IRₙ, one checked rule application per step.

For each schedule step k (1-based) the rule's parameters are validated, its precondition is
checked (`rule.check` → facts), the rewrite is applied, and the new program is compared with
the spec program IR₀ by the reference interpreter in float64 on several draws of fresh
random inputs (plain, large magnitude, masked rows: compiler/draws.py) at the check sizes
(relative error ≤ 1e-12; a NaN / inf where the spec is finite fails).  Any failure stops the derivation:

- an unknown rule or bad parameters is an input error (`SpecError`, exit 2);
- a failed precondition or numeric check is a `DerivationError` (exit 3) naming the step.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import numpy as np

from . import ir, progress
from .checksizes import check_size_notes, check_step_work, choose_check_sizes, tiled_sizes
from .draws import Draw, DrawPlan, plan_draws, reference
from .errors import DerivationError, SpecError
from .interp import rel_error, run_program
from .ir import Program
from .lower_spec import lower_spec
from .magnitude import magnitudes, terms_error
from .printer import show_def, show_expr, show_program
from .rules import RULES
from .rules.base import Rule, StepParams
from .spec import ScheduleStep, SpecFile

TOLERANCE = 1e-12
OUTPUT_SCALE = "output"  # a step's error relative to the norm of the reference output
TERMS_SCALE = "terms"  # ... to the norm of the magnitudes of its terms (a gradient program's steps)


@dataclass
class StepRecord:
    """One applied step, as recorded in derivation.json (`to_json`) and report.md."""

    index: int
    rule: str
    kind: str
    params: dict[str, Any]  # as written in the schedule (what replay re-applies)
    facts: dict[str, Any]  # JSON-safe
    theorem: str
    before_hash: str
    after_hash: str
    # {sizes, seed, rel_error (the worst draw's), tolerance, passed, draws}; None: not checked
    numeric: dict[str, Any] | None
    resolved: dict[str, Any] = field(default_factory=dict)  # parameters with defaults filled in
    # Not serialised: what the obligation exporter needs.
    parsed: Any = field(default=None, repr=False, compare=False)
    raw_facts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "rule": self.rule,
            "kind": self.kind,
            "params": json_safe(self.params),
            "resolved_params": json_safe(self.resolved),
            "theorem": self.theorem,
            "facts": self.facts,
            "before_hash": self.before_hash,
            "after_hash": self.after_hash,
            "numeric": self.numeric,
        }


@dataclass
class Derivation:
    spec: SpecFile
    file: str
    programs: list[Program]  # IR₀ … IRₙ
    steps: list[StepRecord]
    check_sizes: dict[str, int] = field(default_factory=dict)
    draw_plan: DrawPlan | None = None  # the draws every step is checked on
    check_notes: tuple[str, ...] = ()  # tiles without a partial last tile at the check sizes
    seed: int | None = None  # base seed: step k used seed + k
    seed_given: bool = False

    @property
    def initial(self) -> Program:
        return self.programs[0]

    @property
    def final(self) -> Program:
        return self.programs[-1]


# --------------------------------------------------------------------------- JSON-safe facts


# Facts a rule keeps for its rewrite and for the obligation exporter (IR nodes, matched
# parts), not for the reader: left out of derivation.json and report.md.
INTERNAL_FACTS = frozenset({"site", "parts", "pattern", "bounds"})


def json_safe(x: Any) -> Any:
    """Facts and parameters as JSON values: IR nodes printed, tuples as lists."""
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return json_safe(float(x))
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        items = sorted(x, key=str) if isinstance(x, (set, frozenset)) else x
        return [json_safe(v) for v in items]
    if isinstance(x, StepParams):
        return json_safe(x.model_dump(mode="json", by_alias=True))
    if isinstance(x, Program):
        return show_program(x)
    if isinstance(x, ir.Def):
        return show_def(x)
    if isinstance(x, (ir.Const, ir.Read, ir.Bin, ir.Un, ir.Reduce, ir.Select, ir.Softmax, ir.Let, ir.Fold)):
        return show_expr(x)
    if isinstance(x, (ir.Aff, ir.Ext, ir.Cond, ir.Or, ir.Mapping)):
        return str(x)
    if is_dataclass(x) and not isinstance(x, type):
        return {f.name: json_safe(getattr(x, f.name)) for f in fields(x)}
    return str(x)


# --------------------------------------------------------------------------- one step


def lookup_rule(name: str, k: int, file: str = "") -> Rule:
    rule = RULES.get(name)
    if rule is None:
        known = ", ".join(sorted(RULES)) or "none registered"
        raise SpecError(f"schedule[{k - 1}].rule", f"step {k}: unknown rule {name!r} (known rules: {known})", file)
    return rule


def apply_step(
    prog: Program, k: int, rule_name: str, raw: dict[str, Any], file: str = ""
) -> tuple[Rule, StepParams, dict[str, Any], Program]:
    """Parameters, precondition and rewrite of step k; errors attributed to the step."""
    rule = lookup_rule(rule_name, k, file)
    try:
        params = rule.parse_params(raw)
    except DerivationError as exc:
        raise SpecError(f"schedule[{k - 1}]", f"step {k} ({rule.name}): {exc.reason}", file) from None
    try:
        facts = rule.check(prog, params)
        new = rule.rewrite(prog, params, facts)
    except DerivationError as exc:
        raise exc.at(k, file) from None
    except Exception as exc:
        if hasattr(exc, "add_note"):  # a bug in the rule: say where
            exc.add_note(f"(at step {k}, rule {rule.name})")
        raise
    if not isinstance(new, Program):
        raise DerivationError(rule.name, f"rewrite returned {type(new).__name__}, not a Program", k, file)
    return rule, params, dict(facts or {}), new


# --------------------------------------------------------------------------- numeric check


def numeric_check(rule: str, ir0: Program, new: Program, plan: DrawPlan, seed: int,
                  error_scale: str = OUTPUT_SCALE) -> list[dict[str, Any]]:
    """One record per draw of the plan at the step's seed: new's output vs IR₀'s on the draw's
    inputs; raises on failure.

    A failure is a relative error above the tolerance, or a NaN / ±inf of the new program
    where the spec's value is finite (the spec must be finite on every draw).  The error is
    relative to the output's norm (OUTPUT_SCALE), or with TERMS_SCALE to the norm of the
    magnitudes of the terms the output is computed from (compiler/magnitude.py): a gradient is a
    sum that cancels, its rounding is measured against what was summed."""
    from .checkcache import cached

    return cached(("numeric_check", rule, ir0, new, plan, seed, error_scale),
                  lambda: [_check_draw(rule, ir0, new, plan, draw, error_scale) for draw in plan.draws(seed)])


def _check_draw(rule: str, ir0: Program, new: Program, plan: DrawPlan, draw: Draw, error_scale: str) -> dict[str, Any]:
    shown = ", ".join(f"{n}={v}" for n, v in draw.sizes.items())
    try:
        draw, tensors, score = reference(ir0, draw, plan.degree)
    except Exception as exc:  # noqa: BLE001 - the spec program itself cannot be evaluated
        raise DerivationError(rule, f"numeric check: the spec program fails at sizes {shown}: {_exc_text(exc)}") from None
    seed = draw.seed
    what = draw.kind if draw.kind != "large" else f"large (inputs x {draw.scale:.4g})"
    outputs = checked_outputs(ir0)
    for name in outputs:  # -inf is allowed: log 0, the log-sum-exp of a row the mask empties
        if np.any(np.isnan(tensors[name]) | (tensors[name] == np.inf)):
            raise DerivationError(
                rule, f"numeric check: the spec program gives non-finite values of {name} at sizes {shown} "
                      f"({what} draw, seed {seed})")
    inputs = {name: tensors[name] for name, _ in ir0.inputs}
    try:
        with np.errstate(all="ignore"):  # an overflow of the new program shows in its output
            got = run_program(new, draw.sizes, inputs)
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - an ill-formed rewritten program
        raise DerivationError(
            rule, f"numeric check failed: the rewritten program fails at sizes {shown} ({what} draw, seed {seed}): "
            f"{_exc_text(exc)}"
        ) from None
    mags = magnitudes(ir0, draw.sizes, inputs) if error_scale == TERMS_SCALE else {}
    err = 0.0
    for name in outputs:
        out, ref = got.get(name, np.full((), np.nan)), tensors[name]
        e = terms_error(out, ref, mags[name]) if mags else output_error(out, ref)
        if not e <= TOLERANCE:
            bad = int(np.sum(~np.isfinite(out))) if out.shape == ref.shape else 0
            why = (f"{bad} NaN / inf values where the spec is finite" if bad
                   else f"relative error {e:.3g} > {TOLERANCE:g}")
            of = f" of {name}" if len(outputs) > 1 else ""
            raise DerivationError(rule, f"numeric check failed: {why}{of} at sizes {shown} ({what} draw, seed {seed})")
        err = max(err, e)
    return draw.record(err, plan.sizes, score, plan.masked_rows_of(draw))


def output_error(out: np.ndarray, ref: np.ndarray) -> float:
    """`rel_error`, where the spec's -inf (the log of an empty sum: LSE of a row with no live
    key) must be matched exactly and the finite rest is compared."""
    ninf = ref == -np.inf
    if not ninf.any():
        return rel_error(out, ref)
    if out.shape != ref.shape or not np.array_equal(out[ninf], ref[ninf]):
        return float("inf")
    return rel_error(np.where(ninf, 0.0, out), np.where(ninf, 0.0, ref))


def checked_outputs(prog: Program) -> tuple[str, ...]:
    """The tensors a step must preserve: the output and the program's further outputs (a spec's
    `output.also`, a gradient program's other gradients)."""
    return (prog.output,) + prog.also_outputs()


def _exc_text(exc: BaseException) -> str:
    from .interp import InterpError

    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if isinstance(exc, InterpError) else f"{type(exc).__name__}: {text}"


# --------------------------------------------------------------------------- the driver


def _plan(rule: str, ir0: Program, sizes: dict[str, int], base: int, tiled: frozenset[str]) -> DrawPlan:
    """The draws of every step (made at the first step checked, and failing there)."""
    try:
        return plan_draws(ir0, sizes, base, tiled)
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - the spec program cannot be evaluated at these sizes
        shown = ", ".join(f"{n}={v}" for n, v in sizes.items())
        raise DerivationError(rule, f"numeric check: the spec program fails at sizes {shown}: {_exc_text(exc)}") from None


Applied = tuple[Rule, StepParams, dict[str, Any], Program]


def _prepass(ir0: Program, schedule: list[ScheduleStep], n: int) -> list[Applied]:
    """Each step applied without numeric checks; stops quietly at the first failure."""
    applied: list[Applied] = []
    prog = ir0
    for k, step in enumerate(schedule[:n], start=1):
        try:
            applied.append(apply_step(prog, k, step.rule, step.params()))
        except Exception:  # noqa: BLE001 - reported by the real pass, at its step
            break
        prog = applied[-1][3]
    return applied


def derive(
    spec: SpecFile,
    file: str = "",
    *,
    seed: int | None = None,
    check: bool = True,
    upto: int | None = None,
) -> Derivation:
    """Apply the schedule to the spec, checking every step; returns the whole derivation.  A spec
    with schedule variants derives its default (the first value of each choice; `derivc build`
    derives the others beside it)."""
    choice = None
    if spec.variants:
        from .schedule_variants import expand

        try:
            default = expand(spec)[0]
        except SpecError as exc:
            raise exc.in_file(file) from None
        spec, choice = default.spec, default.as_dict()
    try:
        ir0 = lower_spec(spec)
    except SpecError as exc:
        raise exc.in_file(file) from None
    d = derive_program(spec, ir0, spec.schedule, file, seed=seed, check=check, upto=upto)
    if choice is not None:
        d.variant_choice = choice
    return d


def derive_program(
    spec: SpecFile,
    ir0: Program,
    schedule: list[ScheduleStep],
    file: str = "",
    *,
    seed: int | None = None,
    check: bool = True,
    upto: int | None = None,
    error_scale: str = OUTPUT_SCALE,
) -> Derivation:
    """Apply `schedule` to the program `ir0` (the spec's, or a kernel of its gradient), checking
    every step against ir0 (the error relative to `error_scale`: see numeric_check)."""
    n = len(schedule) if upto is None else max(0, min(upto, len(schedule)))
    base = seed if seed is not None else secrets.randbits(31)
    # The check sizes depend on the programs the steps apply to: apply them first, and reuse
    # those applications below (a rewrite is a function of the program and the parameters).
    applied = _prepass(ir0, schedule, n) if check else []
    before = [ir0] + [a[3] for a in applied]
    step_params = [s.params() for s in schedule[:n]]
    try:
        sizes = choose_check_sizes(spec, ir0, before, step_params) if check else {}
        if check:
            check_step_work(before, [s.rule for s in schedule[:n]], step_params, sizes)
    except SpecError as exc:
        raise exc.in_file(file) from None
    notes = tuple(check_size_notes(spec, ir0, sizes, before, step_params)) if check else ()
    plan: DrawPlan | None = None
    programs = [ir0]
    records: list[StepRecord] = []
    prog = ir0
    for k, step in enumerate(schedule[:n], start=1):
        raw = step.params()
        if k <= len(applied):
            rule, params, facts, new = applied[k - 1]
        else:
            rule, params, facts, new = apply_step(prog, k, step.rule, raw, file)
        numeric = None
        if check:
            progress.report(k - 1, n, f"step {k} ({rule.name})")
            step_seed = base + k
            try:
                plan = plan or _plan(rule.name, ir0, sizes, base, tiled_sizes(before, step_params))
                draws = numeric_check(rule.name, ir0, new, plan, step_seed, error_scale)
            except DerivationError as exc:
                raise exc.at(k, file) from None
            numeric = {
                "sizes": dict(sizes),
                "seed": step_seed,
                "rel_error": max((d["rel_error"] for d in draws), default=0.0),
                "tolerance": TOLERANCE,
                "error_scale": error_scale,
                "passed": True,
                "draws": draws,
            }
        theorem = facts.get("theorem") if isinstance(facts.get("theorem"), str) else rule.theorem
        records.append(
            StepRecord(
                index=k,
                rule=rule.name,
                kind=rule.kind,
                params=json_safe(raw),
                facts=json_safe({k: v for k, v in facts.items() if k not in INTERNAL_FACTS}),
                theorem=theorem,
                before_hash=prog.digest(),
                after_hash=new.digest(),
                numeric=numeric,
                resolved=json_safe(params),
                parsed=params,
                raw_facts=facts,
            )
        )
        programs.append(new)
        prog = new
    if check:
        progress.report(n, n, "derived")
    return Derivation(
        spec=spec,
        file=file,
        programs=programs,
        steps=records,
        check_sizes=dict(sizes),
        draw_plan=plan,
        check_notes=notes,
        seed=base,
        seed_given=seed is not None,
    )
