"""compute-sanitizer memcheck and racecheck over the backward kernels, at tail sizes: the GPU test
of every gradient example (tests/gpu/test_grad_examples_gpu.py: forward + every backward kernel,
checked against float64 autograd) run under each tool, on the cases whose lengths are not
multiples of the tiles (N = 77 / 129, M = 77, R = 3; logits x1).

    python3 devtools/bwd_sanitize.py PREBUILT [-k EXTRA]   # PREBUILT: devtools/prebuild.py's DIR

Each tool runs in one process (pytest under compute-sanitizer, --error-exitcode 9): the log goes
to $OUT/sanitize_<tool>.txt, one summary line per tool is printed.  Exit 1 if a tool reported an
error or a test failed.  A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("OUT", "/tmp"))
TAILS = "(N77 or N129 or M77 or R3) and x1"
TOOLS = ("memcheck", "racecheck")


def sanitizer() -> str:
    found = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(found).exists():
        raise SystemExit("compute-sanitizer not found (PATH, /usr/local/cuda/bin)")
    return found


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(__doc__)
    prebuilt, rest = Path(argv[0]).resolve(), argv[1:]
    if rest and (len(rest) != 2 or rest[0] != "-k"):
        raise SystemExit(__doc__)
    select = f"({TAILS}) and ({rest[1]})" if rest else TAILS
    env = {**os.environ, "DERIVC_PREBUILT": str(prebuilt)}
    bad = 0
    for tool in TOOLS:
        log = OUT / f"sanitize_{tool}.txt"
        cmd = [sanitizer(), "--tool", tool, "--error-exitcode", "9", "--print-limit", "30",
               sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
               "tests/gpu/test_grad_examples_gpu.py", "-k", select]
        t = time.time()
        with log.open("w") as f:
            rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        text = log.read_text(errors="replace")
        summary = [ln for ln in text.splitlines() if "ERROR SUMMARY" in ln or "RACECHECK SUMMARY" in ln
                   or " passed" in ln or " failed" in ln]
        print(f"{tool}: exit {rc} in {time.time() - t:.0f} s; " + " | ".join(summary[-3:]), flush=True)
        bad |= rc != 0
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
