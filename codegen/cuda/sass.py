"""Inspect the SASS of a cubin and check codegen promises against it.

A schedule can promise things the final machine code must show: MAP-MMA with
``mma_sync`` promises ``HMMA``, with ``wgmma`` promises ``HGMMA``; a ``cp.async``
pipeline promises ``LDGSTS`` (or TMA ``UTMALDG``/``UBLKCP``); register-resident
tiles promise no local memory traffic (``LDL``/``STL``).  :func:`disassemble`
runs ``nvdisasm -c -ndf`` and ``cuobjdump -res-usage`` (either tool alone when the other is
missing) and
:func:`check_promises` turns broken promises into readable messages.

Tools are found by :func:`codegen.cuda.toolchain.find_tool`; no GPU is needed.
"""

from __future__ import annotations

from compiler.machine import MMA

import hashlib
import os
import re
import subprocess
import tempfile
from collections import Counter
from functools import lru_cache
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from . import toolchain

__all__ = [
    "KernelResources",
    "SassReport",
    "SassToolMissingError",
    "check_promises",
    "disassemble",
    "parse_ptxas_log",
    "parse_res_usage",
    "parse_sass",
    "sass_available",
]

# One SASS instruction: "/*0040*/   @!P0 HMMA.16816.F32 R4, ..." -> "HMMA.16816.F32"
_INSTR = re.compile(
    r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)"
)
_CUOBJDUMP_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
_NVDISASM_FUNC = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_RES_FUNC = re.compile(r"^\s*Function\s+([^:\s]+):\s*$")
_RES_FIELD = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")
_PTXAS_FUNC = re.compile(r"Function properties for (\S+)")
_PTXAS_SPILL = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)

_MMA_OPCODE = {name: instr.sass for name, instr in MMA.items()}
_ASYNC_COPY_OPCODES = ("LDGSTS", "UTMALDG", "UBLKCP")
_LOCAL_OPCODES = ("LDL", "STL")


class SassToolMissingError(RuntimeError):
    """Neither cuobjdump nor nvdisasm could be found."""


@dataclass(frozen=True)
class KernelResources:
    """Per-function resources; ``spill_*`` come from a ``-Xptxas=-v`` log, else None."""

    registers: int
    stack_bytes: int
    local_bytes: int = 0
    shared_bytes: int = 0
    spill_store_bytes: int | None = None
    spill_load_bytes: int | None = None


_K = TypeVar("_K")
_V = TypeVar("_V")


def _frozen(mapping: Mapping[_K, _V]) -> Mapping[_K, _V]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class SassReport:
    """Disassembly of one cubin.

    ``counts`` maps base opcodes (``HMMA``, ``LDSM``, ...) to their number over
    the whole cubin; ``kernels`` holds the same per function; ``resources`` the
    per-function register/stack usage when the tool reported it.
    """

    text: str
    counts: Mapping[str, int]
    kernels: Mapping[str, Mapping[str, int]]
    resources: Mapping[str, KernelResources] = field(
        default_factory=lambda: _frozen({})
    )
    tool: str = "cuobjdump"

    def count(self, *opcodes: str, kernel: str | None = None) -> int:
        counts = self.counts if kernel is None else self.kernels.get(kernel, {})
        return sum(counts.get(op, 0) for op in opcodes)

    @property
    def has_hmma(self) -> bool:
        return self.count("HMMA") > 0

    @property
    def has_hgmma(self) -> bool:
        return self.count("HGMMA") > 0

    @property
    def has_ldgsts(self) -> bool:
        return self.count("LDGSTS") > 0

    @property
    def has_ldsm(self) -> bool:
        return self.count("LDSM") > 0

    @property
    def local_memory_ops(self) -> int:
        """Number of LDL/STL instructions (register spills or local arrays)."""
        return self.count(*_LOCAL_OPCODES)

    @property
    def registers(self) -> int | None:
        """Most registers used by any function, if known."""
        return max((r.registers for r in self.resources.values()), default=None)

    @property
    def stack_bytes(self) -> int | None:
        """Largest per-thread stack frame of any function, if known."""
        return max((r.stack_bytes for r in self.resources.values()), default=None)


def parse_sass(text: str) -> dict[str, Counter[str]]:
    """Base-opcode counts per function of ``cuobjdump -sass`` or ``nvdisasm`` text."""
    kernels: dict[str, Counter[str]] = {}
    current: Counter[str] | None = None
    for line in text.splitlines():
        header = _CUOBJDUMP_FUNC.match(line) or _NVDISASM_FUNC.match(line)
        if header:
            current = kernels.setdefault(header.group(1), Counter())
            continue
        instr = _INSTR.match(line)
        if instr and current is not None:
            current[instr.group(1).split(".")[0]] += 1
    return kernels


