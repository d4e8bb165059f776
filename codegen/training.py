"""The training runtime of a build with gradients: the forward kernel and the backward kernels of
OUT/grad.json (codegen.grad_manifest), on the GPU (CuPy arrays or torch CUDA tensors), as a torch
custom op with autograd, or on the CPU through the emulation (numpy arrays, device "emu").

    t = derivc.load_training("out/sm")
    y, saved = t.forward_with_saved(X=x)           # saved: the forward inputs and saved outputs
    grads = t.backward(saved, dy)                  # {"X": dX}: the kernels in manifest order
    f = t.as_torch(); y = f(x); y.sum().backward()  # torch.library.custom_op, torch.compile-able

Every directory (OUT and each OUT/grad/<kernel>) is loaded like `derivc.load` loads a build: it
must carry derivc's build marker, and its kernel is re-derived from its derivation.json and
compared with the sources on disk.  The backward runs its kernels back to back on the current
stream: intermediate tensors are allocated from the manifest's dtype and shape with the sizes
bound from the forward inputs' shapes; nothing synchronizes or copies to the host, so a backward
(after a first call at the shapes) can be captured in a CUDA graph.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Mapping

from compiler.machine import DTYPES
from compiler.outdir import BUILD_MARKER

from .build_dir import LoadedBuild, load_build
from .cuda.runtime import geometry
from .grad_manifest import MANIFEST, GradKernel, GradManifest, check_kernel, read_manifest
from .kernel_check import given_sizes

DEVICES = ("cuda", "emu")
_TORCH_OPS: dict[str, Callable[..., Any]] = {}  # op name -> the registered forward op (one per process)

Runner = Callable[..., Any]  # (*inputs, out=None, **given sizes) -> output


class Training:
    """A forward kernel and its backward kernels, loaded from a build with gradients."""

    def __init__(self, out_dir: str | Path, device: str = "cuda"):
        if device not in DEVICES:
            raise ValueError(f"device {device!r}: expected one of {', '.join(DEVICES)}")
        self.out_dir = out_dir = Path(out_dir)
        self.device = device
        self.forward_build = _load_marked(out_dir)
        fwd = self.forward_build.printed.kernel
        self.manifest: GradManifest = read_manifest(out_dir, fwd)
        root = out_dir.resolve()
        builds = []
        for entry in self.manifest.kernels:
            d = (out_dir / entry.dir)
            if root not in d.resolve().parents:
                raise ValueError(f"{out_dir / MANIFEST}: kernel {entry.name}.dir: {entry.dir} is not inside {out_dir}")
            b = _load_marked(d)
            check_kernel(out_dir / MANIFEST, self.manifest, entry, b.printed.kernel, fwd)
            builds.append(b)
        self.backward_builds: tuple[LoadedBuild, ...] = tuple(builds)
        self.inputs = self.forward_build.inputs
        self.name = f"{self.forward_build.trace['spec']['name']}_{self._digest()}"
        make = _cuda_runner if device == "cuda" else _emu_runner
        self._forward = make(self.forward_build)
        self._backward = tuple(make(b) for b in builds)
        # per backward kernel, the dynamic sizes no input's shape gives (passed by name, e.g. a window W)
        self._by_name = tuple(tuple(given_sizes(b.printed, dict.fromkeys(b.printed.kernel.dynamic(), 0))) for b in builds)
        self._geometries: dict[tuple, Any] = {}

    def _digest(self) -> str:
        """Names the build in the torch op: every kernel source and the manifest."""
        h = hashlib.sha256((self.out_dir / MANIFEST).read_bytes())
        for b in (self.forward_build, *self.backward_builds):
            for v in b.printed.variants:
                h.update(v.source.source.encode())
        return h.hexdigest()[:12]

    # -- arrays -------------------------------------------------------------------------
    def _split(self, named: Mapping[str, Any]) -> tuple[list[Any], dict[str, int]]:
        """The forward inputs in the kernel's order, and the sizes given by name."""
        dynamic = self.forward_build.printed.kernel.dynamic()
        unknown = [n for n in named if n not in self.inputs and n not in dynamic]
        if unknown:
            raise ValueError(f"{unknown[0]}: not an input of {self.name} (inputs: {', '.join(self.inputs)})")
        missing = [n for n in self.inputs if n not in named]
        if missing:
            raise ValueError(f"missing input {', '.join(missing)} (inputs: {', '.join(self.inputs)})")
        return [named[n] for n in self.inputs], {n: v for n, v in named.items() if n in dynamic}

    def _sizes(self, xs: list[Any], given: dict[str, int]) -> Any:
        """The forward geometry at these input shapes (cached; ValueError for a shape it cannot take)."""
        key = (tuple(tuple(x.shape) for x in xs), tuple(sorted(given.items())))
        geo = self._geometries.get(key)
        if geo is None:
            geo = self._geometries[key] = geometry(self.forward_build.printed, key[0], given)
        return geo

    def forward(self, **inputs: Any) -> Any:
        """The forward output; inputs by name (and a size no input's shape gives, by name)."""
        return self._forward_all(inputs)[0]

    def _forward_all(self, inputs: Mapping[str, Any]) -> tuple[Any, ...]:
        """Every forward output, the main one first (then the further ones, e.g. LSE)."""
        xs, given = self._split(inputs)
        outs = self._forward(*xs, **given)
        return outs if isinstance(outs, tuple) else (outs,)

    def forward_with_saved(self, **inputs: Any) -> tuple[Any, dict[str, Any]]:
        """(output, saved): saved holds the forward inputs and the forward outputs the backward
        reads (the output, a statistic the forward wrote beside it such as LSE)."""
        outs = self._forward_all(inputs)
        by_name = dict(zip((t.name for t in self.forward_build.printed.kernel.outputs), outs))
        saved = {n: inputs[n] for n in self.inputs}
        saved.update({s: by_name[s] for s in self.manifest.saved})
        return outs[0], saved

    def backward(self, saved: Mapping[str, Any], seed: Any, **sizes: int) -> dict[str, Any]:
        """{input: gradient} for the manifest's wrt inputs, from forward_with_saved's `saved` and
        the output cotangent `seed` (the forward output's shape and dtype)."""
        m = self.manifest
        missing = [n for n in (*self.inputs, *m.saved) if n not in saved]
        if missing:
            raise ValueError(f"saved lacks {', '.join(missing)} (pass forward_with_saved's dict)")
        xs = [saved[n] for n in self.inputs]
        geo = self._sizes(xs, dict(sizes))
        if tuple(seed.shape) != geo.out_shape:
            raise ValueError(f"seed {m.seed}: shape {tuple(seed.shape)}, expected {geo.out_shape} (the shape of {m.of})")
        env = {n: saved[n] for n in (*self.inputs, *m.saved)}
        env[m.seed] = seed
        for entry, build, run, by_name in zip(m.kernels, self.backward_builds, self._backward, self._by_name):
            args = [env[n] for n in build.inputs]
            # a kernel with further outputs (dK beside dV) allocates them all itself
            out = _allocate(seed, entry, build, geo.sizes) if self.device == "cuda" and not entry.also else None
            res = run(*args, out=out, **{n: geo.sizes[n] for n in by_name})
            env.update(zip((n for n, _, _ in entry.outputs), res if entry.also else (res,)))
        return {x: env[g] for x, g in m.grads}

    # -- torch ----------------------------------------------------------------------------
    def as_torch(self) -> Callable[..., Any]:
        """The forward as a torch custom op `derivc::<name>` with autograd through the backward
        kernels (each a custom op of its own), so torch.compile(fullgraph=True) traces it."""
        if self.device != "cuda":
            raise ValueError(f"as_torch needs device 'cuda' (this training runtime runs on {self.device})")
        op = _TORCH_OPS.get(self.name)
        if op is None:
            from .training_torch import register_training_op
            op = _TORCH_OPS[self.name] = register_training_op(self)
        return op

    def __repr__(self) -> str:
        return f"derivc.Training({self.name}, from {self.out_dir}, on {self.device})"


