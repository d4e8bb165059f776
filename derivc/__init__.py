"""derivc's public API: build a schedule file into a kernel, or load a built one, and call it.

    import derivc
    attn = derivc.build("examples/flash_attention.yaml")      # derive, check, compile, load
    o = attn(q, k, v)                                          # torch CUDA tensors or CuPy arrays
    attn = derivc.load("out/fa")                               # a directory `derivc build` wrote
    derivc.build("examples/gemm.yaml", "out/gemm", load=False)  # build only: no GPU needed

Dynamic sizes (batch, heads, sequence length) are read off the arguments at each call: one
compiled kernel serves every value; a dynamic size no argument's shape determines (a sliding
window's W) is passed by name, `attn(q, k, v, W=512)`.  Fixed sizes (head dim) and dtypes must
match the build.
`load` re-derives the kernel from the directory's derivation.json (replaying the schedule on the
recorded spec, lowering and printing again) and refuses a directory whose kernel sources differ
from what the derivation gives: what runs is what was derived.

Errors (each one message naming what is wrong):
  GPUUnavailableError  no GPU runtime here (CuPy not installed, no CUDA driver or device): raised
                       by `build` (unless load=False), `load` and `load_training` on "cuda"
                       BEFORE anything is derived, built or loaded.
  SpecError            the spec file is malformed (bad YAML, unknown names, shape / dtype mismatch).
  StepInputError       a schedule step names something that does not exist (a DerivationError).
  DerivationError      a rule's precondition or a step's numeric check failed.
  BuildError           a later build stage failed (e.g. the program has no kernel: no mapping).
  OutputRefused        `out_dir` holds files derivc did not write: nothing there is touched.
  UsageError           `out_dir` exists and is not a directory.
  ValueError           a call's arguments do not fit the kernel (count, kind, dtype, shape,
                       contiguity, alignment, device, a size missing), naming the tensor;
                       `load` of a directory that is not an intact derivc build.
"""
from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from compiler.cli import BuildError, UsageError, gpu_missing
from compiler.errors import DerivationError, SpecError, StepInputError
from compiler.outdir import OutputRefused

__all__ = ["build", "load", "load_training", "torch_op", "Kernel", "GPUUnavailableError", "SpecError",
           "StepInputError", "DerivationError", "BuildError", "OutputRefused", "UsageError"]

TEMP_PREFIX = "derivc-"  # build(out_dir=None) builds under tempfile.gettempdir()/derivc-XXXX/


class GPUUnavailableError(RuntimeError):
    """No GPU runtime here: CuPy is not installed, or CUDA has no driver or device.  Raised before
    any work (the same check, and the same reason, as `derivc run` on the command line)."""


def _require_gpu(what: str) -> None:
    missing = gpu_missing()
    if missing:
        raise GPUUnavailableError(f"{what}: {missing}")


class Kernel:
    """A derived kernel, loaded on the current CUDA device: call it on the spec's inputs.

    kernel(*inputs, out=None, **sizes) -> output
      inputs  in the order the spec declares them (`kernel.inputs` names them), all torch CUDA
              tensors or all CuPy arrays, on the device the kernel was loaded on; each of the
              spec's dtype (f16 / f32 / f64: torch.float16 ... or cupy.float16 ...; bf16 only as
              torch.bfloat16: CuPy has no bfloat16), C-contiguous (row-major: a transposed view is
              refused, pass `.contiguous()` / `cupy.ascontiguousarray`), data 16-byte aligned.
      out     optional: a preallocated output of the same kind (a tuple when the spec writes
              further outputs, e.g. LSE), of the output's dtype and shape; else one is allocated.
      sizes   a dynamic size no input's shape determines (a window W), by name.
    Returns the output (a tuple `(out, *further)` when the spec writes further outputs) as the
    inputs' kind.  The launch is asynchronous on the current stream (torch's current stream for
    tensors, CuPy's for arrays); nothing synchronizes.  Bad arguments raise ValueError naming the
    tensor and dimension.
    """

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
        """Run on torch CUDA tensors or CuPy arrays (see the class): kernel(q, k, v, W=512)."""
        return self._kernel(*inputs, out=out, **sizes)

    @property
    def name(self) -> str:
        return self.kir.name

    def __repr__(self) -> str:
        return f"derivc.Kernel({self.kir.name}, from {self.out_dir})"


