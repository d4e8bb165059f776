"""The `derivc` command line.

    derivc build FILE -o DIR [--seed N] [--no-codegen] [--no-proofs] [--verify]
                                                         derive, check (proofs too, if coqc), write DIR
    derivc explain FILE [--seed N] [--upto N | --step N] [--hint]   every step and its program; next steps
    derivc explain --rules                              the rule-parameter reference (docs/rules.md)
    derivc verify DIR | replay DIR --step N | run FILE --check | bench
    derivc tune DIR --sizes M=128,N=4096,K=4096 [--sizes ...]  time the schedule variants per shape

Exit codes (README's table): 0 ok, 1 internal error or command not available here (verify
without coqc, run / bench without a GPU), 2 invalid input (SpecError, StepInputError, an output
directory derivc may not replace), 3 derivation failed (DerivationError: precondition, numeric
check, codegen), 4 verify failed or a proof obligation failed, 130 / 143 interrupted by SIGINT / SIGTERM.
Every error is ONE line on stderr: `derivc: error: <file>: <where>: <reason>`.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import traceback
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

from . import __version__, proofcheck
from .console import Out
from .proofcheck import ProofCheck
from .outdir import (
    BUILD_MARKER, OutputRefused, Terminated, atomic_dir, check_replaceable, dir_identity, interrupts_raise,
    outcome_line, signals_held, write_marker,
)
from .errors import (
    EXIT_DERIVATION_FAILED,
    EXIT_INVALID_INPUT,
    EXIT_OK,
    EXIT_VERIFY_FAILED,
    DerivationError,
    SpecError,
)

EXIT_INTERNAL = 1
EXIT_UNAVAILABLE = 1
EXIT_BROKEN_PIPE = 141  # what a shell reports for a writer that SIGPIPE ended (`derivc explain F | head`)

class UsageError(Exception):
    """Bad command-line use (exit 2)."""

    exit_code = EXIT_INVALID_INPUT


class BuildError(Exception):
    """A later build stage (proof obligations, codegen) failed (exit 3).  `keep`: files of
    the unfinished build worth keeping (moved to DIR.failed/ by atomic_dir)."""

    exit_code = EXIT_DERIVATION_FAILED

    def __init__(self, message: str, keep: Sequence[str] = ()):
        super().__init__(message)
        self.keep = tuple(keep)


class ProofCheckError(BuildError):
    """coqc rejected an obligation (exit 4), or `build --verify` found no coqc (exit 1)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


# --------------------------------------------------------------------------- output


