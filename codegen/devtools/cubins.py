"""Prebuilt-cubin lookup for the device scripts: compile here, carry the folder, load there."""
from __future__ import annotations

import hashlib
from pathlib import Path

from codegen.render import KernelSource


def cubin_name(ks: KernelSource) -> str:
    """File name of a kernel source's prebuilt cubin (entry + hash of source and options)."""
    key = hashlib.sha256((ks.source + "\0".join(ks.options)).encode()).hexdigest()[:16]
    return f"{ks.entry}-{key}.cubin"


def load_prebuilt(ks: KernelSource, folder: Path):
    """(module, function, how): the prebuilt cubin from `folder` if present, else NVRTC here."""
    from codegen.runtime import load_module

    pre = folder / cubin_name(ks)
    if pre.exists():
        cubin, how = pre.read_bytes(), "prebuilt"
    else:
        from codegen.nvrtc import compile_cubin

        cubin, how = compile_cubin(ks.source, ks.entry, ks.options).cubin, "nvrtc"
    mod, fn = load_module(ks, cubin)
    return mod, fn, how
