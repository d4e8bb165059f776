"""Shared helpers for the rule tests (property, negative and mutation tests).

- `program_of(yaml_text)` / `spec_text(...)`: spec → IR₀.
- `apply(prog, rule, **params)`: parse parameters, check, rewrite (what one derivation step does,
  without the numeric check).
- `numeric_error(spec_program, new_program, sizes, seed)`: the per-step numeric check done with
  the reference interpreter alone (float64, fresh random inputs): relative error of the new
  program's output against the spec's; `inf` when the new program gives NaN / ∞ or cannot be
  evaluated at these sizes (bad store coverage, out-of-range store).
- `eval_sizes(prog, dynamic)`: a full size map (fixed sizes keep their value).
- templates of small specs and `candidates(prog, rnd)`: the rule applications one could try on
  a program, with random parameters (for the property tests).
"""
from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from compiler.errors import DerivationError  # noqa: E402
from compiler.interp import InterpError, random_inputs, rel_error, run_program  # noqa: E402
from compiler.ir import (  # noqa: E402,F401  (Bin, Const, Let re-exported for the tests)
    Aff, Bin, Const, Expr, Fold, Let, Program, Read, Reduce, Softmax, map_children, subst_index, walk,
)
from compiler.lower_spec import lower_spec  # noqa: E402
from compiler.rules import RULES  # noqa: E402
from compiler.rules.base import enclosing_binders, find_binder  # noqa: E402
from compiler.spec import parse_spec_text  # noqa: E402

TOLERANCE = 1e-12

# --------------------------------------------------------------------------- programs


def spec_text(
    statements: list[str],
    inputs: Mapping[str, tuple[list[str], str]],
    sizes: Mapping[str, int | str],
    output: str,
    params: Mapping[str, Any] | None = None,
    name: str = "t",
    schedule: list[dict[str, Any]] | None = None,
    out_dtype: str = "f32",
) -> str:
    doc: dict[str, Any] = {
        "name": name,
        "sizes": dict(sizes),
        "inputs": {k: {"shape": list(s), "dtype": dt} for k, (s, dt) in inputs.items()},
        "statements": list(statements),
        "output": {"tensor": output, "dtype": out_dtype},
    }
    if params:
        doc["params"] = dict(params)
    if schedule is not None:
        doc["schedule"] = schedule
    return yaml.safe_dump(doc, sort_keys=False)


def program_of(text: str) -> Program:
    return lower_spec(parse_spec_text(text))


def apply(prog: Program, rule: str, **params: Any) -> Program:
    """One checked rewrite (parameters, precondition, rewrite); raises DerivationError."""
    r = RULES[rule]
    p = r.parse_params(params)
    facts = r.check(prog, p)
    return r.rewrite(prog, p, facts)


def apply_steps(prog: Program, steps: Iterable[dict[str, Any]]) -> Program:
    for st in steps:
        st = dict(st)
        prog = apply(prog, st.pop("rule"), **st)
    return prog


def check_fails(prog: Program, rule: str, **params: Any) -> DerivationError:
    """The DerivationError that rule.check raises on prog (AssertionError if it passes)."""
    r = RULES[rule]
    p = r.parse_params(params)
    try:
        facts = r.check(prog, p)
    except DerivationError as exc:
        return exc
    raise AssertionError(f"{rule} {params} was accepted (facts: {sorted(facts)})")


# --------------------------------------------------------------------------- numeric check


def eval_sizes(prog: Program, dynamic: Mapping[str, int] | int = 5) -> dict[str, int]:
    """Sizes to run prog at: fixed sizes keep their value, dynamic ones from `dynamic`."""
    out = {}
    for n, v in prog.sizes:
        if v is not None:
            out[n] = v
        elif isinstance(dynamic, int):
            out[n] = dynamic
        else:
            out[n] = int(dynamic[n])
    return out


def numeric_error(
    spec_program: Program, new_program: Program, sizes: Mapping[str, int], seed: int = 0
) -> float:
    """‖new − spec‖ / ‖spec‖ on random float64 inputs; inf on NaN / ∞ or an ill-formed program.

    The spec program itself must evaluate to finite values (else the check is meaningless and
    this raises AssertionError)."""
    sizes = eval_sizes(spec_program, sizes)
    rng = np.random.default_rng(seed)
    inputs = random_inputs(spec_program, sizes, rng)
    ref = run_program(spec_program, sizes, inputs)[spec_program.output]
    assert np.all(np.isfinite(ref)), f"spec program gives non-finite values at {sizes}"
    try:
        with np.errstate(all="ignore"):
            out = run_program(new_program, sizes, inputs)[new_program.output]
    except (InterpError, ValueError, IndexError, KeyError):
        return float("inf")
    err = rel_error(out, ref)
    return float("inf") if np.isnan(err) else err


