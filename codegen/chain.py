"""The runtime of a chain of kernels (compiler/kernel_chain.py): OUT/kernels.json's kernels run
in order, on the GPU (CuPy arrays or torch CUDA tensors) or on the CPU through the emulation
(numpy arrays, device "emu").

    decode = derivc.load("out/decode")         # OUT/kernels.json: a KernelChain
    o = decode(q, k, v)                        # the partial folds, then the combine

Every OUT/kernels/<def>/ is loaded like `derivc.load` loads a build (its marker, its kernel
re-derived from its derivation.json and compared with the sources on disk) and checked against
the manifest: the tensors it reads and writes, their dtypes, and that each one it reads is an
input of the chain or written by an earlier kernel.  A call allocates the intermediates (the
f32 partial states) per call on the inputs' device; the first kernel checks the inputs as a
one-kernel build does, the last writes `out` when given.  Nothing synchronizes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from compiler.kernel_chain import MANIFEST
from compiler.outdir import BUILD_MARKER

from .build_dir import LoadedBuild

DEVICES = ("cuda", "emu")


@dataclass(frozen=True)
class ChainKernel:
    """One kernel of the chain: its manifest entry, loaded build and runner."""
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    build: LoadedBuild
    run: Callable[..., Any]
    dynamic: frozenset[str]


class KernelChain:
    """Kernels run one after the other; called like a one-kernel build's `derivc.Kernel`."""

    def __init__(self, out_dir: str | Path, device: str = "cuda"):
        from .training import _cuda_runner, _emu_runner, _load_marked

        if device not in DEVICES:
            raise ValueError(f"device {device!r}: expected one of {', '.join(DEVICES)}")
        self.out_dir = out_dir = Path(out_dir)
        self.device = device
        if not (out_dir / BUILD_MARKER).is_file():
            what = "does not exist" if not out_dir.exists() else f"has no {BUILD_MARKER} (not a derivc build directory)"
            raise ValueError(f"{out_dir}: {what}")
        where = out_dir / MANIFEST
        m = _read_manifest(where)
        self.inputs: tuple[str, ...] = tuple(m["inputs"])
        self.output: str = m["output"]
        spec_sha = _spec_sha(out_dir)
        root = out_dir.resolve()
        written = set(self.inputs)
        kernels = []
        make = _cuda_runner if device == "cuda" else _emu_runner
        for e in m["kernels"]:
            sub = out_dir / e["dir"]
            if root not in sub.resolve().parents:
                raise ValueError(f"{where}: kernel {e['name']}.dir: {e['dir']} is not inside {out_dir}")
            b = _load_marked(sub)
            _check_entry(where, e, b, written, spec_sha)
            written |= {o["name"] for o in e["outputs"]}
            kernels.append(ChainKernel(e["name"], tuple(e["inputs"]), tuple(o["name"] for o in e["outputs"]),
                                       b, make(b), frozenset(b.printed.kernel.dynamic())))
        if not kernels or kernels[-1].outputs[0] != self.output:
            raise ValueError(f"{where}: the last kernel does not write the output {self.output}")
        self.kernels: tuple[ChainKernel, ...] = tuple(kernels)

    @property
    def name(self) -> str:
        return " -> ".join(k.build.printed.kernel.name for k in self.kernels)

    def __call__(self, *xs: Any, out: Any = None, **sizes: int) -> Any:
        """Run the kernels in order on the inputs (the spec's order); the output.  A dynamic size
        no input's shape determines is passed by name, as to a one-kernel build."""
        return self.tensors(*xs, out=out, **sizes)[self.output]

    def tensors(self, *xs: Any, out: Any = None, **sizes: int) -> dict[str, Any]:
        """Every tensor of the call by name: the inputs, each kernel's outputs (the
        intermediates, e.g. the partial states), the output."""
        if len(xs) != len(self.inputs):
            raise ValueError(f"expected {len(self.inputs)} inputs ({', '.join(self.inputs)}), got {len(xs)}")
        if out is not None and self.device == "emu":
            raise ValueError("out: the emulation returns new numpy arrays (device 'emu' takes no out)")
        env = dict(zip(self.inputs, xs))
        last = len(self.kernels) - 1
        for i, k in enumerate(self.kernels):
            # a size no kernel takes goes to the first one, whose error names it
            given = {n: v for n, v in sizes.items() if n in k.dynamic or (i == 0 and not self._takes(n))}
            result = k.run(*(env[n] for n in k.inputs), out=out if i == last else None, **given)
            env.update(zip(k.outputs, result if isinstance(result, tuple) else (result,)))
        return env

    def _takes(self, size: str) -> bool:
        return any(size in k.dynamic for k in self.kernels)

    def __repr__(self) -> str:
        return f"derivc.KernelChain({self.name}, from {self.out_dir}, on {self.device})"


def _read_manifest(where: Path) -> dict[str, Any]:
    try:
        m = json.loads(where.read_text())
        ok = (isinstance(m, dict) and isinstance(m.get("inputs"), list) and isinstance(m.get("output"), str)
              and isinstance(m.get("kernels"), list)
              and all(isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("dir"), str)
                      and isinstance(e.get("inputs"), list) and isinstance(e.get("outputs"), list) and e["outputs"]
                      and all(isinstance(o, dict) and {"name", "dtype"} <= set(o) for o in e["outputs"])
                      for e in m["kernels"]))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: not readable: {exc}") from None
    if not ok:
        raise ValueError(f"{where}: not the manifest `derivc build` writes")
    return m


def _spec_sha(out_dir: Path) -> str | None:
    try:
        return json.loads((out_dir / "derivation.json").read_text()).get("spec_sha256")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{out_dir}/derivation.json: not readable: {exc}") from None


def _check_entry(where: Path, e: dict[str, Any], b: LoadedBuild, written: set[str], spec_sha: str | None) -> None:
    """The loaded kernel is the manifest's: same spec as OUT, same tensors read and written."""
    kernel = b.printed.kernel
    trace_kernel = (b.trace.get("chain_kernel") or {}).get("kernel")
    if trace_kernel != e["name"] or b.trace.get("spec_sha256") != spec_sha:
        raise ValueError(f"{where}: kernel {e['name']}: {e['dir']} is not that kernel of this build's derivation")
    reads = [t.name for t in kernel.inputs]
    writes = [(t.name, t.dtype) for t in kernel.outputs]
    if reads != list(e["inputs"]):
        raise ValueError(f"{where}: kernel {e['name']} reads {', '.join(reads)}, the manifest says "
                         f"{', '.join(map(str, e['inputs']))}")
    if writes != [(o["name"], o["dtype"]) for o in e["outputs"]]:
        raise ValueError(f"{where}: kernel {e['name']} writes {writes}, the manifest says "
                         f"{[(o['name'], o['dtype']) for o in e['outputs']]}")
    unwritten = [n for n in reads if n not in written]
    if unwritten:
        raise ValueError(f"{where}: kernel {e['name']} reads {', '.join(unwritten)}, which no earlier kernel writes")
