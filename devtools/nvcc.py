"""nvcc -cubin with a sha256-keyed disk cache, for the device scripts (ptxas -v logs).

The product compiles with NVRTC (codegen/cuda/nvrtc.py); these scripts compare against nvcc builds.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


def _cache_dir() -> Path:
    d = Path(os.environ.get("DERIVC_CACHE", Path.home() / ".cache" / "derivc")) / "nvcc"
    d.mkdir(parents=True, exist_ok=True)
    return d


def nvcc_arch_flags(options: tuple[str, ...]) -> list[str]:
    """Translate render options for nvcc: sm_90a needs the -gencode form (see HOPPER.md)."""
    out = []
    for o in options:
        if o in ("--gpu-architecture=sm_90a", "-arch=sm_90a"):
            out.append("-gencode=arch=compute_90a,code=sm_90a")
        elif o.startswith("--gpu-architecture=") or o.startswith("-arch="):
            out.append("-arch=" + o.split("=", 1)[1])
        else:
            out.append(o)
    return out


@dataclass(frozen=True)
class NvccResult:
    cubin: bytes
    log: str
    cached: bool


def compile_nvcc(source: str, options: tuple[str, ...], name: str, verbose: bool = True) -> NvccResult:
    """nvcc -cubin with a sha256 (source, options, nvcc version) disk cache; log holds ptxas -v."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    flags = nvcc_arch_flags(options) + (["-Xptxas", "-v"] if verbose else [])
    ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([source, *flags, ver]).encode()).hexdigest()
    d = _cache_dir()
    cub, logf = d / f"{name}-{key[:24]}.cubin", d / f"{name}-{key[:24]}.log"
    if cub.exists() and logf.exists():
        return NvccResult(cub.read_bytes(), logf.read_text(), True)
    with tempfile.TemporaryDirectory() as td:
        src = Path(td) / f"{name}.cu"
        src.write_text(source)
        out = Path(td) / f"{name}.cubin"
        r = subprocess.run([nvcc, "-cubin", *flags, "-o", str(out), str(src)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"nvcc failed for {name}:\n{r.stdout}\n{r.stderr}")
        data = out.read_bytes()
    tmp = cub.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, cub)
    logf.write_text(r.stdout + r.stderr)
    return NvccResult(data, r.stdout + r.stderr, False)


