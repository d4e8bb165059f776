"""The backward of a spec with `grad:`: GRAD, the gradient program's schedule, then its kernels.

    IR₀ (the spec) --GRAD--> G₀ (gradient program) --grad.schedule--> G --cut at dV--> K₀ --dV's schedule--> K

1. GRAD (compiler/grad.py) differentiates IR₀; it is validated numerically against central
   finite differences of IR₀ (compiler/grad_check.py), not proved.
2. `grad.schedule` rewrites G₀ like any schedule; every step is checked on all the gradients at
   once (the program's `also_outputs` fact, as a spec's further outputs).
3. Each kernel is G read at one tensor: the definitions that tensor needs, where a tensor written
   by the forward build (its output) or by an earlier kernel is marked `computed_by` that step —
   the definition still gives the values every numeric check uses, and the kernel reads it.
   The kernel's own schedule is then derived from that program like a forward schedule.
"""
from __future__ import annotations

import secrets
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator

from .checksizes import choose_check_sizes
from .derive import TERMS_SCALE, Derivation, derive_program, json_safe
from .draws import plan_draws
from .errors import DerivationError, SpecError, did_you_mean
from .grad import RULE, Gradient, differentiate, needed_defs
from .grad_check import TOLERANCE, check_gradient
from .ir import Program, tensors_read
from .kernel_view import kernel_inputs, sizes_used
from .lower_spec import lower_spec
from .spec import GradDecl, GradKernelDecl, SpecFile

FORWARD = "forward"


@dataclass
class GradDerivation:
    spec: SpecFile
    file: str
    gradient: Gradient  # GRAD's program G₀
    record: dict[str, Any]  # GRAD as recorded (the numeric validation)
    shared: Derivation  # grad.schedule on G₀
    kernels: list[Derivation]  # one per grad.kernels entry, in order

    @property
    def decl(self) -> GradDecl:
        assert self.spec.grad is not None
        return self.spec.grad

    def manifest(self) -> dict[str, Any]:
        """grad.json: what the runtime needs to run the backward (build/README contract)."""
        kernels, saved = [], []
        for k in self.kernels:
            prog = k.final
            reads = kernel_inputs(prog)
            for d in prog.defs:
                if d.computed_by == FORWARD and d.name in reads and d.name not in saved:
                    saved.append(d.name)
            out = prog.tensor_type(prog.output)
            entry = {"name": prog.output, "dir": f"grad/{prog.output}", "inputs": reads,
                     "output": prog.output, "dtype": out.dtype, "shape": [str(a) for a in out.dims]}
            also = [{"name": n, "dtype": prog.tensor_type(n).dtype, "shape": [str(a) for a in prog.tensor_type(n).dims]}
                    for n in prog.also_outputs()]
            kernels.append({**entry, "also": also} if also else entry)
        return {"of": self.gradient.of, "seed": self.gradient.seed, "wrt": [x for x, _ in self.gradient.grads],
                "grads": dict(self.gradient.grads), "saved": saved, "kernels": kernels,
                "grad": json_safe(self.record)}


def gradient_program(spec: SpecFile, file: str = "") -> tuple[Program, Gradient]:
    """IR₀ and GRAD's program (no checks)."""
    decl = spec.grad
    assert decl is not None
    try:
        ir0 = lower_spec(spec)
    except SpecError as exc:
        raise exc.in_file(file) from None
    seed = decl.seed or f"d{decl.of}"
    try:
        return ir0, differentiate(ir0, decl.of, decl.wrt, seed)
    except DerivationError as exc:
        raise exc.at(0, file) from None