def parse_res_usage(text: str) -> dict[str, KernelResources]:
    """Per-function resources from ``cuobjdump -res-usage`` text."""
    result: dict[str, KernelResources] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        match = _RES_FUNC.match(line)
        if not match:
            continue
        fields = {k: int(v) for k, v in _RES_FIELD.findall(lines[i + 1])}
        result[match.group(1)] = KernelResources(
            registers=fields.get("REG", 0),
            stack_bytes=fields.get("STACK", 0),
            local_bytes=fields.get("LOCAL", 0),
            shared_bytes=fields.get("SHARED", 0),
        )
    return result


def parse_ptxas_log(log: str) -> dict[str, tuple[int, int, int]]:
    """(stack frame, spill store, spill load) bytes per function from a ``-Xptxas=-v`` log."""
    result: dict[str, tuple[int, int, int]] = {}
    function: str | None = None
    for line in log.splitlines():
        header = _PTXAS_FUNC.search(line)
        if header:
            function = header.group(1)
            continue
        spill = _PTXAS_SPILL.search(line)
        if spill and function is not None:
            stack, stores, loads = (int(g) for g in spill.groups())
            result[function] = (stack, stores, loads)
            function = None
    return result


def sass_available() -> bool:
    """True when cuobjdump or nvdisasm is installed."""
    return (
        toolchain.find_tool("cuobjdump") is not None
        or toolchain.find_tool("nvdisasm") is not None
    )


def _run(argv: list[str], nvdisasm: Path | None) -> str:
    env = dict(os.environ)
    if nvdisasm is not None:  # cuobjdump -sass execs nvdisasm, looked up on PATH
        env["PATH"] = os.pathsep.join([str(nvdisasm.parent), env.get("PATH", "")])
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}"
        )
    return done.stdout  # stderr holds only warnings on success


@lru_cache(maxsize=None)
def _tool_identity(tool: Path) -> str:
    """What names a disassembler's behaviour: its path, size, mtime and `--version` text."""
    st = tool.stat()
    done = subprocess.run([str(tool), "--version"], capture_output=True, text=True, check=False)
    return f"{tool}\0{st.st_size}\0{st.st_mtime_ns}\0{done.stdout}"


_TEXT_MAGIC = b"DERIVC-SASS-TEXT-1\n"


def _listing_argvs(cubin: Path, cuobjdump: Path | None, nvdisasm: Path | None) -> tuple[str, list[list[str]]]:
    """(tool, the commands whose outputs, concatenated, are the listing).  With both tools:
    `nvdisasm -c -ndf` for the instructions (the dataflow analysis annotates registers, which no
    check reads: ~40 % of `cuobjdump -sass`'s CPU time, which runs nvdisasm with it) and
    `cuobjdump -res-usage` (milliseconds) for the resources; else whichever tool there is."""
    if nvdisasm is not None:
        argvs = [[str(nvdisasm), "-c", "-ndf", str(cubin)]]
        if cuobjdump is not None:
            argvs.append([str(cuobjdump), "-res-usage", str(cubin)])
        return "nvdisasm", argvs
    assert cuobjdump is not None
    return "cuobjdump", [[str(cuobjdump), "-sass", "-res-usage", str(cubin)]]


def _disassembly(cubin: bytes, cuobjdump: Path | None, nvdisasm: Path | None) -> tuple[str, str]:
    """(tool, listing) of the cubin, from the disassembly cache when this very cubin was listed
    by the same tools before.  nvdisasm spends ~0.4 s CPU starting up, whatever the cubin's size,
    and a build's unchanged kernels (every kernel of a gradient build but the one a mutation
    test changed, a rebuild) give the same cubins.  Key: sha256 of the commands, both tools'
    identities and the cubin; an entry carries the sha256 of its text (a torn or corrupted entry
    is a miss) and is written to a temp name, then renamed into place."""
    from .cache import cache_dir, write_entry

    placeholder = Path("kernel.cubin")
    tool, argvs = _listing_argvs(placeholder, cuobjdump, nvdisasm)
    h = hashlib.sha256(_TEXT_MAGIC + "\n".join(" ".join(Path(a).name for a in argv) for argv in argvs).encode())
    for t in (cuobjdump, nvdisasm):
        h.update(b"\0" + (_tool_identity(t).encode() if t is not None else b"-"))
    h.update(b"\0" + cubin)
    entry = cache_dir() / "sass" / f"{h.hexdigest()}.txt"
    try:
        data = entry.read_bytes()
        digest, text = data[len(_TEXT_MAGIC):len(_TEXT_MAGIC) + 64], data[len(_TEXT_MAGIC) + 65:]
        if data.startswith(_TEXT_MAGIC) and hashlib.sha256(text).hexdigest().encode() == digest:
            return tool, text.decode()
    except (OSError, UnicodeDecodeError):
        pass
    with tempfile.TemporaryDirectory(prefix="derivc-sass-") as tmp:
        path = Path(tmp) / placeholder.name
        path.write_bytes(cubin)
        _, argvs = _listing_argvs(path, cuobjdump, nvdisasm)
        text = "\n".join(_run(argv, nvdisasm) for argv in argvs)
    raw = text.encode()
    write_entry(entry, _TEXT_MAGIC + hashlib.sha256(raw).hexdigest().encode() + b"\n" + raw)
    return tool, text


