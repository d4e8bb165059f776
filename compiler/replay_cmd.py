"""`derivc replay DIR --step N`: show one step's Lean obligation and check it where possible.

Prints the rule and the step's Lean obligation (DIR/proofs/StepNN_<rule>.lean); then
  - with `lake` on PATH: runs `lake env lean` on it from lean/ (exit 4 if it fails);
  - else, if `lean_dojo` imports: explains how to replay it with LeanDojo (which needs a
    traced copy of the lean/ repository — nothing is run);
  - else: says that there is no Lean toolchain here and where to open the file.
The Coq twin of the obligation (StepNN_<rule>.v) is what `derivc verify` checks.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .errors import EXIT_INVALID_INPUT, EXIT_OK, EXIT_VERIFY_FAILED

LEAN_DIR = Path(__file__).resolve().parent.parent / "lean"


def _err(msg: str) -> None:
    sys.stderr.write(f"derivc: error: {' '.join(msg.split())}\n")


def main(args: Any) -> int:
    build = Path(args.dir)
    proofs = build / "proofs"
    index_path = proofs / "index.json"
    if not index_path.exists():
        _err(f"{build}: replay: no proofs/index.json (was it built by derivc build?)")
        return EXIT_INVALID_INPUT
    steps = json.loads(index_path.read_text())["steps"]
    if not steps:
        _err(f"{build}: replay: the derivation has no steps")
        return EXIT_INVALID_INPUT
    n = args.step if getattr(args, "step", None) is not None else steps[-1]["step"]
    entry = next((e for e in steps if e["step"] == n), None)
    if entry is None:
        _err(f"{build}: replay: --step {n}: no such step (1..{len(steps)})")
        return EXIT_INVALID_INPUT
    lean = proofs / entry["files"]["lean"]
    print(f"step {n}: rule {entry['rule']} ({entry['kind']}), theorem {entry['theorem']}, "
          f"obligation {entry.get('status', '?')}")
    if entry.get("checked"):
        print(f"states: {entry['checked']}")
    if entry.get("not_checked"):
        print(f"not checked: {entry['not_checked']}")
    print(f"Coq twin: {proofs / entry['files']['coq']} (checked by `derivc verify {build}`)")
    print(f"-- {lean} --")
    print(lean.read_text() if lean.exists() else "(missing)")
    if shutil.which("lake"):
        r = subprocess.run(["lake", "env", "lean", str(lean.resolve())], cwd=LEAN_DIR,
                           capture_output=True, text=True)
        sys.stdout.write(r.stdout + r.stderr)
        print("Lean: passed" if r.returncode == 0 else "Lean: FAILED")
        return EXIT_OK if r.returncode == 0 else EXIT_VERIFY_FAILED
    if importlib.util.find_spec("lean_dojo") is not None:
        print("Lean: not checked here (no lake on PATH). lean_dojo is installed, but LeanDojo "
              "replays theorems of a *traced* repository: commit lean/ and this obligation to a git "
              "repository, trace it with lean_dojo.trace(LeanGitRepo(url, commit)), then open "
              f"Dojo(Theorem(repo, '{lean.name}', '<theorem name>')) and run the proof's tactics.")
        return EXIT_OK
    print(f"Lean: no Lean toolchain here: open {lean} in a Lean editor inside {LEAN_DIR} "
          "(`lake build` there first) to replay it.")
    return EXIT_OK