def cut_kernel(prog: Program, output: str, available: dict[str, str], file: str = "", where: str = "",
               also: tuple[str, ...] = ()) -> Program:
    """G read at `output` (and the further outputs `also`): the definitions they need, those in
    `available` marked as read from the step that writes them."""
    names = [d.name for d in prog.defs]
    for out in (output, *also):
        if out not in names:
            raise SpecError(where, f"{out!r} is not a tensor of the gradient program{did_you_mean(out, names)} "
                                   f"(defined: {', '.join(names)})", file)
        if out in available:
            raise SpecError(where, f"{out} is already written by the {available[out]}", file)
    if len(set((output, *also))) != 1 + len(also):
        raise SpecError(where, f"the kernel names one output twice ({output}, also {', '.join(also)})", file)
    needed = needed_defs(list(prog.defs), {output, *also})
    defs = tuple(replace(d, computed_by=available.get(d.name, "")) for d in needed)
    reads = set().union(*(tensors_read(d.body) for d in needed))
    inputs = tuple((n, t) for n, t in prog.inputs if n in reads)  # what the cut reads, nothing more
    sizes = sizes_used(prog, inputs, defs)  # what the cut's meaning uses (dC0 = dC needs no K)
    facts = (("also_outputs", ",".join(also)),) if also else ()
    return replace(prog, sizes=sizes, inputs=inputs, defs=defs, output=output, facts=facts)


def derive_gradient(spec: SpecFile, file: str = "", *, seed: int | None = None, check: bool = True) -> GradDerivation:
    decl = spec.grad
    assert decl is not None
    base = seed if seed is not None else secrets.randbits(31)
    ir0, gradient = gradient_program(spec, file)
    record: dict[str, Any] = {"rule": RULE, "kind": "GRAD", "of": gradient.of, "wrt": list(decl.wrt),
                              "seed_tensor": gradient.seed, "grads": dict(gradient.grads),
                              "stabilisers": list(gradient.stabilisers),
                              "theorem": None, "validated": "numerically",
                              "after_hash": gradient.program.digest()}
    if check:
        sizes = choose_check_sizes(spec, ir0, [ir0], [])
        plan = plan_draws(ir0, sizes, base)
        try:
            draws = check_gradient(ir0, gradient, plan, base)
        except DerivationError as exc:
            raise exc.at(0, file) from None
        record["numeric"] = {"method": "central finite differences of the spec program, float64, Richardson-extrapolated",
                             "tolerance": TOLERANCE, "passed": True, "draws": draws,
                             "rel_error": max(max(r["rel_error"].values()) for r in draws)}
    with _part("grad.schedule"):
        shared = derive_program(spec, gradient.program, decl.schedule, file, seed=base + 1000, check=check,
                                error_scale=TERMS_SCALE)
    if check:
        record["saved"] = check_saved(ir0, shared.final, gradient.seed, plan, base, file)
    kernels: list[Derivation] = []
    available = forward_outputs(spec)
    for k, (kd, prog) in enumerate(kernel_cuts(shared.final, gradient, decl, available, file)):
        with _part(f"grad.kernels[{k}]"):
            kern = derive_program(spec, prog, kd.schedule, file, seed=base + 2000 + 1000 * k, check=check,
                                  error_scale=TERMS_SCALE)
        kern.grad_kernel = kd.output  # type: ignore[attr-defined]
        kern.grad_trace = {"kernel": kd.output, "grad": json_safe(record),  # type: ignore[attr-defined]
                           "schedule_steps": [s.to_json() for s in shared.steps],
                           "gradient_digest": shared.final.digest(),
                           "stored": stored_as(shared.final, prog, available)}
        kernels.append(kern)
    missing = [g for g in gradient.outputs if g not in available]
    if missing:
        raise SpecError("grad.kernels", f"no kernel writes {', '.join(missing)} (each gradient needs one: "
                                        f"add {{output: {missing[0]}, schedule: [...]}})", file)
    return GradDerivation(spec, file, gradient, record, shared, kernels)


def kernel_cuts(prog: Program, gradient: Gradient, decl: GradDecl, available: dict[str, str],
                file: str = "") -> Iterator[tuple[GradKernelDecl, Program]]:
    """Each kernel's program in order: G read at its output, where the outputs of this kernel and
    the earlier ones that `dtype` stores narrower have that dtype (the kernel stores the rounded
    value, the later kernels read it).  `available` grows by each kernel's output as it is yielded."""
    grads = dict((g, x) for x, g in gradient.grads)
    for k, kd in enumerate(decl.kernels):
        if kd.dtype is not None:
            prog = _stored_in(prog, kd, grads, file, f"grad.kernels[{k}].dtype")
        yield kd, cut_kernel(prog, kd.output, available, file, f"grad.kernels[{k}].output", tuple(kd.also))
        for out in (kd.output, *kd.also):
            available[out] = f"kernel {kd.output}"


