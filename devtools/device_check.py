"""One device session (H200): differential run of generated cases, GPU tests, sanitizers, bench.

    python3 devtools/device_check.py diff N [SEED]   # build N generated cases in parallel, run each
    python3 devtools/device_check.py tests           # pytest -m gpu tests/gpu
    python3 devtools/device_check.py bench [--quick] # derivc bench (anchors in the same process)

Writes JSON / logs to $OUT.  A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
OUT = Path(os.environ.get("OUT", "/tmp/out"))
WORK = Path("/tmp/derivc-diff")


def _build(args):
    from specgen import build_case, cases

    n, seed, idx = args
    case = cases(n, seed)[idx]
    t = time.time()
    try:
        code, err, out = build_case(case, WORK)
    except Exception:  # noqa: BLE001
        code, err, out = -1, traceback.format_exc(limit=3), None
    mapping = json.loads((out / "plan.json").read_text())["mapping"] if code == 0 else None
    return {"name": case.name, "exit": code, "error": err, "mapping": mapping, "expect": case.mapping,
            "refusal": case.refusal, "build_s": round(time.time() - t, 2)}


def diff(n: int, seed: int) -> int:
    from specgen import cases

    WORK.mkdir(parents=True, exist_ok=True)
    all_cases = cases(n, seed)
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=min(14, os.cpu_count() or 4)) as pool:
        builds = list(pool.map(_build, [(n, seed, i) for i in range(n)]))
    print(f"built {n} cases in {time.time() - t0:.0f} s", flush=True)
    import derivc
    from codegen.run_cmd import check_kernel
    from compiler.trace import replay_programs, spec_of_trace

    results = []
    for case, b in zip(all_cases, builds):
        r = dict(b)
        ok_build = (b["exit"] == 0 and b["mapping"] == case.mapping) or (
            case.mapping == "refuse" and b["exit"] == 3 and case.refusal in b["error"])
        r["build_ok"] = ok_build
        if b["exit"] == 0:
            try:
                out = WORK / f"{case.name}.build"
                kernel = derivc.load(out)
                trace = json.loads((out / "derivation.json").read_text())
                ir0 = replay_programs(spec_of_trace(trace), trace, upto=0)[0]
                runs = []
                for seed_, scale in ((1, 1.0), (2, 8.0 if case.name.startswith("a") else 1.0)):
                    c = check_kernel(kernel, ir0, dict(case.run_sizes), seed=seed_, scale=scale)
                    runs.append({k: c[k] for k in ("rel_error", "tolerance", "passed", "nan")})
                r["runs"] = runs
                r["run_ok"] = all(x["passed"] and not x["nan"] for x in runs)
            except Exception:  # noqa: BLE001
                r["run_ok"] = False
                r["run_error"] = traceback.format_exc(limit=4)
        results.append(r)
        status = "ok" if ok_build and r.get("run_ok", b["exit"] != 0) else "FAIL"
        print(f"{status:4s} {case.name:58s} {b['mapping'] or 'refused':22s} "
              + (f"err {max(x['rel_error'] for x in r['runs']):.2e}" if r.get("runs") else (b["error"] or "")[:160]),
              flush=True)
    (OUT / f"diff_{seed}.json").write_text(json.dumps(results, indent=1))
    ran = [r for r in results if "runs" in r]
    bad = [r["name"] for r in results if not r["build_ok"] or ("runs" in r and not r["run_ok"]) or "run_error" in r]
    print(f"SUMMARY cases {n}: built+ran {len(ran)}, refused as expected "
          f"{sum(1 for r in results if r['expect'] == 'refuse' and r['build_ok'])}, failures {len(bad)}: {bad}")
    return 1 if bad else 0


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    what = sys.argv[1]
    if what == "diff":
        return diff(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    if what == "tests":
        return subprocess.call([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider",
                                "--durations=10", *sys.argv[2:]], cwd=ROOT)
    if what == "bench":
        return subprocess.call([sys.executable, "-m", "compiler", "bench", "--out", str(OUT), *sys.argv[2:]], cwd=ROOT)
    raise SystemExit(f"unknown part {what}")


if __name__ == "__main__":
    raise SystemExit(main())
