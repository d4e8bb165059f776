"""A build directory read back: the kernel re-derived from its derivation.json and compared with
the kernel sources on disk, so what runs is what was derived.  No GPU needed: the CUDA runtime
(`derivc.load`) and the CPU emulation (codegen.training, device "emu") both start from here."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .mappings import Printed


@dataclass(frozen=True)
class LoadedBuild:
    out_dir: Path
    printed: Printed
    trace: dict[str, Any] = field(repr=False)
    cubins: dict[str, bytes] = field(repr=False)  # by variant stem, where the build compiled one

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.printed.kernel.inputs)


def load_build(out_dir: Path) -> LoadedBuild:
    """Replay the recorded derivation, lower and print again; ValueError naming the file when the
    directory is not a build or its kernel sources differ from what the derivation gives."""
    from codegen.kir.lower import lower
    from codegen.mappings import print_kernel
    from codegen.mappings.ctx_common import DEFAULT_OPTIONS
    from compiler.kernel_chain import kernel_name
    from compiler.trace import replay, spec_of_trace

    out_dir = Path(out_dir)
    trace_file = out_dir / "derivation.json"
    if not trace_file.exists():
        raise ValueError(f"{out_dir}: no derivation.json (not a derivc build directory)")
    trace = json.loads(trace_file.read_text())
    spec = spec_of_trace(trace)
    final = replay(spec, trace)
    chain = trace.get("chain_kernel")  # one kernel of a chain (compiler.kernel_chain): its own name
    name = kernel_name(spec.name, chain["kernel"]) if chain else spec.name
    printed = print_kernel(lower(final, name), DEFAULT_OPTIONS)
    cubins: dict[str, bytes] = {}
    for v in printed.variants:
        cu = out_dir / f"{v.stem}.cu"
        if not cu.exists():
            raise ValueError(f"{out_dir}: no {cu.name} (built with --no-codegen?)")
        if cu.read_text() != v.source.source:
            raise ValueError(f"{cu}: differs from the kernel the derivation gives; rebuild the directory")
        cubin = out_dir / f"{v.stem}.cubin"
        if cubin.exists():
            cubins[v.stem] = cubin.read_bytes()
    return LoadedBuild(out_dir, printed, trace, cubins)
