"""Builds for the GPU tests: a fresh build, or one carried to the GPU machine (DERIVC_PREBUILT)."""
from __future__ import annotations

from pathlib import Path


def build_or_prebuilt(spec: Path, out: Path, **kw) -> Path:
    """A build of `spec` at `out` — or a copy of DERIVC_PREBUILT/<spec stem> when that environment
    variable names a directory holding one (devtools/prebuild.py, or builds carried to the GPU
    machine: a build of many variants costs minutes of one core there).  Returns `out`.  A carried
    build holds cubins of the NVRTC that built it: a test that runs `derivc verify` on it (a rebuild
    compared byte for byte) must build here instead."""
    import os
    import shutil

    from compiler.cli import build_to

    pre = Path(os.environ["DERIVC_PREBUILT"]) / spec.stem if os.environ.get("DERIVC_PREBUILT") else None
    if pre is not None and pre.is_dir():
        shutil.copytree(pre, out, symlinks=True)  # tests tune into it: never into the carried copy
    else:
        build_to(spec, out, proofs=False, **kw)
    return out