def disassemble(cubin: bytes, *, ptxas_log: str | None = None) -> SassReport:
    """Disassemble ``cubin``; pass the ``-Xptxas=-v`` compile log to get spill sizes."""
    cuobjdump, nvdisasm = (
        toolchain.find_tool("cuobjdump"),
        toolchain.find_tool("nvdisasm"),
    )
    if cuobjdump is None and nvdisasm is None:
        raise SassToolMissingError(
            "cuobjdump/nvdisasm not found: run .ci/install_cuda_tools.sh "
            "(pip nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"
        )
    tool, text = _disassembly(cubin, cuobjdump, nvdisasm)
    resources = parse_res_usage(text)
    for name, (stack, stores, loads) in parse_ptxas_log(ptxas_log or "").items():
        base = resources.get(name, KernelResources(registers=0, stack_bytes=stack))
        resources[name] = KernelResources(
            registers=base.registers,
            stack_bytes=base.stack_bytes,
            local_bytes=base.local_bytes,
            shared_bytes=base.shared_bytes,
            spill_store_bytes=stores,
            spill_load_bytes=loads,
        )
    kernels = parse_sass(text)
    total: Counter[str] = Counter()
    for counts in kernels.values():
        total.update(counts)
    return SassReport(
        text=text,
        counts=_frozen(total),
        kernels=_frozen({k: _frozen(v) for k, v in kernels.items()}),
        resources=_frozen(resources),
        tool=tool,
    )


def check_promises(
    report: SassReport,
    *,
    expect_mma: str | None = None,
    expect_async_copy: bool = False,
    forbid_spills: bool = False,
    kernel: str | None = None,
) -> list[str]:
    """Human-readable violations of the given promises (empty list: all kept).

    ``expect_mma`` is ``"mma_sync"`` (needs HMMA) or ``"wgmma"`` (needs HGMMA);
    ``expect_async_copy`` needs LDGSTS or a TMA copy; ``forbid_spills`` forbids
    LDL/STL and ptxas-reported spill bytes.  Each function of the cubin is checked,
    or only ``kernel`` when given.
    """
    if expect_mma is not None and expect_mma not in _MMA_OPCODE:
        raise ValueError(
            f"expect_mma must be one of {sorted(_MMA_OPCODE)}, not {expect_mma!r}"
        )
    if kernel is not None and kernel not in report.kernels:
        return [
            f"kernel {kernel} not found in SASS (functions: {', '.join(report.kernels)})"
        ]
    names = [kernel] if kernel is not None else list(report.kernels)
    violations: list[str] = []
    for name in names:
        if expect_mma is not None:
            opcode = _MMA_OPCODE[expect_mma]
            if report.count(opcode, kernel=name) == 0:
                violations.append(
                    f"MAP-MMA requested {expect_mma} but no {opcode} instruction in SASS of kernel {name}"
                )
        if expect_async_copy and report.count(*_ASYNC_COPY_OPCODES, kernel=name) == 0:
            violations.append(
                f"async copy requested (cp.async) but no {'/'.join(_ASYNC_COPY_OPCODES)} "
                f"instruction in SASS of kernel {name}"
            )
        if forbid_spills:
            local_ops = report.count(*_LOCAL_OPCODES, kernel=name)
            res = report.resources.get(name)
            spilled = res is not None and bool(
                res.spill_store_bytes or res.spill_load_bytes
            )
            if local_ops or spilled:
                detail = f"{local_ops} LDL/STL instructions"
                if res is not None:
                    detail += f", {res.stack_bytes} bytes stack frame"
                    if res.spill_store_bytes is not None:
                        detail += (
                            f", {res.spill_store_bytes} bytes spill stores, "
                            f"{res.spill_load_bytes} bytes spill loads"
                        )
                violations.append(
                    f"register-resident promise broken: kernel {name} uses local memory ({detail})"
                )
    return violations