def caught(err: float) -> bool:
    """What the per-step numeric check flags: relative error > 1e-12, or NaN / inf."""
    return not err <= TOLERANCE


# --------------------------------------------------------------------------- IR surgery


def swap_vars(e: Expr, a: str, b: str) -> Expr:
    """e with free index variables a and b exchanged."""
    tmp = "__swap_tmp"
    e = subst_index(e, a, Aff.of(tmp))
    e = subst_index(e, b, Aff.of(a))
    return subst_index(e, tmp, Aff.of(b))


def transform(e: Expr, f) -> Expr:
    """Bottom-up rewrite: f applied to every node after its children."""
    return f(map_children(e, lambda c: transform(c, f)))


def nodes(prog: Program, kind: type | tuple[type, ...]) -> list[tuple[str, Expr]]:
    """(def name, node) for every node of the given type(s) in prog."""
    return [(d.name, x) for d in prog.defs for x in walk(d.body) if isinstance(x, kind)]


# --------------------------------------------------------------------------- spec templates

TEMPLATES = ("matmul", "rowreduce", "masked_softmax", "attention", "expsum")


def _size(rnd: random.Random, name: str, choices: tuple[int, ...] = (3, 4, 5, 6, 8)) -> int | str:
    return "dynamic" if rnd.random() < 0.5 else rnd.choice(choices)


def make_spec(template: str, rnd: random.Random) -> str:
    """A small random spec of the given template (random fixed-or-dynamic sizes)."""
    if template == "matmul":
        batch = rnd.random() < 0.4
        if rnd.random() < 0.25:  # tensor-core shaped: fixed 16 x 8 x 16, f16
            sizes = {"M": 16, "N": 8, "K": 16}
            dt = "f16"
        else:
            sizes = {"M": _size(rnd, "M"), "N": _size(rnd, "N"), "K": _size(rnd, "K")}
            dt = rnd.choice(["f16", "f32"])
        if batch:
            sizes = {"Bt": _size(rnd, "Bt", (2, 3)), **sizes}
            st = "C[b, i, j] = sum(k: A[b, i, k] * B[b, k, j])"
            ins = {"A": (["Bt", "M", "K"], dt), "B": (["Bt", "K", "N"], dt)}
        else:
            st = "C[i, j] = sum(k: A[i, k] * B[k, j])"
            ins = {"A": (["M", "K"], dt), "B": (["K", "N"], dt)}
        return spec_text([st], ins, sizes, "C")
    if template == "rowreduce":
        op = rnd.choice(["sum", "max"])
        masked = rnd.random() < 0.4
        if masked:
            n = _size(rnd, "N")
            sizes = {"N": n}
            st = f"Y[i] = {op}(j | j <= i: X[i, j])"
            ins = {"X": (["N", "N"], "f32")}
        else:
            sizes = {"M": _size(rnd, "M"), "N": _size(rnd, "N")}
            st = f"Y[i] = {op}(j: X[i, j])"
            ins = {"X": (["M", "N"], "f32")}
        return spec_text([st], ins, sizes, "Y")
    if template == "masked_softmax":
        sizes = {"N": _size(rnd, "N")}
        return spec_text(["P[i, j] = softmax(j | j <= i: X[i, j])"], {"X": (["N", "N"], "f32")}, sizes, "P")
    if template == "attention":
        causal = rnd.random() < 0.6
        mask = " | j <= i" if causal else ""
        sizes = {"N": _size(rnd, "N"), "D": _size(rnd, "D", (2, 3, 4))}
        sts = [
            "S[i, j] = scale * sum(e: Q[i, e] * K[j, e])",
            f"P[i, j] = softmax(j{mask}: S[i, j])",
            "O[i, d] = sum(j: P[i, j] * V[j, d])",
        ]
        ins = {x: (["N", "D"], "f16") for x in ("Q", "K", "V")}
        return spec_text(sts, ins, sizes, "O", params={"scale": 0.5})
    if template == "expsum":
        sizes = {"M": _size(rnd, "M"), "K": _size(rnd, "K")}
        ins = {"X": (["M", "K"], "f32"), "W": (["K"], "f32")}
        if rnd.random() < 0.5:
            sts = ["Y[i] = sum(k: exp(X[i, k]) * W[k]) / 2"]
        else:
            sts = ["E[i, k] = exp(X[i, k])", "Y[i] = sum(k: E[i, k] * W[k]) / 2"]
        return spec_text(sts, ins, sizes, "Y")
    raise ValueError(template)


