"""OUT/grad.json: which backward kernels a build with gradients runs, in which order, on what.

    {"of": "Y", "seed": "dY", "wrt": ["X"], "grads": {"X": "dX"}, "saved": ["Y"],
     "kernels": [{"name": "D", "dir": "grad/D", "inputs": ["Y", "dY"], "output": "D",
                  "dtype": "f32", "shape": ["R"]}, ...]}

A kernel that writes further outputs (FUSE-SUMS: dK beside dV) lists them in an optional
"also": [{"name": "dK", "dtype": "f16", "shape": [...]}]; they are produced like its output.

`read_manifest` checks the file on its own (fields, types, names) and against the forward build:
every kernel input is a forward input, the seed, a saved forward output or the output of an
EARLIER kernel; every wrt input has its gradient kernel, of the input's dtype and shape.
`check_kernel` then checks one loaded backward kernel against its entry (inputs, output, dtype,
shape, and the dtype / shape of every input against where it comes from).  Every problem is one
ValueError naming the file and the entry.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.machine import DTYPES

from .kir.ir import Kernel, TensorArg

MANIFEST = "grad.json"
_FIELDS = ("of", "seed", "wrt", "grads", "saved", "kernels")
_OPTIONAL_FIELDS = ("grad",)  # GRAD's record (its numeric validation): for the reader, not the runtime
_KERNEL_FIELDS = ("name", "dir", "inputs", "output", "dtype", "shape")
_KERNEL_OPTIONAL = ("also",)
_ALSO_FIELDS = ("name", "dtype", "shape")


@dataclass(frozen=True)
class GradKernel:
    name: str
    dir: str  # relative to the build directory
    inputs: tuple[str, ...]
    output: str
    dtype: str
    shape: tuple[str, ...]  # size names (or affine expressions in them, as the kernel prints its dims)
    also: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # further outputs: (name, dtype, shape)

    @property
    def outputs(self) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
        """(name, dtype, shape) of every tensor the kernel writes, its output first."""
        return ((self.output, self.dtype, self.shape),) + self.also


@dataclass(frozen=True)
class GradManifest:
    of: str
    seed: str
    wrt: tuple[str, ...]
    grads: tuple[tuple[str, str], ...]  # (input, its gradient tensor), in wrt order
    saved: tuple[str, ...]
    kernels: tuple[GradKernel, ...]

    def grad_of(self, name: str) -> str:
        return dict(self.grads)[name]


class ManifestError(ValueError):
    pass


def read_manifest(out_dir: Path, forward: Kernel) -> GradManifest:
    """OUT/grad.json, checked against the forward kernel `forward` (its inputs and output)."""
    path = Path(out_dir) / MANIFEST
    if not path.exists():
        raise ManifestError(f"{path}: not found ({out_dir} is not a build with gradients: its spec has no grad: section)")
    try:
        raw = json.loads(path.read_text())
    except ValueError as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc})") from None
    m = _parse(path, raw)
    _check_flow(path, m, forward)
    return m


def _fail(path: Path, where: str, why: str) -> ManifestError:
    return ManifestError(f"{path}: {where}: {why}")


def _fields(path: Path, where: str, raw: Any, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    if not isinstance(raw, dict):
        raise _fail(path, where, f"expected an object, got {type(raw).__name__}")
    missing = [n for n in names if n not in raw]
    if missing:
        raise _fail(path, where, f"missing field {', '.join(map(repr, missing))}")
    extra = sorted(set(raw) - set(names) - set(optional))
    if extra:
        raise _fail(path, where, f"unknown field {extra[0]!r} (fields: {', '.join(names + optional)})")


def _name(path: Path, where: str, x: Any) -> str:
    if not isinstance(x, str) or not x.isidentifier():
        raise _fail(path, where, f"expected a tensor name, got {x!r}")
    return x


def _names(path: Path, where: str, xs: Any) -> tuple[str, ...]:
    if not isinstance(xs, list):
        raise _fail(path, where, f"expected a list of names, got {type(xs).__name__}")
    out = tuple(_name(path, where, x) for x in xs)
    dup = next((x for i, x in enumerate(out) if x in out[:i]), None)
    if dup is not None:
        raise _fail(path, where, f"{dup} is listed twice")
    return out


def _parse(path: Path, raw: Any) -> GradManifest:
    _fields(path, "the manifest", raw, _FIELDS, _OPTIONAL_FIELDS)
    wrt = _names(path, "wrt", raw["wrt"])
    grads_raw = raw["grads"]
    if not isinstance(grads_raw, dict):
        raise _fail(path, "grads", f"expected an object input -> gradient tensor, got {type(grads_raw).__name__}")
    for x in grads_raw:
        if x not in wrt:
            raise _fail(path, f"grads.{x}", f"{x} is not in wrt ({', '.join(wrt)})")
    for x in wrt:
        if x not in grads_raw:
            raise _fail(path, "grads", f"no gradient tensor for {x} (it is in wrt)")
    grads = tuple((x, _name(path, f"grads.{x}", grads_raw[x])) for x in wrt)
    if not isinstance(raw["kernels"], list) or not raw["kernels"]:
        raise _fail(path, "kernels", "expected a non-empty list of kernels")
    kernels = []
    for i, k in enumerate(raw["kernels"]):
        where = f"kernels[{i}]"
        _fields(path, where, k, _KERNEL_FIELDS, _KERNEL_OPTIONAL)
        name = _name(path, f"{where}.name", k["name"])
        where = f"kernel {name}"
        if not isinstance(k["dir"], str) or not k["dir"]:
            raise _fail(path, f"{where}.dir", f"expected a directory relative to {path.parent}, got {k['dir']!r}")
        also = []
        for j, a in enumerate(k.get("also", [])):
            _fields(path, f"{where}.also[{j}]", a, _ALSO_FIELDS)
            also.append((_name(path, f"{where}.also[{j}].name", a["name"]),
                         _dtype(path, f"{where}.also[{j}].dtype", a["dtype"]), _shape(path, f"{where}.also[{j}].shape", a["shape"])))
        kernels.append(GradKernel(name, k["dir"], _names(path, f"{where}.inputs", k["inputs"]),
                                  _name(path, f"{where}.output", k["output"]), _dtype(path, f"{where}.dtype", k["dtype"]),
                                  _shape(path, f"{where}.shape", k["shape"]), tuple(also)))
    return GradManifest(_name(path, "of", raw["of"]), _name(path, "seed", raw["seed"]), wrt, grads,
                        _names(path, "saved", raw["saved"]), tuple(kernels))


def _dtype(path: Path, where: str, x: Any) -> str:
    if x not in DTYPES:
        raise _fail(path, where, f"{x!r} is not a dtype ({', '.join(DTYPES)})")
    return x


def _shape(path: Path, where: str, shape: Any) -> tuple[str, ...]:
    if not isinstance(shape, list) or not all(isinstance(d, str) and d for d in shape):
        raise _fail(path, where, f"expected a list of size names, got {shape!r}")
    return tuple(shape)


def _check_flow(path: Path, m: GradManifest, forward: Kernel) -> None:
    """Names against the forward build, and every kernel input available before its kernel."""
    fwd_inputs = tuple(t.name for t in forward.inputs)
    fwd_output = forward.output.name
    fwd_outputs = tuple(t.name for t in forward.outputs)  # the output, then further outputs (LSE)
    if m.of != fwd_output:
        raise _fail(path, "of", f"{m.of} is not the forward build's output ({fwd_output})")
    if m.seed in fwd_inputs or m.seed == fwd_output:
        raise _fail(path, "seed", f"{m.seed} is already a tensor of the forward build")
    for x in m.wrt:
        if x not in fwd_inputs:
            raise _fail(path, "wrt", f"{x} is not an input of the forward build ({', '.join(fwd_inputs)})")
    for s in m.saved:
        if s not in fwd_outputs:
            raise _fail(path, "saved", f"{s} is not an output of the forward build ({', '.join(fwd_outputs)})")
    produced: dict[str, int] = {}
    names = [k.name for k in m.kernels]
    written: dict[str, tuple[str, tuple[str, ...]]] = {}  # every kernel output: (dtype, shape)
    for i, k in enumerate(m.kernels):
        if k.name in names[:i]:
            raise _fail(path, f"kernel {k.name}", "a second kernel of that name")
        for out, dtype, shape in k.outputs:
            if out in (*fwd_inputs, *fwd_outputs, m.seed) or out in produced:
                raise _fail(path, f"kernel {k.name}.output", f"{out} is already a tensor of the build")
            produced[out] = i
            written[out] = (dtype, shape)
    for i, k in enumerate(m.kernels):
        for x in k.inputs:
            if x in fwd_inputs or x == m.seed or x in m.saved:
                continue
            if x in fwd_outputs:
                what = "the forward output" if x == fwd_output else "a forward output"
                raise _fail(path, f"kernel {k.name}.inputs", f"{x} is {what} but not listed in saved")
            j = produced.get(x)
            if j is None:
                raise _fail(path, f"kernel {k.name}.inputs",
                            f"{x} is none of the forward inputs ({', '.join(fwd_inputs)}), the seed {m.seed}, "
                            f"the saved outputs or a kernel's output")
            if j >= i:
                raise _fail(path, f"kernel {k.name}.inputs",
                            f"{x} is the output of kernel {m.kernels[j].name}, which runs {'later' if j > i else 'as this one'}: "
                            "a kernel must come after the kernels whose outputs it reads")
    for x, g in m.grads:
        if g not in produced:
            raise _fail(path, f"grads.{x}", f"no kernel produces {g}")
        k = m.kernels[produced[g]]
        want = forward.tensor(x)
        dtype, shape = written[g]
        if dtype != want.dtype or shape != _dims(want):
            raise _fail(path, f"kernel {k.name}", f"{g} is {dtype} [{', '.join(shape)}] but {x} is "
                        f"{want.dtype} [{', '.join(_dims(want))}]: a gradient has its input's dtype and shape")


def _dims(t: TensorArg) -> tuple[str, ...]:
    return tuple(str(a) for a in t.dims)


def check_kernel(path: Path, m: GradManifest, entry: GradKernel, kernel: Kernel, forward: Kernel) -> None:
    """A loaded backward kernel against its manifest entry and the tensors it reads."""
    where = f"kernel {entry.name} ({Path(path).parent / entry.dir})"
    ins = tuple(t.name for t in kernel.inputs)
    if set(ins) != set(entry.inputs):
        raise _fail(path, where, f"the kernel's inputs are {', '.join(ins)}, the manifest lists {', '.join(entry.inputs)}")
    outs = kernel.outputs
    if tuple(o.name for o in outs) != tuple(n for n, _, _ in entry.outputs):
        raise _fail(path, where, f"the kernel's outputs are {', '.join(o.name for o in outs)}, the manifest says "
                    f"{', '.join(n for n, _, _ in entry.outputs)}")
    for out, (_, dtype, shape) in zip(outs, entry.outputs):
        if out.dtype != dtype or _dims(out) != shape:
            raise _fail(path, where, f"the kernel's output {out.name} is {out.dtype} [{', '.join(_dims(out))}], the "
                        f"manifest says {dtype} [{', '.join(shape)}]")
    sources = {t.name: (t.dtype, _dims(t)) for t in forward.inputs}
    for t in forward.outputs:  # the output and the further ones (LSE)
        sources[t.name] = (t.dtype, _dims(t))
    sources[m.seed] = sources[m.of]
    for k in m.kernels:
        for out, dtype, shape in k.outputs:
            sources[out] = (dtype, shape)
    for t in kernel.inputs:
        want = sources[t.name]
        if (t.dtype, _dims(t)) != want:
            raise _fail(path, where, f"the kernel reads {t.name} as {t.dtype} [{', '.join(_dims(t))}], the build "
                        f"gives {want[0]} [{', '.join(want[1])}]")
    fixed = forward.fixed()
    for name, n in kernel.fixed().items():
        if name in fixed and fixed[name] != n:
            raise _fail(path, where, f"size {name} is {n} in the kernel but {fixed[name]} in the forward build")
