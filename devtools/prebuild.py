"""Build examples in parallel into one directory, once, for the GPU runs that follow (tests,
sanitizers, benches) on the device machine's cores instead of one build per test process.

    python3 devtools/prebuild.py DIR EXAMPLE [EXAMPLE ...]   # EXAMPLE: a stem of examples/*.yaml
                                                            # (or pending/<stem>), or a .yaml path

DIR/<stem> is each build (as `derivc build FILE -o DIR/<stem>` writes it, numeric-check seed 0 as CI
builds them, no proof obligations).  A build already in DIR whose spec text is unchanged is kept.
Prints one line per example (seconds, or the error) and exits 1 if any failed.  The GPU tests
read DIR when DERIVC_PREBUILT=DIR is set (tests/gpu/test_grad_examples_gpu.py).

A developer script: not part of the package, no test imports it.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
SPEC_DIGEST = ".prebuilt_spec_sha256"  # beside the build: the spec text it was built from


def spec_path(name: str) -> Path:
    p = Path(name)
    if p.suffix == ".yaml":
        return p.resolve()
    return ROOT / "examples" / f"{name}.yaml"


def _build(args: tuple[str, str]) -> tuple[str, float, str | None]:
    from compiler.cli import build_to

    name, out_root = args
    spec = spec_path(name)
    out = Path(out_root) / spec.stem
    digest = hashlib.sha256(spec.read_bytes()).hexdigest()
    mark = Path(out_root) / f"{spec.stem}{SPEC_DIGEST}"
    if out.is_dir() and mark.is_file() and mark.read_text() == digest:
        return spec.stem, 0.0, None
    t = time.time()
    try:
        build_to(spec, out, seed=0, proofs=False)
    except Exception:  # noqa: BLE001 — reported per example (an interrupt still stops the pool)
        return spec.stem, time.time() - t, traceback.format_exc(limit=4)
    mark.write_text(digest)
    return spec.stem, time.time() - t, None


def prepare_named(outdir: Path, builds: dict[str, str]) -> None:
    """The bench scripts' `prepare`: examples/<file> built into outdir/<name> (seed 0, no proofs),
    one line each, then the directory's size (what the GPU call will carry)."""
    from compiler.cli import build_to

    outdir.mkdir(parents=True, exist_ok=True)
    for name, example in builds.items():
        t0 = time.monotonic()
        build_to(ROOT / "examples" / example, outdir / name, seed=0, proofs=False)
        print(f"built {example} into {outdir / name} in {time.monotonic() - t0:.0f} s", flush=True)
    size = sum(p.stat().st_size for p in outdir.rglob("*") if p.is_file())
    print(f"{outdir}: {size / 2**20:.1f} MiB", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    out_root = Path(argv[0]).resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    failed = []
    with ProcessPoolExecutor(max_workers=min(len(argv) - 1, os.cpu_count() or 2)) as pool:
        for stem, secs, err in pool.map(_build, [(n, str(out_root)) for n in argv[1:]]):
            print(f"{'FAIL' if err else 'ok  '} {stem:48s} {secs:6.1f} s" + (f"\n{err}" if err else ""), flush=True)
            if err:
                failed.append(stem)
    print(f"prebuilt {len(argv) - 1 - len(failed)} of {len(argv) - 1} in {time.time() - t0:.0f} s; failed: {failed}",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