def recipe(template: str, prog: Program, rnd: random.Random) -> list[dict[str, Any]]:
    """A known-legal prefix that opens up the deeper rules (online_agg, skip_masked)."""
    if template == "attention" and prog.has_def("P"):
        t = rnd.randint(1, 7)
        n = dict(prog.sizes)["N"]
        if n is not None:
            t = min(t, n)
        steps = [
            {"rule": "split_softmax", "def": "P"},
            {"rule": "fuse", "producer": "P"},
            {"rule": "assoc", "def": "O", "index": "j"},
            {"rule": "tile", "def": "O", "index": "j", "size": t},
            {"rule": "tile", "def": "L", "index": "j_", "size": t, "outer": "jo_l", "inner": "ji_l"},
            {"rule": "online_agg", "def": "O", "index": "jo"},
        ]
        if rnd.random() < 0.5:
            steps.append({"rule": "fuse", "producer": "S"})
        return steps
    if template == "masked_softmax":
        return [{"rule": "split_softmax", "def": "P"}]
    return []


# --------------------------------------------------------------------------- candidates


def _fixed(prog: Program, ext) -> int | None:
    from compiler.rules.base import const_extent

    return const_extent(prog, ext)


def _fresh(prog: Program, base: str) -> str:
    from compiler.ir import fresh, names_in_program

    return fresh(base, names_in_program(prog))


def candidates(prog: Program, rnd: random.Random) -> list[dict[str, Any]]:
    """Rule applications to try on prog (most will be legal, some not: callers check)."""
    out: list[dict[str, Any]] = []
    for d in prog.defs:
        loops = [lp.var for lp in d.loops]
        reduces = [x for x in walk(d.body) if isinstance(x, Reduce)]
        folds = [x for x in walk(d.body) if isinstance(x, Fold)]
        # TILE: loops and reductions
        for v in loops + [r.var for r in reduces]:
            out.append({"rule": "tile", "def": d.name, "index": v, "size": rnd.randint(1, 7)})
        # REORDER: adjacent loops, directly nested reductions
        for a, b in zip(loops, loops[1:]):
            out.append({"rule": "reorder", "def": d.name, "outer": a, "inner": b})
        for r in reduces:
            if isinstance(r.body, Reduce):
                out.append({"rule": "reorder", "def": d.name, "outer": r.var, "inner": r.body.var})
        # SPLIT: fixed-extent reductions
        for r in reduces:
            n = _fixed(prog, r.ext)
            if n is not None and n >= 2:
                out.append({"rule": "split", "def": d.name, "index": r.var, "at": rnd.randint(1, n - 1)})
        # UNFUSE: top-level reductions
        for r in reduces:
            if not enclosing_binders(d.body, r):
                out.append({"rule": "unfuse", "def": d.name, "index": r.var, "name": _fresh(prog, "U")})
        # ASSOC
        for r in reduces:
            if r.op == "sum":
                out.append({"rule": "assoc", "def": d.name, "index": r.var})
        # CACHE: input tiles and accumulators
        out += _cache_candidates(prog, d, rnd)
        for r in reduces:
            # (by name: the rule addresses the first binder of that name, see test_split_keeps_binders_unique)
            if r.op == "sum" and find_binder(d, r.var).acc is None:
                out.append({"rule": "cache", "def": d.name, "accumulator": r.var, "level": "register"})
        # PARALLEL
        used_axes = {lp.mapping.axis for lp in d.loops if lp.mapping and lp.mapping.level == "grid"}
        for lp in d.loops:
            if lp.mapping is None:
                free = [a for a in ("x", "y", "z") if a not in used_axes]
                to = rnd.choice([f"grid.{a}" for a in free] + ["warp", "thread"])
                out.append({"rule": "parallel", "def": d.name, "index": lp.var, "to": to})
        # SPLIT-SOFTMAX
        if any(isinstance(x, Softmax) for x in walk(d.body)):
            out.append({"rule": "split_softmax", "def": d.name})
        # MAP-MMA
        loop_names = [lp.var for lp in d.loops]
        for r in reduces:
            if r.op == "sum" and r.mma is None:
                c = {"rule": "map_mma", "def": d.name, "index": r.var}
                if rnd.random() < 0.5 and loop_names:
                    c["m"] = rnd.choice(loop_names)
                out.append(c)
        # SKIP-MASKED
        for r in reduces + folds:
            out.append({"rule": "skip_masked", "def": d.name, "index": r.var})
        # ONLINE-AGG
        if isinstance(d.body, Bin) and d.body.op == "/" and isinstance(d.body.a, Reduce):
            out.append({"rule": "online_agg", "def": d.name, "index": d.body.a.var})
    # FUSE: every non-output def that something reads
    for d in prog.defs:
        if d.name == prog.output:
            continue
        readers = [x.name for x in prog.defs if any(isinstance(r, Read) and r.tensor == d.name for r in walk(x.body))]
        if readers:
            out.append({"rule": "fuse", "producer": d.name})
            if len(readers) > 1:
                out.append({"rule": "fuse", "producer": d.name, "def": rnd.choice(readers)})
    return out


