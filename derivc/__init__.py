"""derivc's public API: build a schedule file into a kernel, or load a built one, and call it.

    import derivc
    attn = derivc.build("examples/flash_attention.yaml")      # derive, check, compile
    o = attn(q, k, v)                                          # CuPy arrays or torch CUDA tensors
    attn = derivc.load("out/fa")                               # a directory `derivc build` wrote

Dynamic sizes (batch, heads, sequence length) are read off the arguments at each call: one
compiled kernel serves every value; a dynamic size no argument's shape determines (a sliding
window's W) is passed by name, `attn(q, k, v, W=512)`.  Fixed sizes (head dim) and dtypes must
match the build.
`load` re-derives the kernel from the directory's derivation.json (replaying the schedule on the
recorded spec, lowering and printing again) and refuses a directory whose kernel sources differ
from what the derivation gives: what runs is what was derived.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

__all__ = ["build", "load", "load_training", "torch_op", "Kernel"]


class Kernel:
    """A derived kernel: call it on the spec's inputs, in the order the spec declares them."""

    def __init__(self, out_dir: Path):
        from codegen.build_dir import load_build
        from codegen.cuda.runtime import CompiledKernel
        from codegen.tuned import Dispatch, TunedKernel

        self.out_dir = Path(out_dir)
        loaded = load_build(self.out_dir)
        printed = loaded.printed
        self.kir = printed.kernel
        self.plan = printed.plan
        self.inputs = loaded.inputs
        self._kernel = CompiledKernel(printed, loaded.cubins)
        dispatch = Dispatch(self.out_dir, self.kir.dynamic())
        if dispatch.tuned:  # DIR/tuning.json: the measured variant per shape bucket
            def load_variant(d: Path) -> CompiledKernel:
                one = load_build(d)
                return CompiledKernel(one.printed, one.cubins)

            self._kernel = TunedKernel(dispatch, self._kernel, load_variant)

    def __call__(self, *inputs: Any, out: Any = None, **sizes: int) -> Any:
        """Run on CuPy arrays or torch tensors; a dynamic size no input's shape determines (a
        mask's window W) is passed by name: kernel(q, k, v, W=512)."""
        return self._kernel(*inputs, out=out, **sizes)

    @property
    def name(self) -> str:
        return self.kir.name

    def __repr__(self) -> str:
        return f"derivc.Kernel({self.kir.name}, from {self.out_dir})"


def build(path: str | Path, out_dir: str | Path | None = None, *, seed: int | None = None) -> Any:
    """Derive `path` (checking every step and the lowering), emit and compile its kernel, load it.

    Proof obligations are not written here; `derivc build` writes and `derivc verify` checks them.
    """
    from compiler.cli import build_to

    target = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="derivc-")) / "build"
    build_to(Path(path), target, seed=seed, proofs=False)
    return load(target)


def load(out_dir: str | Path, device: str = "cuda") -> Any:
    """Load the kernel of a directory written by `derivc build`; a chain of kernels
    (OUT/kernels.json, e.g. split-KV decode) loads as one callable running them in order, on the
    GPU or (device "emu") on the CPU through the emulation (numpy arrays)."""
    from compiler.kernel_chain import MANIFEST

    out_dir = Path(out_dir)
    if (out_dir / MANIFEST).is_file():
        from codegen.chain import KernelChain
        from codegen.tuned import TunedChain
        from compiler.tuning_table import TUNING_FILE

        if (out_dir / TUNING_FILE).is_file():  # `derivc tune` measured the chain's variants
            return TunedChain(out_dir, device=device)
        return KernelChain(out_dir, device=device)
    if device != "cuda":
        raise ValueError(f"device {device!r}: a one-kernel build runs on 'cuda' (the emulation runs chains "
                         "and derivc.load_training's kernels)")
    return Kernel(out_dir)


def load_training(out_dir: str | Path, device: str = "cuda") -> Any:
    """The forward and backward kernels of a build with gradients (OUT/grad.json), checked;
    device "emu" runs them on the CPU through the emulation (numpy arrays)."""
    from codegen.training import Training

    return Training(Path(out_dir), device=device)


def torch_op(out_dir: str | Path) -> Any:
    """A build with gradients as a torch custom op with autograd (torch.compile-able)."""
    return load_training(out_dir).as_torch()
