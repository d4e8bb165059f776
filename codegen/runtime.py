"""Load and launch generated kernels on CuPy arrays or torch CUDA tensors.

`import codegen.runtime` works without CuPy or a GPU: cupy (and torch) are imported lazily.
Compilation when no cubin is given: codegen.nvrtc.compile_cubin (the project's NVRTC path with
its sha256 cache) where NVRTC is found, else CuPy's NVRTC (cupy.RawModule(code=..., backend='nvrtc')).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Optional

from codegen.launch import launch_config
from codegen.plan import AttentionPlan, ContractionPlan, Plan, inputs, output, size_names
from codegen.render import KernelSource, render

_TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}
_ALIGN = 16


def compile_source(ks: KernelSource) -> bytes:
    """A cubin through the project's NVRTC path (sha256 cache); b"" lets CuPy's NVRTC compile."""
    from codegen import nvrtc

    if nvrtc.nvrtc_available():
        return nvrtc.compile_cubin(source=ks.source, name=ks.entry, options=ks.options).cubin
    return b""


_STREAMS: dict = {}


def _torch_stream(cupy, ts, dev):
    """A CuPy view of torch's current stream (cached: building one costs microseconds)."""
    key = (dev, ts.cuda_stream)
    st = _STREAMS.get(key)
    if st is None:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            st = cupy.cuda.ExternalStream(ts.cuda_stream, dev)
        _STREAMS[key] = st
    return st


@dataclass
class _View:
    ptr: int
    shape: tuple[int, ...]
    kind: str  # 'cupy' | 'torch'
    device: int


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
        opts = tuple(o for o in ks.options
                     if not (o.startswith("-arch") or o.startswith("--gpu-architecture")))
        module = cupy.RawModule(code=ks.source, options=opts, backend="nvrtc")
        fn = module.get_function(ks.entry)
    if ks.smem_bytes > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = ks.smem_bytes
    return module, fn


