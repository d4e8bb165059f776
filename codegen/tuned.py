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
