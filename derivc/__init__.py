"""derivc's public API: build a schedule file into a kernel, or load a built one, and call it.

    import derivc
    attn = derivc.build("examples/flash_attention.yaml")      # derive, check, compile
    o = attn(q, k, v)                                          # CuPy arrays or torch CUDA tensors
    attn = derivc.load("out/fa")                               # a directory `derivc build` wrote

Dynamic sizes (batch, heads, sequence length) are read off the arguments at each call: one
compiled kernel serves every value.  Fixed sizes (head dim) and dtypes must match the build.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["build", "load", "Kernel"]


class Kernel:
    """A derived kernel: call it on the spec's inputs, in the order the spec declares them."""

    def __init__(self, out_dir: Path):
        from codegen.build import plan_from_json
        from codegen.runtime import CompiledKernel

        self.out_dir = Path(out_dir)
        plan_file = self.out_dir / "plan.json"
        if not plan_file.exists():
            reason = (self.out_dir / "codegen.txt").read_text().strip() if (self.out_dir / "codegen.txt").exists() else "no plan.json"
            raise ValueError(f"{self.out_dir}: no kernel to load ({reason})")
        self.plan = plan_from_json(json.loads(plan_file.read_text()))
        cubin_file = self.out_dir / "kernel.cubin"
        cubin = cubin_file.read_bytes() if cubin_file.exists() else None
        tma_file = self.out_dir / "kernel_tma.cubin"
        tma = tma_file.read_bytes() if tma_file.exists() else None
        self._kernel = CompiledKernel(self.plan, cubin=cubin, tma_cubin=tma)

    def __call__(self, *inputs: Any, out: Any = None) -> Any:
        return self._kernel(*inputs, out=out)

    def __repr__(self) -> str:
        return f"derivc.Kernel({self.plan.kernel_name}, from {self.out_dir})"


def build(path: str | Path, out_dir: str | Path | None = None, *, seed: int | None = None) -> Kernel:
    """Derive `path` (checking every step), emit and compile its kernel, and load it.

    Proof obligations are not written here; `derivc build` writes and `derivc verify` checks them.
    """
    from compiler.cli import build_to

    target = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="derivc-")) / "build"
    build_to(Path(path), target, seed=seed, proofs=False)
    return Kernel(target)


def load(out_dir: str | Path) -> Kernel:
    """Load the kernel of a directory written by `derivc build`."""
    return Kernel(Path(out_dir))
