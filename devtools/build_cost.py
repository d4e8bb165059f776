"""CPU seconds (user + sys, children included) of `derivc build --no-proofs` of every example, cold.

    python devtools/build_cost.py                  # every example, one fresh cache for the run (CI)
    python devtools/build_cost.py --fresh-each     # a fresh cache per example (the worst case)
    python devtools/build_cost.py gemm flash_attention_wgmma -o costs.tsv

Each build runs in its own process (`python -m compiler --plain build X -o DIR --seed 0
--no-proofs`, as a mutation test does) from this checkout; a run-wide $DERIVC_CACHE_DIR starts
empty, as on a fresh CI machine.  CPU time, not wall time: the machine's cores are shared.
Prints `seconds<TAB>rc<TAB>example` per build and the sum.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build_cost(spec: Path, cache: Path, out: Path) -> tuple[float, int]:
    """(CPU seconds, exit status) of one build of `spec` with $DERIVC_CACHE_DIR = cache."""
    env = {**os.environ, "DERIVC_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("DERIVC_CHECK_CACHE", None)
    before = children_cpu()
    r = subprocess.run([sys.executable, "-m", "compiler", "--plain", "build", str(spec), "-o", str(out),
                        "--seed", "0", "--no-proofs"], cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(f"{spec.stem}: exit {r.returncode}\n{r.stderr[-2000:]}\n")
    return children_cpu() - before, r.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("examples", nargs="*", help="example stems (default: every examples/*.yaml)")
    ap.add_argument("--fresh-each", action="store_true", help="a fresh cache directory per example")
    ap.add_argument("-o", "--output", type=Path, help="also write the table here")
    args = ap.parse_args()
    specs = ([ROOT / "examples" / f"{s}.yaml" for s in args.examples] if args.examples
             else sorted((ROOT / "examples").glob("*.yaml")))
    rows, total = [], 0.0
    with tempfile.TemporaryDirectory(prefix="derivc-build-cost-") as tmp:
        for spec in specs:
            cache = Path(tempfile.mkdtemp(dir=tmp)) if args.fresh_each else Path(tmp) / "cache"
            secs, rc = build_cost(spec, cache, Path(tmp) / "out" / spec.stem)
            total += secs
            rows.append(f"{secs:.2f}\t{rc}\t{spec.stem}")
            print(rows[-1], flush=True)
    print(f"{total:.2f}\ttotal\t{len(specs)} builds")
    if args.output:
        args.output.write_text("\n".join(rows) + f"\n{total:.2f}\ttotal\t{len(specs)} builds\n")


if __name__ == "__main__":
    main()