def _stored_in(prog: Program, kd: GradKernelDecl, grads: dict[str, str], file: str, where: str) -> Program:
    """prog with kd's output of dtype kd.dtype (a tensor the runtime hands back keeps its input's)."""
    if not prog.has_def(kd.output):
        return prog  # cut_kernel names the unknown tensor
    d = prog.def_named(kd.output)
    if kd.output in grads and kd.dtype != d.type.dtype:
        raise SpecError(where, f"{kd.output} is the gradient of {grads[kd.output]}: it is stored in "
                               f"{grads[kd.output]}'s dtype ({d.type.dtype}), not {kd.dtype}", file)
    return prog.with_def(replace(d, type=replace(d.type, dtype=kd.dtype)))


def stored_as(gradient: Program, prog: Program, available: dict[str, str]) -> list[dict[str, str]]:
    """The tensors of the kernel's program stored in another dtype than the gradient program's
    (grad.kernels' `dtype`), for the record: who writes each, in which dtype."""
    return [{"tensor": d.name, "dtype": d.type.dtype, "program_dtype": gradient.def_named(d.name).type.dtype,
             "written_by": available.get(d.name, "")}
            for d in prog.defs if d.type.dtype != gradient.def_named(d.name).type.dtype]


def forward_outputs(spec: SpecFile) -> dict[str, str]:
    """The tensors the forward build writes (its output and further outputs, e.g. LSE): the
    backward kernels read them as arguments."""
    return {name: FORWARD for name in spec.output.tensors()}


def check_saved(ir0: Program, grad: Program, seed_tensor: str, plan: Any, base: int, file: str = "") -> list[dict[str, Any]]:
    """A further forward output the gradient program defines again under its name (RECOMPUTE's
    LSE) is read from the forward by the backward kernels: its two definitions must agree.
    Compared in float64 on the plan's draws (-inf rows exactly), relative error <= 1e-12."""
    import numpy as np

    from .derive import TOLERANCE, output_error
    from .interp import run_program

    names = [n for n in ir0.also_outputs() if grad.has_def(n)]
    records: list[dict[str, Any]] = []
    for draw in plan.draws(base + 500) if names else ():
        inputs = draw.inputs(ir0)
        fwd = run_program(ir0, draw.sizes, inputs)
        seed = np.random.default_rng(draw.seed).standard_normal(fwd[ir0.output].shape)
        with np.errstate(all="ignore"):
            back = run_program(grad, draw.sizes, {**inputs, seed_tensor: seed})
        for n in names:
            err = output_error(back[n], fwd[n])
            if not err <= TOLERANCE:
                raise DerivationError(RULE, f"the forward writes {n} and the backward reads it, but the gradient "
                                            f"program's {n} differs from the forward's (relative error {err:.3g}, "
                                            f"{draw.kind} draw, seed {draw.seed})", 0, file)
            records.append({"tensor": n, "draw": draw.kind, "seed": draw.seed, "rel_error": err})
    return records


@contextmanager
def _part(where: str) -> Iterator[None]:
    """Errors of a schedule inside `grad:` name it (`grad.kernels[1]`, step 3)."""
    try:
        yield
    except SpecError as exc:
        where_ = exc.where.replace("schedule", f"{where}.schedule", 1) if exc.where.startswith("schedule") else exc.where
        raise SpecError(where_, exc.reason, exc.file) from None
    except DerivationError as exc:
        raise type(exc)(f"{where}: {exc.rule}", exc.reason, exc.step, exc.file) from None


def kernel_program(spec: SpecFile, kernel: str, file: str = "") -> Program:
    """A backward kernel's IR₀ again, without checks (replay, verify, load)."""
    decl = spec.grad
    if decl is None:
        raise DerivationError("replay", f"the trace names backward kernel {kernel}, the spec has no grad", None, file)
    from .derive import apply_step

    _, gradient = gradient_program(spec, file)
    prog = gradient.program
    for k, step in enumerate(decl.schedule, start=1):
        prog = apply_step(prog, k, step.rule, step.params(), file)[3]
    for kd, cut in kernel_cuts(prog, gradient, decl, forward_outputs(spec), file):
        if kd.output == kernel:
            return cut
    raise DerivationError("replay", f"the spec's grad has no kernel {kernel}", None, file)
