"""Load and launch printed kernels on CuPy arrays or torch CUDA tensors.

`import codegen.runtime` works without CuPy or a GPU: cupy (and torch) are imported lazily.
A call checks its arguments against the kernel IR's tensors (rank, dtype, contiguity, 16-byte
alignment, fixed sizes), reads the dynamic sizes off the shapes, and launches.  Everything that
depends only on the shapes — sizes, grid, the variant, the output shape, the size arguments —
is computed once per shape and cached, so a repeated call costs an argument check and a launch;
TMA tensor maps are encoded once per (pointers, shapes).  A call never synchronizes and never
copies to the device after its first call for a shape and pointer set, so it can be captured
in a CUDA graph after a warm-up call.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Optional

from compiler.machine import DEVICE, DTYPES

from .mappings import Printed, mapping_named
from .source import KernelSource

_ALIGN = 16


def compile_source(ks: KernelSource) -> bytes:
    """A cubin through the project's NVRTC path (sha256 cache); b"" lets CuPy's NVRTC compile."""
    from codegen import nvrtc

    if nvrtc.nvrtc_available():
        return nvrtc.compile_cubin(source=ks.source, name=ks.entry, options=ks.options).cubin
    return b""


def load_module(ks: KernelSource, cubin: Optional[bytes]):
    """(CuPy module, kernel function) from a cubin (or, when b"", CuPy's NVRTC), with the dynamic
    shared-memory limit raised to what the kernel needs."""
    import cupy  # lazy

    cubin = cubin if cubin is not None else compile_source(ks)
    if cubin:
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(cubin)
            path = f.name
        try:
            module = cupy.RawModule(path=path)
            fn = module.get_function(ks.entry)
        finally:
            os.unlink(path)
    else:
        opts = tuple(o for o in ks.options if not (o.startswith("-arch") or o.startswith("--gpu-architecture")))
        module = cupy.RawModule(code=ks.source, options=opts, backend="nvrtc")
        fn = module.get_function(ks.entry)
    if ks.smem_bytes > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = ks.smem_bytes
    return module, fn


@dataclass(frozen=True)
class _Shape:
    """What one input shape fixes: sizes, output shape, grid, size arguments."""

    sizes: dict[str, int]
    out_shape: tuple[int, ...]
    grids: tuple[tuple[int, int, int], ...]  # per variant
    size_args: tuple[Any, ...]
    empty: bool


class CompiledKernel:
    """A printed kernel, loaded and callable: out = kernel(*inputs)."""

    def __init__(self, printed: Printed, cubins: Optional[dict[str, bytes]] = None):
        self.printed = printed
        self.kernel = printed.kernel
        cubins = cubins or {}
        self._fns = [load_module(v.source, cubins.get(v.stem))[1] for v in printed.variants]
        self._ins = self.kernel.inputs
        self._out = self.kernel.output
        self._host = mapping_named(printed.mapping).host
        self._shapes: dict[tuple, _Shape] = {}
        self._maps: dict[tuple, Any] = {}
        self._streams: dict[tuple, Any] = {}

    @property
    def name(self) -> str:
        return self.kernel.name

    # -- shapes ---------------------------------------------------------------------------
    def _shape(self, shapes: tuple[tuple[int, ...], ...]) -> _Shape:
        got = self._shapes.get(shapes)
        if got is None:
            got = self._shapes[shapes] = self._geometry(shapes)
        return got

    def _geometry(self, shapes: tuple[tuple[int, ...], ...]) -> _Shape:
        import numpy as np

        fixed = self.kernel.fixed()
        sizes: dict[str, int] = dict(fixed)
        for t, shape in zip(self._ins, shapes):
            if len(shape) != len(t.dims):
                raise ValueError(f"{t.name}: rank {len(shape)}, expected {len(t.dims)} [{', '.join(map(str, t.dims))}]")
            for a, n in zip(t.dims, shape):
                if len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const:
                    name = a.terms[0][0]
                    if name in sizes and sizes[name] != n:
                        what = "the kernel was compiled for" if name in fixed else "an earlier operand has"
                        raise ValueError(f"{t.name}: dim {name} = {n} but {what} {name} = {sizes[name]}")
                    sizes[name] = n
        for n in self.kernel.dynamic():
            if n not in sizes:
                raise ValueError(f"size {n} is not the extent of any input dimension; cannot infer it")
            if not 0 <= sizes[n] < 2**31:
                raise ValueError(f"size {n} = {sizes[n]} does not fit the kernel's int32 size argument")
        for t, shape in zip(self._ins, shapes):
            want = tuple(a.evaluate(sizes) for a in t.dims)
            if tuple(shape) != want:
                raise ValueError(f"{t.name}: shape {tuple(shape)}, expected {want}")
        out_shape = tuple(a.evaluate(sizes) for a in self._out.dims)
        grids = []
        for v in self.printed.variants:
            grid = [1, 1, 1]
            for axis, ext in v.launch.grid:
                grid["xyz".index(axis)] = max(1, ext.evaluate(sizes))
            for i, (n, lim) in enumerate(zip(grid, DEVICE.grid_limits)):
                if n > lim:
                    raise ValueError(f"grid axis {'xyz'[i]} needs {n} blocks > the device limit {lim}")
            grids.append(tuple(grid))
        size_args = tuple(np.int32(sizes[n]) for n in self.kernel.dynamic())
        return _Shape(sizes, out_shape, tuple(grids), size_args, any(n == 0 for n in out_shape))

    # -- arguments ------------------------------------------------------------------------
    @staticmethod
    def _view(x: Any, t) -> tuple[int, tuple[int, ...], str, int]:
        mod = type(x).__module__.split(".")[0]
        dt = DTYPES[t.dtype]
        if mod == "torch":
            import torch
            if not x.is_cuda:
                raise ValueError(f"{t.name}: torch tensor must be on a CUDA device")
            if x.dtype != getattr(torch, dt.torch):
                raise ValueError(f"{t.name}: dtype {x.dtype}, kernel expects {t.dtype}")
            if not x.is_contiguous():
                raise ValueError(f"{t.name}: must be contiguous (row-major)")
            ptr = x.data_ptr()
            view = (ptr, tuple(x.shape), "torch", x.device.index)
        elif mod == "cupy":
            if dt.numpy is None:
                raise ValueError(f"{t.name}: dtype {t.dtype} needs a torch tensor (CuPy has no {t.dtype})")
            if x.dtype.name != dt.numpy:
                raise ValueError(f"{t.name}: dtype {x.dtype}, kernel expects {t.dtype}")
            if not x.flags.c_contiguous:
                raise ValueError(f"{t.name}: must be C-contiguous (row-major)")
            ptr = x.data.ptr
            view = (ptr, tuple(x.shape), "cupy", x.device.id)
        else:
            raise ValueError(f"{t.name}: expected a CuPy array or torch CUDA tensor, got {type(x).__name__}")
        if ptr % _ALIGN:
            raise ValueError(f"{t.name}: data pointer must be {_ALIGN}-byte aligned")
        return view

    def _stream(self, kind: str, dev: int):
        import cupy

        if kind == "torch":
            import torch

            ts = torch.cuda.current_stream(dev)
            key = (dev, ts.cuda_stream)
            st = self._streams.get(key)
            if st is None:
                import warnings
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    st = self._streams[key] = cupy.cuda.ExternalStream(ts.cuda_stream, dev)
            return st
        return cupy.cuda.get_current_stream()

    def _tensor_maps(self, dev: int, key: tuple, encode) -> Any:
        import cupy
        import numpy as np

        got = self._maps.get(key)
        if got is None:
            if len(self._maps) > 64:
                self._maps.clear()
            with cupy.cuda.Device(dev):
                got = self._maps[key] = cupy.asarray(np.frombuffer(encode(), dtype=np.uint8))
        return np.uint64(got.data.ptr)

    def __call__(self, *xs: Any, out: Any = None) -> Any:
        import numpy as np

        if len(xs) != len(self._ins):
            raise ValueError(f"expected {len(self._ins)} inputs ({', '.join(t.name for t in self._ins)}), got {len(xs)}")
        views = [self._view(x, t) for x, t in zip(xs, self._ins)]
        kind, dev = views[0][2], views[0][3]
        for v in views[1:]:
            if v[2] != kind or v[3] != dev:
                raise ValueError("inputs must all be CuPy arrays or all torch tensors, on one device")
        geo = self._shape(tuple(v[1] for v in views))
        if out is None:
            out = self._empty(kind, dev, geo.out_shape)
        ov = self._view(out, self._out)
        if ov[1] != geo.out_shape:
            raise ValueError(f"{self._out.name}: shape {ov[1]}, expected {geo.out_shape}")
        if geo.empty:
            return out
        ptrs = tuple(v[0] for v in views)
        index, extra = 0, None
        if self._host is not None:
            key = (ptrs, tuple(v[1] for v in views), dev)
            cached = self._maps.get(("choice",) + key)
            if cached is None:
                index, raw = self._host(self.printed, geo.sizes, ptrs)
                cached = (index, self._tensor_maps(dev, key, lambda: raw) if raw is not None else None)
                self._maps[("choice",) + key] = cached
            index, extra = cached
        launch = self.printed.variants[index].launch
        args = tuple(np.uint64(p) for p in ptrs) + (np.uint64(ov[0]),) + geo.size_args
        if extra is not None:
            args = args + (extra,)
        import cupy

        stream = self._stream(kind, dev)
        if cupy.cuda.runtime.getDevice() != dev:
            with cupy.cuda.Device(dev), stream:
                self._fns[index](geo.grids[index], (launch.threads, 1, 1), args, shared_mem=launch.smem_bytes)
        else:
            with stream:
                self._fns[index](geo.grids[index], (launch.threads, 1, 1), args, shared_mem=launch.smem_bytes)
        return out

    def _empty(self, kind: str, dev: int, shape: tuple[int, ...]) -> Any:
        dt = DTYPES[self._out.dtype]
        if kind == "torch":
            import torch
            return torch.empty(shape, dtype=getattr(torch, dt.torch), device=f"cuda:{dev}")
        import cupy
        with cupy.cuda.Device(dev):
            return cupy.empty(shape, dtype=dt.numpy)