def _load_marked(out_dir: Path) -> LoadedBuild:
    if not (out_dir / BUILD_MARKER).is_file():
        what = "does not exist" if not out_dir.exists() else f"has no {BUILD_MARKER} (not a derivc build directory)"
        raise ValueError(f"{out_dir}: {what}")
    return load_build(out_dir)


def _allocate(like: Any, entry: GradKernel, build: LoadedBuild, sizes: dict[str, int]) -> Any:
    """An uninitialised tensor of the manifest's dtype and shape (the kernel's output dims, which
    check_kernel found equal to the manifest's), of the seed's kind and device."""
    shape = tuple(a.evaluate(sizes) for a in build.printed.kernel.output.dims)
    dt = DTYPES[entry.dtype]
    if hasattr(like, "data_ptr"):
        import torch
        return torch.empty(shape, dtype=getattr(torch, dt.torch), device=like.device)
    import cupy
    with cupy.cuda.Device(like.device.id):
        return cupy.empty(shape, dtype=dt.numpy)


def _cuda_runner(build: LoadedBuild) -> Runner:
    from .cuda.runtime import CompiledKernel
    return CompiledKernel(build.printed, build.cubins)


def _emu_runner(build: LoadedBuild) -> Runner:
    """The kernel.cu run on the CPU (codegen.emu), the variant the host picks at the sizes."""
    import numpy as np

    from .emu import VariantUnavailable, run_printed

    printed = build.printed

    def run(*xs: Any, out: Any = None, **given: int) -> Any:
        last = None
        for v in reversed(range(len(printed.variants))):
            try:
                return run_printed(printed, v, [np.asarray(x) for x in xs], given)
            except VariantUnavailable as exc:
                last = exc
        raise ValueError(f"{build.out_dir}: no kernel variant runs here: {last}")

    return run