class CompiledKernel:
    """A plan's kernel, loaded and callable: out = kernel(*inputs)."""

    def __init__(self, plan: Plan, cubin: Optional[bytes] = None, source: Optional[KernelSource] = None,
                 tma_cubin: Optional[bytes] = None):
        self.plan = plan
        self.ks = source if source is not None else render(plan)
        self.module, self.fn = load_module(self.ks, cubin)
        self._ins = inputs(plan)
        self._out = output(plan)
        # MAP-MMA to wgmma: the warp-specialized TMA variant runs when sizes and pointers allow
        # (16-byte rows and bases), the cp.async variant otherwise.
        self.tma = None
        self._maps: dict[tuple, Any] = {}
        if isinstance(plan, ContractionPlan) and plan.mma == "wgmma":
            ks_tma = render(plan, tma=True)
            self.tma = (ks_tma,) + load_module(ks_tma, tma_cubin)


    def _tensor_maps(self, cupy, dev: int, key: tuple, encode) -> int:
        """Device address of the TMA tensor maps for these inputs and sizes, encoded on the host
        once per (pointers, sizes, device) and kept on the device."""
        import numpy as np

        key = key + (dev,)
        if key not in self._maps:
            if len(self._maps) > 64:
                self._maps.clear()
            with cupy.cuda.Device(dev):
                self._maps[key] = cupy.asarray(np.frombuffer(encode(), dtype=np.uint8))
        return self._maps[key].data.ptr

    # -- argument checks ---------------------------------------------------------------------
    def _view(self, x: Any, op) -> _View:
        mod = type(x).__module__.split(".")[0]
        if mod == "cupy":
            import numpy as np
            want = {"f16": np.float16, "f32": np.float32}.get(op.dtype)
            if want is None:
                raise ValueError(f"{op.name}: dtype {op.dtype} needs a torch tensor (CuPy has no bfloat16)")
            if x.dtype != np.dtype(want):
                raise ValueError(f"{op.name}: dtype {x.dtype}, kernel expects {op.dtype}")
            if not x.flags.c_contiguous:
                raise ValueError(f"{op.name}: must be C-contiguous (row-major)")
            return _View(int(x.data.ptr), tuple(x.shape), "cupy", x.device.id)
        if mod == "torch":
            import torch
            if not x.is_cuda:
                raise ValueError(f"{op.name}: torch tensor must be on a CUDA device")
            if x.dtype != getattr(torch, _TORCH_DTYPES[op.dtype]):
                raise ValueError(f"{op.name}: dtype {x.dtype}, kernel expects {op.dtype}")
            if not x.is_contiguous():
                raise ValueError(f"{op.name}: must be contiguous (row-major)")
            return _View(int(x.data_ptr()), tuple(x.shape), "torch", x.device.index)
        raise ValueError(f"{op.name}: expected a CuPy array or torch CUDA tensor, got {type(x).__name__}")

    def sizes_of(self, views: list[_View]) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for op, v in zip(self._ins, views):
            if len(v.shape) != len(op.dims):
                raise ValueError(f"{op.name}: rank {len(v.shape)}, expected {len(op.dims)} {op.dims}")
            for d, n in zip(op.dims, v.shape):
                if d in sizes and sizes[d] != n:
                    raise ValueError(f"{op.name}: dim {d} = {n} but an earlier operand has {d} = {sizes[d]}")
                sizes[d] = n
        fixed = dict(self.plan.fixed)
        for d, n in sizes.items():
            if d in fixed and n != fixed[d]:
                raise ValueError(f"dim {d} = {n}, kernel compiled for {d} = {fixed[d]}")
        for d in size_names(self.plan):
            sizes.setdefault(d, fixed.get(d, 0))
        self._check_divisible(sizes)
        return sizes

    def _check_divisible(self, sizes: dict[str, int]) -> None:
        """An unguarded dim (guard flag False) was proven divisible by its tile: enforce it."""
        p = self.plan
        if isinstance(p, ContractionPlan):
            pairs = [(p.m, p.block_m, p.guard_m), (p.n, p.block_n, p.guard_n), (p.k, p.block_k, p.guard_k)]
        else:
            pairs = [(p.seq_q, p.block_m, p.guard_q), (p.seq_k, p.block_n, p.guard_kv)]
        for d, t, g in pairs:
            if not g and sizes[d] % t:
                raise ValueError(f"dim {d} = {sizes[d]} is not a multiple of its tile {t} and the "
                                 "kernel was compiled without a guard for it")

    def __call__(self, *xs: Any, out: Any = None) -> Any:
        import cupy
        import numpy as np

        if len(xs) != len(self._ins):
            raise ValueError(f"expected {len(self._ins)} inputs ({', '.join(o.name for o in self._ins)}), got {len(xs)}")
        views = [self._view(x, op) for x, op in zip(xs, self._ins)]
        kinds = {v.kind for v in views}
        if len(kinds) != 1 or len({v.device for v in views}) != 1:
            raise ValueError("inputs must all be CuPy arrays or all torch tensors, on one device")
        kind, dev = views[0].kind, views[0].device
        sizes = self.sizes_of(views)
        shape = tuple(sizes[d] for d in self._out.dims)
        if out is None:
            if kind == "torch":
                import torch
                out = torch.empty(shape, dtype=getattr(torch, _TORCH_DTYPES[self._out.dtype]),
                                  device=f"cuda:{dev}")
            else:
                out = cupy.empty(shape, dtype={"f16": np.float16, "f32": np.float32}[self._out.dtype])
        ov = self._view(out, self._out)
        if ov.shape != shape:
            raise ValueError(f"{self._out.name}: shape {ov.shape}, expected {shape}")
        for op, v in zip(self._ins + (self._out,), views + [ov]):
            if v.ptr % _ALIGN:
                raise ValueError(f"{op.name}: data pointer must be {_ALIGN}-byte aligned")
        if any(n == 0 for n in shape):
            return out
        fn = self.fn
        args = [np.uint64(v.ptr) for v in views] + [np.uint64(ov.ptr)]
        args += [np.int32(sizes[d]) for d in self.plan.dynamic]
        use_tma = False
        if isinstance(self.plan, AttentionPlan) and self.plan.mma == "wgmma":
            from codegen.render_attn_wgmma import encode_attn_tensor_maps

            args.append(np.uint64(self._tensor_maps(
                cupy, dev, (tuple(v.ptr for v in views), tuple(sorted(sizes.items()))),
                lambda: encode_attn_tensor_maps(self.plan, sizes, *(v.ptr for v in views)))))
        elif self.tma is not None:
            from codegen.render_wgmma import encode_tensor_maps, tma_supported

            ptrs = tuple(v.ptr for v in views)
            use_tma = tma_supported(self.plan, sizes, ptrs)
            if use_tma:
                args.append(np.uint64(self._tensor_maps(
                    cupy, dev, (ptrs, tuple(sorted(sizes.items()))),
                    lambda: encode_tensor_maps(self.plan, sizes, *ptrs))))
                fn = self.tma[2]
        grid, block, smem = launch_config(self.plan, sizes, tma=use_tma)
        with cupy.cuda.Device(dev):
            if kind == "torch":
                import torch
                stream = _torch_stream(cupy, torch.cuda.current_stream(dev), dev)
            else:
                stream = cupy.cuda.get_current_stream()
            with stream:
                fn(grid, block, tuple(args), shared_mem=smem)
        return out
