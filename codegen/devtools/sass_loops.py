"""Static look at the hot loop of derived kernels (no GPU): registers, spills, and the instruction
mix of the loop that holds the most HMMA, for each example schedule as derived (guards as the
lowering set them) and with its guard flags forced off (the code a full-tile-only kernel gets).

    python -m codegen.devtools.sass_loops [examples/gemm.yaml ...]

The guarded kernels should show the same hot-loop mix as the unguarded ones: guards may only
cost outside it (boundary tiles).  Reading it: `loop` = instructions between the backward branch
and its target, `hmma` / `ldgsts` / `ldsm` inside it."""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

from codegen import nvrtc, sass
from codegen.plan import AttentionPlan, ContractionPlan
from codegen.render import render

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ["gemm.yaml", "gemm_bf16.yaml", "flash_attention.yaml", "flash_attention_noncausal.yaml",
           "flash_attention_d64.yaml", "flash_attention_d64_noncausal.yaml"]
_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def plan_of(yaml: Path):
    from codegen.lower import lower_to_plan
    from compiler.derive import derive
    from compiler.spec import load_spec_file

    spec = load_spec_file(yaml)
    d = derive(spec, str(yaml))
    return lower_to_plan(d.final, spec.name)


def unguarded(plan):
    if isinstance(plan, ContractionPlan):
        return dataclasses.replace(plan, guard_m=False, guard_n=False, guard_k=False)
    if isinstance(plan, AttentionPlan):
        return dataclasses.replace(plan, guard_q=False, guard_kv=False)
    raise TypeError(plan)


def instructions(text: str) -> list[tuple[int, str, str]]:
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return out


def hot_loop(ins: list[tuple[int, str, str]]) -> dict:
    """The backward-branch loop (innermost around its HMMA) with the most HMMA."""
    best = None
    for i, (addr, op, args) in enumerate(ins):
        if not op.startswith("BRA"):
            continue
        m = re.search(r"0x([0-9a-f]+)", args)
        if not m or int(m.group(1), 16) >= addr:
            continue
        tgt = int(m.group(1), 16)
        body = [o for a, o, _ in ins if tgt <= a <= addr]
        h = sum(o.startswith("HMMA") for o in body)
        key = (h, -len(body))
        if best is None or key > best[0]:
            best = (key, dict(loop=len(body), hmma=h, ldgsts=sum(o.startswith("LDGSTS") for o in body),
                              ldsm=sum(o.startswith("LDSM") for o in body),
                              bra=sum(o.startswith("BRA") for o in body)))
    return best[1] if best else {}


def report(plan, tag: str) -> str:
    ks = render(plan)
    comp = nvrtc.compile_cubin(ks.source, ks.entry, tuple(ks.options) + ("-Xptxas=-v",))
    rep = sass.disassemble(comp.cubin, ptxas_log=comp.log)
    ins = instructions(rep.text)
    res = next(iter(rep.resources.values()))
    loop = hot_loop(ins)
    return (f"{tag:<10} regs {res.registers:>3}  spill st/ld {res.spill_store_bytes}/{res.spill_load_bytes}  "
            f"LDL/STL {rep.local_memory_ops}  total {len(ins):>5}  hot loop: "
            + "  ".join(f"{k} {v}" for k, v in loop.items()))


def main(argv: list[str]) -> int:
    names = argv or [str(ROOT / "examples" / n) for n in DEFAULT]
    for n in names:
        plan = plan_of(Path(n))
        if plan.mma not in ("mma_sync", None):
            continue
        print(Path(n).name)
        print("  " + report(plan, "derived"))
        print("  " + report(unguarded(plan), "no guards"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