def build(path: str | Path, out_dir: str | Path | None = None, *, seed: int | None = None,
          load: bool = True) -> Any:
    """Derive `path` (checking every step and the lowering), emit and compile its kernel, load it.

    out_dir  where the build directory goes (as `derivc build FILE -o DIR`: an existing DIR is
             replaced only if derivc wrote it), kept after the call.  None: a private temporary
             directory (tempfile.gettempdir()/derivc-XXXX/build, `kernel.out_dir`) that is removed
             when the returned kernel is garbage-collected or at interpreter exit, and at once if
             the build or the load fails.
    seed     the numeric checks' seed (None: drawn and recorded, as the CLI does).
    load     True: return the loaded kernel (`derivc.load(out_dir)`), which needs a GPU: without
             one, GPUUnavailableError is raised before anything is derived.  False: build only (no
             GPU needed) and return the build directory; then `out_dir` is required.

    Returns a `Kernel` (a `KernelChain` for a chain of kernels, e.g. split-KV decode); call it on
    torch CUDA tensors or CuPy arrays (see `Kernel`).  Raises GPUUnavailableError, SpecError,
    StepInputError, DerivationError, BuildError, OutputRefused or UsageError (see the module).
    Proof obligations are not written here; `derivc build` writes and `derivc verify` checks them.
    """
    from compiler.cli import build_to

    if not load and out_dir is None:
        raise ValueError("derivc.build(load=False) keeps only the build directory: pass out_dir")
    if load:
        _require_gpu(f"derivc.build({path})")  # before any derivation, as `derivc run` says it
    if out_dir is not None:
        build_to(Path(path), Path(out_dir), seed=seed, proofs=False)
        return _open(Path(out_dir), "cuda") if load else Path(out_dir)
    root = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    try:
        build_to(Path(path), root / "build", seed=seed, proofs=False)
        kernel = _open(root / "build", "cuda")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    weakref.finalize(kernel, shutil.rmtree, str(root), True)  # at collection or interpreter exit
    return kernel


def load(out_dir: str | Path, device: str = "cuda") -> Any:
    """Load the kernel of a directory written by `derivc build` (a `Kernel`, see there for how to
    call it); a chain of kernels (OUT/kernels.json, e.g. split-KV decode) loads as one callable
    running them in order, on the GPU or (device "emu") on the CPU through the emulation (numpy
    arrays).  Raises GPUUnavailableError (device "cuda" without a GPU runtime) before reading
    anything, ValueError for a directory that is not an intact derivc build."""
    if device == "cuda":
        _require_gpu(f"derivc.load({out_dir})")
    return _open(Path(out_dir), device)


def _open(out_dir: Path, device: str) -> Any:
    from compiler.kernel_chain import MANIFEST

    from codegen.tuned import TunedChain, has_chain
    from compiler.tuning_table import TUNING_FILE

    if (out_dir / TUNING_FILE).is_file() and has_chain(out_dir):  # tuned chains (split-K's S = 1 among them)
        return TunedChain(out_dir, device=device)
    if (out_dir / MANIFEST).is_file():
        from codegen.chain import KernelChain

        return KernelChain(out_dir, device=device)
    if device != "cuda":
        raise ValueError(f"device {device!r}: a one-kernel build runs on 'cuda' (the emulation runs chains "
                         "and derivc.load_training's kernels)")
    return Kernel(out_dir)


def load_training(out_dir: str | Path, device: str = "cuda") -> Any:
    """The forward and backward kernels of a build with gradients (OUT/grad.json), checked;
    device "emu" runs them on the CPU through the emulation (numpy arrays).  On "cuda" the
    inputs are torch CUDA tensors or CuPy arrays, as for `Kernel`; GPUUnavailableError without a
    GPU runtime (before anything is read)."""
    from codegen.training import Training

    if device == "cuda":
        _require_gpu(f"derivc.load_training({out_dir})")
    return Training(Path(out_dir), device=device)


def torch_op(out_dir: str | Path) -> Any:
    """A build with gradients as a torch custom op with autograd (torch.compile-able)."""
    return load_training(out_dir).as_torch()
