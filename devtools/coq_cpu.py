"""CPU seconds (user+sys of coqc and its children) that checking the examples' proof
obligations costs, per obligation file and in total.

    python devtools/coq_cpu.py per-file  [EXAMPLE ...] > per_file.tsv   # one coqc per file (the old way)
    python devtools/coq_cpu.py checker   [EXAMPLE ...]                  # compiler.proofcheck, no cache

`per-file` runs coqc on each exported StepNN_*.v alone and prints `cpu_s<TAB>example/file`;
`checker` runs the build's checker (compiler.proofcheck.check_obligations, cache bypassed)
on every example in turn and prints `cpu_s<TAB>example` and the total.  No EXAMPLE: all of
examples/*.yaml.  The obligations are exported without the numeric checks (compiler.derive
with check=False), the library is compiled once into a temporary directory first; CPU time,
not wall time, since the machine's cores are shared.
"""
from __future__ import annotations

import os
import resource
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _export(names: list[str], out: Path) -> list[Path]:
    from compiler import obligations
    from compiler.derive import derive
    from compiler.spec import load_spec_file

    specs = [ROOT / "examples" / f"{n}.yaml" for n in names] if names else sorted((ROOT / "examples").glob("*.yaml"))
    dirs = []
    for spec in specs:
        d = derive(load_spec_file(spec), str(spec), check=False)
        obligations.write_obligations(d, out / spec.stem / "proofs")
        dirs.append(out / spec.stem / "proofs")
    return dirs


def per_file(dirs: list[Path], lib: Path) -> float:
    from proofs_ci import coqlib

    total = 0.0
    for proofs in dirs:
        for v in sorted(proofs.glob("*.v")):
            t0 = _children_cpu()
            r = coqlib.check_obligation(v, lib, timeout=1800)
            cpu = _children_cpu() - t0
            total += cpu
            print(f"{cpu:.2f}\t{proofs.parent.name}/{v.name}\t{'ok' if r.returncode == 0 else 'FAILED'}", flush=True)
    return total


def checker(dirs: list[Path]) -> float:
    from compiler import proofcheck

    total = 0.0
    for proofs in dirs:
        t0 = _children_cpu()
        check = proofcheck.check_obligations(proofs, use_cache=False)
        cpu = _children_cpu() - t0
        total += cpu
        bad = check.failure
        print(f"{cpu:.2f}\t{proofs.parent.name}\t{len(check.results)} obligations\t"
              f"{'ok' if bad is None else bad.failure_line()}", flush=True)
    return total


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("per-file", "checker"):
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="derivc-coq-cpu-") as tmp:
        os.environ["DERIVC_COQ_CACHE"] = str(Path(tmp) / "cache")
        dirs = _export(argv[1:], Path(tmp) / "ex")
        t0 = _children_cpu()
        from compiler import proofcheck

        lib = proofcheck.library().path
        print(f"# library: {_children_cpu() - t0:.1f} CPU-s", flush=True)
        total = per_file(dirs, lib) if argv[0] == "per-file" else checker(dirs)
    print(f"# total: {total:.1f} CPU-s over {len(dirs)} examples", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