def error_line(message: str) -> None:
    """The one line every failure prints (plain, never wrapped)."""
    text = " ".join(str(message).split("\n"))
    sys.stderr.write(f"derivc: error: {text}\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------- build


def _optional(module: str) -> Any | None:
    """Import a module that another part of the project may not have written yet."""
    try:
        return import_module(module)
    except ModuleNotFoundError as exc:
        parts = module.split(".")
        if exc.name in {".".join(parts[: k + 1]) for k in range(len(parts))}:
            return None
        raise


@dataclass(frozen=True)
class ProofPolicy:
    """What a build does about its proof obligations.  `recorded`: the check a build directory
    records (verify's rebuild writes it back instead of running coqc)."""

    check: bool = True  # run coqc when it is on PATH
    use_cache: bool = True
    recorded: ProofCheck | None = None


def write_outputs(derivation: Any, outdir: Path, *, codegen: bool = True, proofs: bool = True,
                  policy: ProofPolicy = ProofPolicy()) -> ProofCheck:
    """Write every build output into `outdir` (an existing, empty directory).

    The obligations are written first and checked by coqc (`compiler.proofcheck`, in the
    background) while the kernel is generated and checked; derivation.json and report.md, which
    record the proof check, come last.  A failing obligation raises ProofCheckError (exit 4)."""
    from .report import write_report
    from .trace import write_trace

    d = derivation
    obligations = _optional("compiler.obligations") if proofs else None
    exported = obligations is not None and hasattr(obligations, "write_obligations")
    if exported:
        try:
            obligations.write_obligations(d, outdir / "proofs")
        except (SpecError, DerivationError):
            raise
        except Exception as exc:
            raise BuildError(f"{d.file}: proof obligations: {_one_line(exc)}") from exc
    pending = None
    if policy.recorded is not None:
        check = policy.recorded
    elif not proofs:
        check = proofcheck.not_checked(proofcheck.SKIPPED)
    elif not exported:
        check = proofcheck.not_checked("no obligations exported")
    elif not policy.check or proofcheck.coqc_path() is None:
        check = proofcheck.not_checked(proofcheck.NO_COQC)
    else:
        with signals_held():  # its threads block SIGINT / SIGTERM for good: see codegen.cuda.nvrtc
            pending = proofcheck.start_check(outdir / "proofs", use_cache=policy.use_cache)
    try:
        _write_program_and_kernel(d, outdir, codegen)
    except BaseException:
        if pending is not None:
            pending.cancel()
        raise
    if pending is not None:
        check = pending.result()
        if check.failure is not None:
            raise ProofCheckError(f"{d.file}: {check.failure.failure_line()}", EXIT_VERIFY_FAILED)
    d.proof_check = check
    trace = proofcheck.attach(write_trace(d), check)
    (outdir / "derivation.json").write_text(json.dumps(trace, indent=2, allow_nan=False) + "\n")
    (outdir / "report.md").write_text(write_report(d))
    write_marker(outdir, BUILD_MARKER)
    return check


def _write_program_and_kernel(d: Any, outdir: Path, codegen: bool) -> None:
    """steps/, program.txt and (with codegen) the kernel: lowering, its text on the CPU, NVRTC."""
    from .printer import show_program

    build = _optional("codegen.build") if codegen else None
    kernel = printed = None
    if build is not None:  # `lowering`: the kernel IR vs the final program; `kernel`: its text on the CPU
        try:
            kernel, _ = build.prepare(d)
            printed = build.print_checked(kernel)
            build.check_text(d, printed)
        except Exception as exc:
            keep = []
            if printed is not None:  # the text that failed, to read beside the error
                for v in printed.variants:
                    (outdir / f"{v.stem}.cu").write_text(v.source.source)
                    keep.append(f"{v.stem}.cu")
            raise BuildError(f"{d.file}: codegen: {_one_line(exc)}", keep) from exc
    steps = outdir / "steps"
    steps.mkdir()
    width = max(2, len(str(len(d.steps))))
    (steps / f"{0:0{width}d}_spec.txt").write_text(show_program(d.programs[0]))
    for rec, prog in zip(d.steps, d.programs[1:]):
        (steps / f"{rec.index:0{width}d}_{rec.rule}.txt").write_text(show_program(prog))
    (outdir / "program.txt").write_text(show_program(d.final))
    if build is not None:
        try:
            d.checks_skipped = _checks_skipped(build.emit(d, outdir, kernel, printed))
        except (SpecError, DerivationError):
            raise
        except Exception as exc:  # kernel sources and compiler logs help to see why
            keep = sorted((p.name for p in outdir.iterdir() if p.suffix in (".cu", ".log")),
                          key=lambda n: (not n.endswith(".cu"), n))
            raise BuildError(f"{d.file}: codegen: {_one_line(exc)}", keep) from exc


def _checks_skipped(emitted: dict[str, Any] | None) -> str | None:
    """The console line for a kernel NVRTC did not compile or whose SASS was not checked."""
    variants = [r for r in (emitted or {}).values() if isinstance(r, dict) and "compiled" in r]
    if any(not r["compiled"] for r in variants):
        return ("kernel NOT compiled: NVRTC not found (pip install nvidia-cuda-nvrtc-cu12, or set "
                "DERIVC_NVRTC_LIB); the NVRTC and SASS checks were skipped")
    skipped = [r["sass_skipped"] for r in variants if r.get("sass_skipped")]
    return f"SASS checks skipped: {skipped[0]}" if skipped else None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if not first or type(exc).__module__ == "builtins" else first


def build_to(file: Path, outdir: Path, *, seed: int | None = None, codegen: bool = True,
             proofs: bool = True, verify: bool = False) -> Any:
    """Derive `file` and write the build directory atomically; returns the Derivation.

    coqc checks the obligations (when on PATH, cached per obligation) before the directory is
    moved into place; `verify` requires coqc and trusts no cache."""
    from .derive import derive
    from .schedule_variants import expand
    from .spec import load_spec_file
    from .trace import verify_roundtrip

    if outdir.exists() and not outdir.is_dir():
        raise UsageError(f"-o {outdir}: exists and is not a directory")
    check_replaceable(outdir.absolute())  # refuse before deriving, not after
    if verify and not proofs:
        raise UsageError("build: --verify checks the proof obligations: it cannot go with --no-proofs")
    if verify and proofcheck.coqc_path() is None:
        raise ProofCheckError(f"{file}: --verify: coqc not found, nothing built (install Coq 8.16: "
                              "bash proofs_ci/install_coq.sh, or build without --verify)", EXIT_UNAVAILABLE)
    spec = load_spec_file(file)
    variants = expand(spec)  # [the spec itself] when it names no variants
    spec = variants[0].spec
    d = derive(spec, str(file), seed=seed)
    if variants[0].choice:
        d.variant_choice = variants[0].as_dict()
    backward = None
    if spec.grad is not None:
        from .derive_grad import derive_gradient

        backward = derive_gradient(spec, str(file), seed=d.seed)
        for k in backward.kernels:  # their seeds follow the forward's, given or drawn
            k.seed_given = d.seed_given
        d.backward = backward
    for one in [d] + (backward.kernels if backward else []):
        try:
            verify_roundtrip(one)
        except AssertionError as exc:
            raise DerivationError("trace", f"the derivation does not replay: {exc}", None, str(file)) from None
    policy = ProofPolicy(use_cache=not verify)

    def write(tmp: Path) -> None:
        write_one_or_chain(d, tmp, codegen=codegen, proofs=proofs, policy=policy)
        if backward is not None:
            write_backward(backward, tmp, codegen=codegen, proofs=proofs, policy=lambda _: policy)
        if len(variants) > 1:
            from .variant_build import write_variants

            write_variants(variants[0], variants[1:], tmp, file=str(file), seed=d.seed, seed_given=d.seed_given,
                           write=lambda dv, sub: write_one_or_chain(dv, sub, codegen=codegen, proofs=proofs, policy=policy))
            write_marker(tmp, BUILD_MARKER)  # over the variants' files too

    atomic_dir(outdir, write)
    return d


def write_one_or_chain(d: Any, outdir: Path, *, codegen: bool, proofs: bool, policy: ProofPolicy) -> None:
    """write_outputs, or for a final program its `kernels` fact marks as a chain of kernels (and
    codegen): OUT's own files without a kernel, then OUT/kernels/ (compiler.kernel_chain); a
    kernel's directory has no steps, so no obligations of its own."""
    from .kernel_chain import KERNEL_PROOFS, chain_of, write_chain

    chain = codegen and chain_of(d)
    write_outputs(d, outdir, codegen=codegen and not chain, proofs=proofs, policy=policy)
    if chain:
        none = ProofPolicy(recorded=proofcheck.not_checked(KERNEL_PROOFS if proofs else proofcheck.SKIPPED))

        def write_kernel(k: Any, sub: Path) -> None:
            try:
                write_outputs(k, sub, codegen=True, proofs=proofs, policy=none)
            except BuildError as exc:  # name the kernel; keep its failed text under its directory
                where = sub.relative_to(outdir).as_posix()
                raise BuildError(f"{exc} (kernel {k.final.output} of the chain: {where}/)",
                                 [f"{where}/{n}" for n in exc.keep]) from None

        write_chain(d, outdir, write_kernel)
        write_marker(outdir, BUILD_MARKER)  # over the kernels' files too


def write_backward(backward: Any, outdir: Path, *, codegen: bool, proofs: bool,
                   policy: Callable[[str], ProofPolicy]) -> None:
    """OUT/grad/proofs/ (the obligations of grad.schedule's steps, checked by coqc like a
    build's), OUT/grad/<kernel>/ (an ordinary build directory per backward kernel) and
    OUT/grad.json."""
    obligations = _optional("compiler.obligations") if proofs else None
    if obligations is not None and backward.shared.steps:
        where = outdir / "grad" / "proofs"
        obligations.write_obligations(backward.shared, where)
        shared = policy("")
        if shared.recorded is None and shared.check and proofcheck.coqc_path() is not None:
            check = proofcheck.start_check(where, use_cache=shared.use_cache).result()
            if check.failure is not None:
                raise ProofCheckError(f"{backward.file}: grad.schedule: {check.failure.failure_line()}",
                                      EXIT_VERIFY_FAILED)
            backward.schedule_proofs = check
    for k in backward.kernels:
        sub = outdir / "grad" / k.grad_kernel
        sub.mkdir(parents=True)
        write_outputs(k, sub, codegen=codegen, proofs=proofs, policy=policy(k.grad_kernel))
    (outdir / "grad.json").write_text(json.dumps(backward.manifest(), indent=2, allow_nan=False) + "\n")
    write_marker(outdir, BUILD_MARKER)  # the forward's marker, now over the backward's files too


def _variants_table(build: Path) -> dict[str, Any] | None:
    from .variant_build import read_variants

    return read_variants(build)


def cmd_build(args: argparse.Namespace, out: Out) -> int:
    from .progress import progress_line

    with progress_line(f"building {args.file}"):  # stderr, only on a terminal, after 1 s
        d = build_to(Path(args.file), Path(args.output), seed=args.seed, codegen=not args.no_codegen,
                     proofs=not args.no_proofs, verify=args.verify)
    spec = d.spec
    rows = [
        [str(s.index), s.rule, s.kind, s.theorem, f"{s.numeric['rel_error']:.1e}" if s.numeric else "-"]
        for s in d.steps
    ]
    if rows:
        out.table(["#", "rule", "kind", "theorem", "rel. error"], rows, title=f"{spec.name}: {len(rows)} steps")
    sizes = ", ".join(f"{k}={v}" for k, v in d.check_sizes.items())
    out.line(f"checked at {sizes}; seed {d.seed}")
    kc = getattr(d, "kernel_check", None)
    if kc:
        n = kc["numeric"]
        if n.get("skipped"):
            out.line(f"kernel text NOT run on the CPU: {n['skipped']}", style="yellow")
        else:
            worst = max(r["rel_error"] for r in n["draws"])
            out.line(f"kernel text run on the CPU: {len(n['draws'])} draws over {', '.join(kc['facts']['variants'])}, "
                     f"worst relative error {worst:.1e}")
    for k in getattr(d, "chain_kernels", ()):  # a chain of kernels (compiler.kernel_chain)
        n = k.kernel_check["numeric"]
        ran = f"NOT run on the CPU: {n['skipped']}" if n.get("skipped") else \
            f"run on the CPU, worst relative error {max(r['rel_error'] for r in n['draws']):.1e}"
        out.line(f"kernel {k.final.output} (kernels/{k.final.output}/): {ran}")
    built = [d, *getattr(d, "chain_kernels", ()), *(getattr(d, "backward", None) and d.backward.kernels or ())]
    for note in dict.fromkeys(n for n in (getattr(k, "checks_skipped", None) for k in built) if n):
        out.line(note, style="yellow")
    check: ProofCheck = d.proof_check
    out.line(check.line(), style="green" if check.checked else "yellow")
    backward = getattr(d, "backward", None)
    if backward is not None:
        g = backward.record
        err = g.get("numeric", {}).get("rel_error")
        out.line(f"GRAD: d{backward.gradient.of}/d({', '.join(backward.decl.wrt)}) derived, validated numerically "
                 f"(finite differences, worst relative error {err:.1e}); not proved")
        for k in backward.kernels:
            kc = getattr(k, "kernel_check", None)
            ran = "" if not kc or kc["numeric"].get("skipped") else \
                f", run on the CPU (worst {max(r['rel_error'] for r in kc['numeric']['draws']):.1e})"
            out.line(f"backward kernel {k.grad_kernel}: {len(k.steps)} steps{ran}; {k.proof_check.line()}")
        check = getattr(backward, "schedule_proofs", None)
        if backward.shared.steps:
            out.line(f"grad.schedule: {len(backward.shared.steps)} steps; "
                     + (check.line() if check is not None else "proofs not checked"))
    table = _variants_table(Path(args.output))
    if table is not None:
        rows = [[r["name"], r["status"], r.get("reason", "default" if r["dir"] == "." else r["dir"])]
                for r in table["variants"]]
        out.table(["variant", "status", "where / why"], rows, title=f"{len(rows)} schedule variants")
    out.line(f"wrote {args.output} (final program {d.final.digest()})", style="green")
    return EXIT_OK


# --------------------------------------------------------------------------- explain


def cmd_explain(args: argparse.Namespace, out: Out) -> int:
    from .derive import derive
    from .printer import show_program
    from .spec import load_spec_file

    if args.rules:
        from .rule_reference import rule_reference

        if args.file is not None or args.hint or args.step is not None or args.upto is not None:
            raise UsageError("explain: --rules prints the rule reference and takes no FILE, --step, --upto or --hint")
        sys.stdout.write(rule_reference())
        return EXIT_OK
    if args.file is None:
        raise UsageError("explain: give a schedule FILE (or --rules for the rule reference)")
    if args.step is not None and args.upto is not None:
        raise UsageError("explain: --step N shows step N only; it cannot go with --upto")
    if args.step is not None and args.step < 1:
        raise UsageError(f"explain: --step {args.step}: steps are numbered from 1")
    spec = load_spec_file(args.file)
    upto = args.step if args.step is not None else args.upto
    if args.step is not None and args.step > len(spec.schedule):
        raise UsageError(f"explain: --step {args.step}: the schedule has {len(spec.schedule)} steps")
    d = derive(spec, str(args.file), seed=args.seed, upto=upto)
    if args.step is None:
        out.heading(f"{spec.name}: spec program (IR0) {d.initial.digest()}")
        out.block(show_program(d.initial), title="IR0")
    for s, prog in zip(d.steps, d.programs[1:]):
        if args.step is None or s.index == args.step:
            _explain_step(s, prog, out)
    out.line(f"final program {d.final.digest()}", style="bold")
    if args.hint:
        _explain_hints(d, out)
    return EXIT_OK


def _explain_step(s: Any, prog: Any, out: Out) -> None:
    from .printer import show_program
    from .report import format_params, format_sizes

    out.heading(f"step {s.index}: {s.rule} ({s.kind})")
    out.line(f"parameters: {format_params(s.params)}")
    out.line(f"theorem:    {s.theorem}")
    facts = {k: v for k, v in s.facts.items() if k != "theorem"}  # the line above names it
    if facts:
        out.line("facts:")
        for k, v in facts.items():
            text = v if isinstance(v, str) else json.dumps(v)
            text = text.replace("\n", "\n      ")
            out.line(f"  - {k}: {text}")
    if s.numeric:
        n = s.numeric
        out.line(
            f"numeric:    rel. error {n['rel_error']:.3g} <= {n['tolerance']:g} "
            f"at {format_sizes(n['sizes'])}, seed {n['seed']}",
            style="green",
        )
    out.line(f"program:    {s.before_hash} -> {s.after_hash}")
    out.block(show_program(prog), title=f"after step {s.index}")


def _explain_hints(d: Any, out: Out) -> None:
    """--hint: whether the program is a kernel yet, and the next legal steps (compiler.hints)."""
    from .hints import kernel_status, next_steps

    out.line(kernel_status(d))
    hints = next_steps(d.final)
    if not hints:
        out.line("hints: none (no further step that this tool suggests applies)")
    for h in hints:
        out.line(f"hint: {h.line()}")


# --------------------------------------------------------------------------- dispatchers


def gpu_missing(*modules: str) -> str | None:
    """Why `derivc run` / `bench` cannot run here (no CuPy, no device, no torch), or None."""
    try:
        import cupy
    except ImportError:
        return "not available: no GPU (CuPy is not installed: pip install '.[gpu]'); nothing was built"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver, no device: CUDA's own reason
        return f"not available: no GPU ({_one_line(exc)}); nothing was built"
    if count < 1:
        return "not available: no CUDA device; nothing was built"
    for name in modules:
        try:
            import_module(name)
        except ImportError:
            return f"not available: {name} is not installed (pip install '.[bench]'); nothing was built"
    return None


def coqc_missing() -> str | None:
    """Why `derivc verify` cannot check anything here, or None."""
    if shutil.which("coqc") is None:
        return "not available: coqc not found (install Coq 8.16: bash proofs_ci/install_coq.sh); nothing was checked"
    return None


def _dispatch(module: str, what: str, requires: Callable[[], str | None] | None = None,
              input_dir: str | None = None) -> Callable[[argparse.Namespace, Out], int]:
    """`input_dir`: the argument naming a directory the command reads; a missing one is bad
    input (exit 2), said before what is not available here."""
    def run(args: argparse.Namespace, out: Out) -> int:
        if input_dir is not None and not Path(getattr(args, input_dir)).is_dir():
            path = Path(getattr(args, input_dir))
            error_line(f"{path}: {what}: {'not a directory' if path.exists() else 'no such directory'}")
            return EXIT_INVALID_INPUT
        missing = requires() if requires is not None else None
        if missing:  # before anything is built
            error_line(f"{what}: {missing}")
            return EXIT_UNAVAILABLE
        mod = _optional(module)
        if mod is None or not hasattr(mod, "main"):
            sys.stderr.write(f"derivc: {what} not available yet\n")
            return EXIT_UNAVAILABLE
        rc = mod.main(args)
        return EXIT_OK if rc is None else int(rc)

    return run


# --------------------------------------------------------------------------- main


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        cmd = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        error_line(f"{cmd}: {message}" if cmd else message)
        raise SystemExit(EXIT_INVALID_INPUT)


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="derivc", description="proof-carrying GPU kernel compiler")
    p.add_argument("--version", action="version", version=f"derivc {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    p.add_argument("--plain", action="store_true", help="plain text output (no rich formatting)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    b = sub.add_parser("build", help="derive, check and write a build directory")
    b.add_argument("file", help="schedule file (YAML)")
    b.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory (replaced atomically)")
    b.add_argument("--seed", type=int, default=None, help="base seed of the numeric checks (step k: seed + k)")
    b.add_argument("--no-codegen", action="store_true", help="skip kernel generation")
    b.add_argument("--no-proofs", action="store_true",
                   help="neither export nor check the per-step proof obligations (checked by coqc by default)")
    b.add_argument("--verify", action="store_true",
                   help="require coqc and check every obligation anew (no cache) before writing DIR")
    b.set_defaults(func=cmd_build, extras_ok=False)

    e = sub.add_parser("explain", help="print every step, its facts and the program after it")
    e.add_argument("file", nargs="?", default=None, help="schedule file (YAML)")
    e.add_argument("--seed", type=int, default=None, help="base seed of the numeric checks")
    e.add_argument("--upto", type=int, default=None, metavar="N", help="stop after step N")
    e.add_argument("--step", type=int, default=None, metavar="N", help="derive up to step N, print step N only")
    e.add_argument("--hint", action="store_true",
                   help="say whether the program is a kernel yet and list the next legal steps")
    e.add_argument("--rules", action="store_true", help="print the rule-parameter reference (docs/rules.md)")
    e.set_defaults(func=cmd_explain, extras_ok=False)

    v = sub.add_parser("verify", help="rebuild a build directory, compare it file by file and check its proofs (needs coqc)")
    v.add_argument("dir")
    v.set_defaults(func=_dispatch("compiler.verify", "verify", coqc_missing, input_dir="dir"), extras_ok=True)

    r = sub.add_parser("replay", help="replay a build directory's trace up to a step")
    r.add_argument("dir")
    r.add_argument("--step", type=int, default=None, metavar="N")
    r.set_defaults(func=_dispatch("compiler.replay_cmd", "replay"), extras_ok=True)

    run = sub.add_parser("run", help="build, run the kernel on the GPU (needs CuPy, torch and a CUDA device)")
    run.add_argument("file")
    run.add_argument("--check", action="store_true", help="compare against the float64 reference")
    run.add_argument("--sizes", help="dynamic sizes, e.g. B=2,H=4,N=1000 (default: the check sizes)")
    run.add_argument("--seed", type=int, default=0)
    run.set_defaults(func=_dispatch("codegen.run_cmd", "run", lambda: gpu_missing("torch")), extras_ok=False)

    tune = sub.add_parser("tune", help="time a build's schedule variants per shape on the GPU (needs CuPy, torch), "
                                            "write DIR/tuning.json")
    tune.add_argument("dir", help="a build of a schedule with variants: (or a schedule file, with -o DIR)")
    tune.add_argument("-o", "--output", default=None, help="with a schedule file: build it into DIR first")
    tune.add_argument("--sizes", action="append", default=[], help="one shape, e.g. M=128,N=4096,K=4096 (repeat)")
    tune.add_argument("--seed", type=int, default=0)
    tune.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                      help="stop measuring new shapes after this long (they run the default; the first is always measured)")
    tune.add_argument("--keep", type=int, default=None,
                      help="finalists timed in full per shape, by a short screen (default 3; compiler/tuning_table.py)")
    tune.add_argument("--no-proofs", action="store_true", help="with a schedule file: build without proofs")
    tune.set_defaults(func=_dispatch("codegen.tune_cmd", "tune", lambda: gpu_missing("torch")),
                      extras_ok=False)

    bench = sub.add_parser("bench", help="time derived kernels against cuBLAS / torch SDPA on the GPU (needs CuPy, torch, triton)")
    bench.add_argument("--quick", action="store_true", help="one size per family")
    bench.add_argument("--only", default="", help="comma-separated case families: gemm, attn")
    bench.add_argument("--out", default="bench-out", help="directory for bench.json and bench.png")
    bench.set_defaults(func=_dispatch("codegen.bench", "bench", lambda: gpu_missing("torch", "triton")),
                       extras_ok=False)
    return p


