import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, Path(__file__).resolve().parent):  # the repo, and this folder's helpers (prebuilt.py)
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device and CuPy (skipped otherwise)")


def gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no CuPy or no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)




@pytest.fixture(scope="module")
def torch():
    """torch with a CUDA device (the GPU tests' reference math and tensors), else the test skips."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch
