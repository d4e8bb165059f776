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


def load_pending(root: Path, examples: dict[str, tuple[str, int]]) -> dict[str, object]:
    """{mapping: derivc.load of examples/pending/<name>.yaml} for `examples` = {mapping: (name,
    head dim)}: each built once into `root` (without proofs: the GPU tests check the run against
    float64), from the spec text re-dumped as plain YAML."""
    import derivc
    import yaml

    from compiler.cli import build_to

    pending = Path(__file__).resolve().parents[2] / "examples" / "pending"
    out = {}
    for mapping, (name, _) in examples.items():
        path = root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(yaml.safe_load((pending / f"{name}.yaml").read_text()), sort_keys=False))
        build_to(path, root / name, proofs=False)
        out[mapping] = derivc.load(root / name)
    return out
