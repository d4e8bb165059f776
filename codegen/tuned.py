"""Shape dispatch of a tuned build: the variant DIR/tuning.json chose for a call's shape.

The table is read and checked once, when the build is loaded; a call costs one dictionary
lookup by its shapes (the bucket of a new shape is computed once and remembered).  A shape
whose bucket was never measured runs the default schedule.  Pure: no GPU needed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from compiler.tuning_table import bucket, read_tuning
from compiler.variant_build import built_dirs


class Dispatch:
    """Bucket -> variant name, from a build directory's tuning table (empty when untuned)."""

    def __init__(self, out_dir: Path, dynamic: tuple[str, ...]):
        dirs = built_dirs(out_dir)
        table = read_tuning(out_dir, set(dirs)) if dirs else None
        if table is not None and tuple(table["dynamic"]) != tuple(dynamic):
            raise ValueError(f"{out_dir}/tuning.json: buckets over {table['dynamic']}, the kernel's dynamic "
                             f"sizes are {list(dynamic)}")
        self.dynamic = dynamic
        self.dirs = dirs
        self.default = next(iter(dirs), "")
        self.choice: dict[str, str] = {k: r["variant"] for k, r in (table or {}).get("buckets", {}).items()}

    @property
    def tuned(self) -> bool:
        return bool(self.choice)

    def variant(self, sizes: dict[str, int]) -> str:
        """The variant that runs at these sizes (the default where the table has no bucket)."""
        return self.choice.get(bucket(sizes, self.dynamic), self.default)


class TunedKernel:
    """CompiledKernel-like: one compiled kernel per variant the table names, picked per shape."""

    def __init__(self, dispatch: Dispatch, default: Any, load: Any):
        self._dispatch = dispatch
        self._default = default
        self._kernels = {dispatch.default: default}
        for name in set(dispatch.choice.values()) - {dispatch.default}:
            self._kernels[name] = load(dispatch.dirs[name])
        self._by_shape: dict[tuple, Any] = {}

    def variant_at(self, shapes: tuple[tuple[int, ...], ...], given: tuple[tuple[str, int], ...] = ()) -> str:
        sizes = self._default._shape(shapes, given).sizes  # the default's checks: one clear error
        return self._dispatch.variant(sizes)

    def __call__(self, *inputs: Any, out: Any = None, **sizes: int) -> Any:
        key = (tuple(tuple(x.shape) for x in inputs), tuple(sorted(sizes.items())))
        k = self._by_shape.get(key)
        if k is None:
            k = self._by_shape[key] = self._kernels[self.variant_at(*key)]
        return k(*inputs, out=out, **sizes)


class OneKernel:
    """A one-kernel build called like a KernelChain (a variant of a tuned build whose other
    variants are chains: split-K's S = 1), on the GPU or through the CPU emulation."""

    def __init__(self, out_dir: Path, device: str = "cuda"):
        from .training import _cuda_runner, _emu_runner, _load_marked

        self.out_dir = Path(out_dir)
        self.build = _load_marked(self.out_dir)
        self.inputs = self.build.inputs
        self.output = self.build.printed.kernel.output.name
        self._run = (_cuda_runner if device == "cuda" else _emu_runner)(self.build)

    def __call__(self, *inputs: Any, out: Any = None, **sizes: int) -> Any:
        return self._run(*inputs, out=out, **sizes)


def open_variant(out_dir: Path, device: str = "cuda") -> Any:
    """A built variant's callable: its chain of kernels (OUT/kernels.json) or its one kernel."""
    from compiler.kernel_chain import MANIFEST

    from .chain import KernelChain

    return KernelChain(out_dir, device=device) if (Path(out_dir) / MANIFEST).is_file() else OneKernel(out_dir, device)


def has_chain(out_dir: Path) -> bool:
    """Whether any built variant of DIR (the default included) is a chain of kernels."""
    from compiler.kernel_chain import MANIFEST

    dirs = built_dirs(Path(out_dir)) or {"": Path(out_dir)}
    return any((d / MANIFEST).is_file() for d in dirs.values())


def variant_trace(v: Any) -> dict[str, Any]:
    """The derivation.json of a variant opened by open_variant (its first kernel's, for a chain)."""
    return v.build.trace if isinstance(v, OneKernel) else v.kernels[0].build.trace


class TunedChain:
    """A tuned build whose variants are chains of kernels or single kernels (split-K's S = 1 beside
    its chains; OUT/tuning.json): one loaded variant per name the table names, picked per shape
    by the spec's dynamic sizes (read off the inputs' shapes against the spec's input dimensions,
    or passed by name)."""

    def __init__(self, out_dir: Path, device: str = "cuda"):
        from compiler.lower_spec import lower_spec
        from compiler.trace import spec_of_trace
        from compiler.tuning_table import chain_dynamic

        default = open_variant(Path(out_dir), device)
        program = lower_spec(spec_of_trace(variant_trace(default)))
        self._dims = [tuple(t.dims) for _, t in program.inputs]
        self._dispatch = Dispatch(Path(out_dir), chain_dynamic(program))
        self._chains = {self._dispatch.default: default}
        for name in set(self._dispatch.choice.values()) - {self._dispatch.default}:
            self._chains[name] = open_variant(self._dispatch.dirs[name], device)
        self._by_shape: dict[tuple, Any] = {}
        self.inputs, self.output, self.out_dir = default.inputs, default.output, default.out_dir

    def variant_at(self, shapes: tuple[tuple[int, ...], ...], given: tuple[tuple[str, int], ...] = ()) -> str:
        sizes = dict(given)
        for dims, shape in zip(self._dims, shapes):
            for a, n in zip(dims, shape):
                if len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const:
                    sizes.setdefault(a.terms[0][0], int(n))
        missing = [n for n in self._dispatch.dynamic if n not in sizes]
        if missing:
            raise ValueError(f"size {missing[0]} is given by no input's shape: pass it by name")
        return self._dispatch.variant(sizes)

    def __call__(self, *inputs: Any, out: Any = None, **sizes: int) -> Any:
        key = (tuple(tuple(x.shape) for x in inputs), tuple(sorted(sizes.items())))
        k = self._by_shape.get(key)
        if k is None:
            k = self._by_shape[key] = self._chains[self.variant_at(*key)]
        return k(*inputs, out=out, **sizes)

    def __repr__(self) -> str:
        return f"derivc.TunedChain({len(self._chains)} variants, from {self.out_dir})"