def main(argv: Sequence[str] | None = None, *, exiting: bool = False) -> int:
    """Run one command; returns the exit code.  `exiting`: the process ends right after (the
    console script): a signal that comes once the exit code is decided no longer changes it."""
    with interrupts_raise(exiting=exiting):
        args: argparse.Namespace | None = None
        output: tuple[Path, tuple[int, int] | None] | None = None  # -o DIR and its identity before
        try:
            parser = make_parser()
            try:
                args, extras = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
            except SystemExit as exc:  # --help, --version, usage errors
                return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_INVALID_INPUT
            if getattr(args, "output", None):
                where = Path(args.output).absolute()
                output = (where, dir_identity(where))
            with signals_held():  # numpy's BLAS threads start blocking SIGINT / SIGTERM: see codegen.cuda.nvrtc
                import numpy  # noqa: F401
            return _run(args, extras)
        except (KeyboardInterrupt, Terminated) as exc:  # later signals are ignored from here on
            what = "interrupted (SIGINT)" if isinstance(exc, KeyboardInterrupt) else "terminated (SIGTERM)"
            done = outcome_line(*output) if output else "before it started, nothing written" if args is None else ""
            error_line(f"{what}: {done}" if done else what)
            return 130 if isinstance(exc, KeyboardInterrupt) else exc.exit_code
        except BrokenPipeError:  # the reader went away (`| head`): quiet, like any filter
            _stdout_to_devnull()
            return EXIT_BROKEN_PIPE


def _stdout_to_devnull() -> None:
    """Whatever is still buffered for stdout goes nowhere (no second BrokenPipeError at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):  # not a real file (tests)
        pass


def _run(args: argparse.Namespace, extras: list[str]) -> int:
    if extras and not args.extras_ok:
        error_line(f"derivc {args.command}: unrecognized arguments: {' '.join(extras)}")
        return EXIT_INVALID_INPUT
    args.extra = extras
    out = Out(plain=args.plain)
    try:
        return args.func(args, out)
    except (SpecError, DerivationError, UsageError, BuildError, OutputRefused) as exc:
        if args.debug:
            traceback.print_exc()
        error_line(exc.message() if hasattr(exc, "message") else str(exc))
        return exc.exit_code
    except BrokenPipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug: one line, unless --debug
        if args.debug:
            traceback.print_exc()
        notes = " ".join(getattr(exc, "__notes__", []) or [])
        where = f"{getattr(args, 'file', '') or getattr(args, 'dir', '')}: " if getattr(args, "file", None) or getattr(args, "dir", None) else ""
        error_line(f"internal error: {where}{type(exc).__name__}: {exc} {notes}".rstrip() + " (--debug shows the traceback)")
        return EXIT_INTERNAL


def entry() -> None:
    sys.exit(main(exiting=True))


if __name__ == "__main__":
    entry()
