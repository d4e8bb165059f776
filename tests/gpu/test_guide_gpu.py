"""docs/guide.md on the GPU: its two final schedules built as the guide builds them, then its
"Running the kernel" Python block run as written (CuPy arrays for the GEMM, torch tensors for
the attention), the results compared with cuBLAS / torch's SDPA."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)


def guide_files_and_python() -> tuple[dict[str, str], str]:
    """The files the guide builds up (its ```yaml FILE``` blocks, in order) and its Python block."""
    files: dict[str, str] = {}
    python = ""
    for m in FENCE.finditer(GUIDE.read_text()):
        info = m.group(1).split()
        if info[:1] == ["yaml"] and len(info) == 2:
            files[info[1]] = files.get(info[1], "") + m.group(2)
        elif info == ["python"]:
            python = m.group(2)
    return files, python


@pytest.mark.gpu
def test_guide_kernels_run_as_the_guide_says(tmp_path: Path):
    import cupy as cp
    import torch

    from compiler.cli import main

    files, python = guide_files_and_python()
    assert "derivc.load(\"out/gemm\")" in python and "derivc.load(\"out/attention\")" in python
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for name in ("gemm.yaml", "attention.yaml"):
            Path(name).write_text(files[name])
            assert main(["build", name, "-o", f"out/{Path(name).stem}", "--no-proofs", "--seed", "1"]) == 0
        scope: dict = {}
        exec(compile(python, str(GUIDE), "exec"), scope)  # noqa: S102 - the guide's own example
    finally:
        os.chdir(cwd)
    a, b, c = scope["a"], scope["b"], scope["c"]
    assert isinstance(c, cp.ndarray) and c.shape == (4096, 4096)
    ref = a.astype(cp.float32) @ b.astype(cp.float32)
    err = float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref))
    assert err < 2e-3, err
    q, k, v, o = scope["q"], scope["k"], scope["v"], scope["o"]
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    err = float(torch.linalg.norm(o.float() - ref) / torch.linalg.norm(ref))
    assert err < 2e-3, err