def _cache_candidates(prog: Program, d, rnd: random.Random) -> list[dict[str, Any]]:
    """cache tensor T at a scope over the indices of its reads that have a fixed extent."""
    extents: dict[str, int | None] = {lp.var: _fixed(prog, lp.ext) for lp in d.loops}
    scopes: list[str | None] = [None]
    for e in walk(d.body):
        if isinstance(e, (Reduce, Fold)):
            extents[e.var] = _fixed(prog, e.ext) if len(e.ext.parts) == 1 else None
            scopes.append(e.var)
        if isinstance(e, Fold):
            for b in e.binds:
                for v, x in b.dims:
                    extents[v] = _fixed(prog, x)
        if isinstance(e, Let):
            for v, x in e.bind.dims:
                extents[v] = _fixed(prog, x)
    out = []
    tensors = {n for n, _ in prog.inputs} | {x.name for x in prog.defs}
    for r in walk(d.body):
        if not isinstance(r, Read) or r.tensor not in tensors:
            continue
        over = []
        for a in r.idx:
            vs = [v for v, c in a.terms if c == 1 and extents.get(v) is not None]
            if vs:
                over.append(rnd.choice(vs))
        over = [v for k, v in enumerate(over) if v not in over[:k]]
        if over:
            out.append({"rule": "cache", "def": d.name, "tensor": r.tensor, "at": rnd.choice(scopes),
                        "over": over, "level": rnd.choice(["shared", "register"])})
    return out


# --------------------------------------------------------------------------- fixed programs

GEMM_INPUTS = {"A": (["M", "K"], "f16"), "B": (["K", "N"], "f16")}
GEMM_ST = "C[i, j] = sum(k: A[i, k] * B[k, j])"


def gemm(sizes: Mapping[str, int | str] | None = None, dtype: str = "f16") -> Program:
    sizes = sizes or {"M": "dynamic", "N": "dynamic", "K": "dynamic"}
    ins = {k: (s, dtype) for k, (s, _) in GEMM_INPUTS.items()}
    return program_of(spec_text([GEMM_ST], ins, sizes, "C"))


def attention(causal: bool = True, n: int | str = "dynamic", d: int | str = 4) -> Program:
    mask = " | j <= i" if causal else ""
    return program_of(spec_text(
        [
            "S[i, j] = scale * sum(e: Q[i, e] * K[j, e])",
            f"P[i, j] = softmax(j{mask}: S[i, j])",
            "O[i, d] = sum(j: P[i, j] * V[j, d])",
        ],
        {x: (["N", "D"], "f16") for x in ("Q", "K", "V")},
        {"N": n, "D": d}, "O", params={"scale": 0.5},
    ))


def fa_steps(tile: int = 4) -> list[dict[str, Any]]:
    """The FlashAttention schedule's F1-F3 prefix on `attention()` (up to online_agg)."""
    return [
        {"rule": "split_softmax", "def": "P"},
        {"rule": "fuse", "producer": "P"},
        {"rule": "assoc", "def": "O", "index": "j"},
        {"rule": "tile", "def": "O", "index": "j", "size": tile},
        {"rule": "tile", "def": "L", "index": "j_", "size": tile, "outer": "jo_l", "inner": "ji_l"},
        {"rule": "online_agg", "def": "O", "index": "jo"},
    ]
