"""Load and launch printed kernels on CuPy arrays or torch CUDA tensors.

`import codegen.cuda.runtime` works without CuPy or a GPU: cupy (and torch) are imported lazily.
A call checks its arguments against the kernel IR's tensors (rank, dtype, contiguity, 16-byte
alignment, fixed sizes), reads the dynamic sizes off the shapes, and launches.  Everything that
depends only on the shapes — sizes, grid, the variant, the output shape, the size arguments —
is computed once per shape and cached, so a repeated call costs an argument check and one
driver launch (codegen.cuda.launcher); TMA tensor maps are encoded once per (pointers, shapes).  A
call never synchronizes and never copies to the device after its first call for a shape and
pointer set, so it can be captured in a CUDA graph after a warm-up call.  Kernels load on the
device current at construction; calls must pass tensors on that device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from compiler.machine import DEVICE, DTYPES

from ..kir.grid import axis_blocks
from ..mappings import Printed, mapping_named
from ..source import KernelSource

_ALIGN = 16


def compile_source(ks: KernelSource) -> bytes:
    """A cubin through the project's NVRTC path (sha256 cache); b"" lets CuPy's NVRTC compile."""
    from codegen.cuda import nvrtc

    if nvrtc.nvrtc_available():
        return nvrtc.compile_cubin(source=ks.source, name=ks.entry, options=ks.options).cubin
    return b""


@dataclass(frozen=True)
class Geometry:
    """What one input shape fixes: sizes, output shape, grid per variant, size arguments."""

    sizes: dict[str, int]
    out_shape: tuple[int, ...]
    grids: tuple[tuple[int, int, int], ...]  # per variant
    size_args: tuple[int, ...]
    empty: bool
    also_shapes: tuple[tuple[int, ...], ...] = ()  # the further outputs' shapes (Kernel.also)

    @property
    def out_shapes(self) -> tuple[tuple[int, ...], ...]:
        return (self.out_shape,) + self.also_shapes


class CompiledKernel:
    """A printed kernel, loaded and callable: out = kernel(*inputs)."""

    def __init__(self, printed: Printed, cubins: Optional[dict[str, bytes]] = None):
        from .launcher import DriverKernel

        self.printed = printed
        self.kernel = printed.kernel
        self.device = _current_device()  # also makes its primary context current: modules load there
        cubins = cubins or {}
        self._fns = []
        for v in printed.variants:
            cubin = cubins.get(v.stem) or compile_source(v.source)
            if not cubin:
                raise RuntimeError(f"{v.stem}: no cubin and no NVRTC to compile {v.source.entry}")
            kinds = "p" * len(v.launch.tensor_args) + "i" * len(v.launch.size_args) + "p" * len(v.launch.extras)
            self._fns.append(DriverKernel(cubin, v.source.entry, v.launch.smem_bytes, kinds))
        self._torch_dtypes: dict[str, Any] = {}
        self._torch_wants: tuple | None = None  # per-input torch dtypes, once a torch call was checked
        self._torch_out: Any = None
        self._ins = self.kernel.inputs
        self._out = self.kernel.output
        self._also = self.kernel.outputs[1:]  # further outputs: a call returns (out, *also)
        self._host = mapping_named(printed.mapping).host
        self._shapes: dict[tuple, Geometry] = {}
        self._maps: dict[tuple, Any] = {}
        self._streams: dict[tuple, Any] = {}

    @property
    def name(self) -> str:
        return self.kernel.name

    # -- shapes ---------------------------------------------------------------------------
    def _shape(self, shapes: tuple[tuple[int, ...], ...], given: tuple[tuple[str, int], ...] = ()) -> Geometry:
        key = (shapes, given) if given else shapes
        got = self._shapes.get(key)
        if got is None:
            got = self._shapes[key] = self._geometry(shapes, dict(given))
        return got

    def _geometry(self, shapes: tuple[tuple[int, ...], ...], given: dict[str, int] | None = None) -> Geometry:
        return geometry(self.printed, shapes, given)

    # -- arguments ------------------------------------------------------------------------
    def _view(self, x: Any, t) -> tuple[int, tuple[int, ...], str, int]:
        if hasattr(x, "data_ptr"):  # a torch tensor
            want = self._torch_dtype(t.dtype)
            if x.dtype is not want:
                raise ValueError(f"{t.name}: dtype {x.dtype}, kernel expects {t.dtype}")
            if not x.is_contiguous():
                raise ValueError(f"{t.name}: must be contiguous (row-major)")
            dev = x.get_device()
            if dev < 0:
                raise ValueError(f"{t.name}: torch tensor must be on a CUDA device")
            ptr = x.data_ptr()
            view = (ptr, x.shape, "torch", dev)
        elif type(x).__module__.split(".")[0] == "cupy":
            dt = DTYPES[t.dtype]
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

    def _torch_dtype(self, dtype: str) -> Any:
        want = self._torch_dtypes.get(dtype)
        if want is None:
            import torch
            want = self._torch_dtypes[dtype] = getattr(torch, DTYPES[dtype].torch)
        return want

    @staticmethod
    def _stream(kind: str, dev: int) -> int:
        if kind == "torch":
            return _torch_stream(dev)
        import cupy
        return cupy.cuda.get_current_stream().ptr

    def _tensor_maps(self, dev: int, key: tuple, encode) -> Any:
        import cupy
        import numpy as np

        got = self._maps.get(key)
        if got is None:
            if len(self._maps) > 64:
                self._maps.clear()
            with cupy.cuda.Device(dev):
                got = self._maps[key] = cupy.asarray(np.frombuffer(encode(), dtype=np.uint8))
        return int(got.data.ptr)

    def __call__(self, *xs: Any, out: Any = None, **sizes: int) -> Any:
        """Run on the inputs; dynamic sizes are read off their shapes, and a size no input's shape
        determines (a window W in a mask) is passed by name: kernel(q, k, v, W=512)."""
        if sizes:
            return self._call(xs, out, tuple(sorted(sizes.items())))
        fast = self._call_torch(xs, out)
        return fast if fast is not None else self._call(xs, out)

    def _call_torch(self, xs: tuple, out: Any) -> Any:
        """The common call: torch tensors on the kernel's device, an output given or not,
        a shape seen before, no TMA maps.  None sends the call to the checking path."""
        wants = self._torch_wants
        # further outputs (LSE): the checking path allocates and checks them
        if wants is None or len(xs) != len(wants) or self._host is not None or self._also:
            return None
        ptrs, shapes = [], []
        dev = self.device
        try:
            for x, want in zip(xs, wants):
                if x.dtype is not want or not x.is_contiguous() or x.get_device() != dev:
                    return None
                p = x.data_ptr()
                if p & 15:
                    return None
                ptrs.append(p)
                shapes.append(x.shape)
            geo = self._shapes.get(tuple(shapes))
            if geo is None or geo.empty:
                return None
            if out is None:
                out = self._empty("torch", dev, geo.out_shape)
            elif (out.dtype is not self._torch_out or not out.is_contiguous() or out.get_device() != dev
                  or out.shape != geo.out_shape or out.data_ptr() & 15):
                return None
        except AttributeError:  # not torch tensors
            return None
        launch = self.printed.variants[0].launch
        ptrs.append(out.data_ptr())
        self._fns[0].launch(geo.grids[0], launch.threads, launch.smem_bytes, _torch_stream(dev),
                            (*ptrs, *geo.size_args))
        return out

    def _call(self, xs: tuple, out: Any, given: tuple[tuple[str, int], ...] = ()) -> Any:
        if len(xs) != len(self._ins):
            raise ValueError(f"expected {len(self._ins)} inputs ({', '.join(t.name for t in self._ins)}), got {len(xs)}")
        views = [self._view(x, t) for x, t in zip(xs, self._ins)]
        kind, dev = views[0][2], views[0][3]
        for v in views[1:]:
            if v[2] != kind or v[3] != dev:
                raise ValueError("inputs must all be CuPy arrays or all torch tensors, on one device")
        if dev != self.device:
            raise ValueError(f"inputs are on device {dev}, the kernel was loaded on device {self.device}")
        shapes = tuple(tuple(v[1]) for v in views)
        geo = self._shape(shapes, given)
        if kind == "torch" and self._torch_wants is None:
            self._torch_wants = tuple(self._torch_dtype(t.dtype) for t in self._ins)
            self._torch_out = self._torch_dtype(self._out.dtype)
        if out is None:
            outs = tuple(self._empty(kind, dev, shape, t.dtype) for t, shape in zip(self.kernel.outputs, geo.out_shapes))
        else:
            outs = out if isinstance(out, tuple) else (out,)
            if len(outs) != 1 + len(self._also):
                raise ValueError(f"out: expected {1 + len(self._also)} tensors "
                                 f"({', '.join(t.name for t in self.kernel.outputs)}), got {len(outs)}")
        out_views = []
        for o, t, shape in zip(outs, self.kernel.outputs, geo.out_shapes):
            ov = self._view(o, t)
            if tuple(ov[1]) != shape:
                raise ValueError(f"{t.name}: shape {tuple(ov[1])}, expected {shape}")
            out_views.append(ov[0])
        out = outs[0] if not self._also else outs
        if geo.empty:
            return out
        ptrs = tuple(v[0] for v in views)
        index, extra = 0, None
        if self._host is not None:
            key = ("choice", ptrs, shapes, dev)
            cached = self._maps.get(key)
            if cached is None:
                index, raw = self._host(self.printed, geo.sizes, ptrs)
                cached = (index, self._tensor_maps(dev, key[1:], lambda: raw) if raw is not None else None)
                self._maps[key] = cached
            index, extra = cached
        launch = self.printed.variants[index].launch
        values = ptrs + tuple(out_views) + geo.size_args + ((extra,) if extra is not None else ())
        self._fns[index].launch(geo.grids[index], launch.threads, launch.smem_bytes, self._stream(kind, dev), values)
        return out

    def _empty(self, kind: str, dev: int, shape: tuple[int, ...], dtype: str | None = None) -> Any:
        dt = DTYPES[dtype or self._out.dtype]
        if kind == "torch":
            import torch
            return torch.empty(shape, dtype=getattr(torch, dt.torch), device=f"cuda:{dev}")
        import cupy
        with cupy.cuda.Device(dev):
            return cupy.empty(shape, dtype=dt.numpy)


def geometry(printed: Printed, shapes: tuple[tuple[int, ...], ...], given: dict[str, int] | None = None) -> Geometry:
    """What the input shapes (and sizes given by name) fix: sizes, output shape, grid per variant,
    size arguments; one clear ValueError for a shape or size the kernel cannot take.  Pure (no GPU):
    the CUDA runtime and the CPU emulation (codegen.emu) both launch with it."""
    kernel = printed.kernel
    fixed = kernel.fixed()
    sizes: dict[str, int] = dict(fixed)
    dynamic = kernel.dynamic()
    for name, n in (given or {}).items():
        if name not in dynamic:
            known = f"its dynamic sizes are {', '.join(dynamic)}" if dynamic else "it has no dynamic size"
            what = "a fixed size of the kernel" if name in fixed else "not a size of the kernel"
            raise ValueError(f"size {name}={n}: {what} ({known})")
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"size {name}={n!r}: an int is needed")
        sizes[name] = n
    for t, shape in zip(kernel.inputs, shapes):
        if len(shape) != len(t.dims):
            raise ValueError(f"{t.name}: rank {len(shape)}, expected {len(t.dims)} [{', '.join(map(str, t.dims))}]")
        for a, n in zip(t.dims, shape):
            if len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const:
                name = a.terms[0][0]
                if name in sizes and sizes[name] != n:
                    what = ("the kernel was compiled for" if name in fixed else
                            "the call passes" if name in (given or {}) else "an earlier operand has")
                    raise ValueError(f"{t.name}: dim {name} = {n} but {what} {name} = {sizes[name]}")
                sizes[name] = n
    for n in kernel.dynamic():
        if n not in sizes:
            raise ValueError(f"size {n} is not the extent of any input dimension: pass it by name "
                             f"(kernel(..., {n}=...))")
        if not 0 <= sizes[n] < 2**31:
            raise ValueError(f"size {n} = {sizes[n]} does not fit the kernel's int32 size argument")
    for t, shape in zip(kernel.inputs, shapes):
        want = tuple(a.evaluate(sizes) for a in t.dims)
        if tuple(shape) != want:
            raise ValueError(f"{t.name}: shape {tuple(shape)}, expected {want}")
    out_shape = tuple(a.evaluate(sizes) for a in kernel.output.dims)
    if printed.mapping != "simt":  # the tensor-core templates index tiles with 32-bit ints
        for t, shape in list(zip(kernel.inputs, shapes)) + [(kernel.output, out_shape)]:  # LSE is smaller than O
            if math.prod(shape) >= 2**31:
                raise ValueError(f"{t.name} has {math.prod(shape)} elements >= 2^31: the {printed.mapping} "
                                 "kernel indexes with 32-bit offsets; split the call (the SIMT mapping uses 64-bit)")
    grids = []
    for v in printed.variants:
        # loops sharing an axis multiply (row-major, codegen.kir.grid)
        grid = axis_blocks(tuple((axis, ext.evaluate(sizes)) for axis, ext in v.launch.grid))
        for i, (n, lim) in enumerate(zip(grid, DEVICE.grid_limits)):
            if n > lim:
                loops = " * ".join(str(ext) for axis, ext in v.launch.grid if axis == "xyz"[i])
                raise ValueError(f"grid axis {'xyz'[i]} needs {n} blocks ({loops}) > the device limit {lim}")
        grids.append(tuple(grid))
    size_args = tuple(sizes[n] for n in kernel.dynamic())
    also = tuple(tuple(a.evaluate(sizes) for a in t.dims) for t in kernel.outputs[1:])
    return Geometry(sizes, out_shape, tuple(grids), size_args, any(n == 0 for n in out_shape), also)


def _current_device() -> int:
    try:
        import torch
        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")  # creates the device's primary context if nothing has yet
            return torch.cuda.current_device()
    except ImportError:
        pass
    import cupy
    cupy.cuda.runtime.free(0)  # initialise the runtime's primary context on this thread
    return cupy.cuda.runtime.getDevice()


_RAW_STREAM: list = []  # torch's current-stream getter, looked up once


def _torch_stream(dev: int) -> int:
    if not _RAW_STREAM:
        import torch
        _RAW_STREAM.append(torch._C._cuda_getCurrentRawStream)
    return _RAW_STREAM[0](dev)
