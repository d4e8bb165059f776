"""Locate the CUDA host-side tools derivc needs without a GPU or a CUDA install.

Everything comes preferably from NVIDIA's PyPI wheels (installed by
``.ci/install_cuda_tools.sh``), which unpack under the ``nvidia`` namespace
package; a system CUDA under ``/usr/local/cuda`` is the fallback.

Lookup order for each item (first hit wins):

* NVRTC library: ``$DERIVC_NVRTC_LIB``, ``nvidia/cuda_nvrtc/lib/libnvrtc.so.12``
  (pip ``nvidia-cuda-nvrtc-cu12``), ``/usr/local/cuda/lib64/libnvrtc.so*``.
* CUDA headers: ``$DERIVC_CUDA_INCLUDE``, ``nvidia/cuda_runtime/include``
  (pip ``nvidia-cuda-runtime-cu12``), ``/usr/local/cuda/include``.
* ``cuobjdump`` / ``nvdisasm``: ``$DERIVC_CUOBJDUMP`` / ``$DERIVC_NVDISASM``,
  ``nvidia/*/bin/<tool>`` (pip ``nvidia-cuda-cuobjdump`` / ``nvidia-cuda-nvdisasm``;
  the 13.x wheels put them in ``nvidia/cu13/bin``), ``$PATH``,
  ``/usr/local/cuda/bin``.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
from pathlib import Path

__all__ = [
    "find_cuda_include_dir",
    "find_nvrtc_library",
    "find_tool",
    "nvidia_package_dirs",
]

_SYSTEM_CUDA = Path("/usr/local/cuda")


def nvidia_package_dirs() -> list[Path]:
    """Directories of the installed ``nvidia`` namespace package (may be several)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def _env_path(var: str) -> Path | None:
    value = os.environ.get(var)
    return Path(value) if value and Path(value).exists() else None


def find_nvrtc_library() -> Path | None:
    """Path of a loadable ``libnvrtc`` shared object, or None."""
    hit = _env_path("DERIVC_NVRTC_LIB")
    if hit:
        return hit
    for base in nvidia_package_dirs():
        candidate = base / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
        if candidate.is_file():
            return candidate
    # Prefer the plain soname link, then versioned names, newest last-sorted first.
    system = sorted(glob.glob(str(_SYSTEM_CUDA / "lib64" / "libnvrtc.so*")), key=len)
    system = [p for p in system if "builtins" not in p and "alt" not in p]
    return Path(system[0]) if system else None


def find_cuda_include_dir() -> Path | None:
    """Directory holding ``cuda_fp16.h`` and friends, or None."""
    hit = _env_path("DERIVC_CUDA_INCLUDE")
    if hit:
        return hit
    for base in nvidia_package_dirs():
        candidate = base / "cuda_runtime" / "include"
        if (candidate / "cuda_fp16.h").is_file():
            return candidate
    candidate = _SYSTEM_CUDA / "include"
    return candidate if (candidate / "cuda_fp16.h").is_file() else None


def find_tool(name: str) -> Path | None:
    """Path of a CUDA binary tool such as ``cuobjdump`` or ``nvdisasm``, or None."""
    hit = _env_path(f"DERIVC_{name.upper()}")
    if hit:
        return hit
    for base in nvidia_package_dirs():
        # cuda_cuobjdump/bin (older wheel layout), cu13/bin (13.x wheels), ...
        for candidate in sorted(base.glob(f"*/bin/{name}")):
            if os.access(candidate, os.X_OK):
                return candidate
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    candidate = _SYSTEM_CUDA / "bin" / name
    return candidate if os.access(candidate, os.X_OK) else None
