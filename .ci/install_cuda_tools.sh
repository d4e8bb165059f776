#!/usr/bin/env bash
# Install the GPU-less CUDA toolchain derivc's codegen tests need, from PyPI wheels:
#   NVRTC 12.9 (CUDA C++ -> sm_90/sm_90a cubin), the CUDA 12.9 headers, and the
#   cuobjdump/nvdisasm pair that disassembles cubins to SASS.
# cuobjdump/nvdisasm have no -cu12 wheels (PyPI starts at 13.2); 13.x reads the
# sm_90/sm_90a cubins NVRTC 12.9 writes.  cuobjdump -sass runs nvdisasm, so the
# two are pinned to the same release (both unpack into nvidia/cu13/bin).
# Idempotent; takes a few seconds when already installed (~100 MB download otherwise).
set -euo pipefail

PYTHON="${PYTHON:-python3}"

"$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
    "nvidia-cuda-nvrtc-cu12==12.9.86" \
    "nvidia-cuda-runtime-cu12==12.9.79" \
    "nvidia-cuda-cuobjdump==13.5.37" \
    "nvidia-cuda-nvdisasm==13.5.37"

# Fail loudly here rather than as skipped tests later.
"$PYTHON" - <<'PY'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("nvidia")
roots = [pathlib.Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
need = ["cuda_nvrtc/lib/libnvrtc.so.12", "cuda_runtime/include/cuda_fp16.h",
        "cu13/bin/cuobjdump", "cu13/bin/nvdisasm"]
missing = [n for n in need if not any((r / n).exists() for r in roots)]
if missing:
    sys.exit(f"install_cuda_tools: missing after install: {missing} (roots {roots})")
print("install_cuda_tools: NVRTC 12.9, CUDA 12.9 headers, cuobjdump/nvdisasm 13.5 ready")
PY
