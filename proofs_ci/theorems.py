"""Theorem-name and integrity checks over derivc's two proof libraries.

- ``lean/``            Lean 4 (core only), module ``Derivc``
- ``proofs_ci/coq/``   Coq, logical name ``Derivc`` (``Derivc.All`` exports everything)

``RULE_THEOREMS`` is the single table the compiler imports: rewrite rule ->
theorem names that justify it.  Every name must exist, spelled identically, in
both libraries.  ``integrity_errors`` rejects unfinished proofs and extra
assumptions.  CLI: ``python -m proofs_ci.theorems [--root DIR] [--coq]``.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

RULE_THEOREMS: dict[str, tuple[str, ...]] = {
    "TILE": ("sumTo_tile", "sumTo_tile_guard", "maxTo_tile_guard", "gen_tile",
             "tile_cover", "tile_inj"),
    "REORDER": ("sumTo_swap",),
    "SPLIT": ("sumTo_split",),
    "FUSE": ("gen_inline",),
    "CACHE": ("cache_read", "cache_read2"),
    "PARALLEL": ("parallel_writes", "grid_axis_product", "grid_axis_cover"),
    "ASSOC": ("sumTo_factor", "sumTo_add"),
    "SPLIT_SOFTMAX": ("softmax_split", "exp_ne_zero"),
    "ONLINE_AGG": ("online_agg", "online_invariant", "online_agg_guard", "online_softmax"),
    "MASK": ("sumTo_guard_trunc",),
    "MAP_MMA": ("mma_tile",),
    # the backward pass (issue 16): P from the saved LSE, and FlashAttention-2's row term D
    "RECOMPUTE": ("softmax_recompute", "softmax_recompute_max"),
    "SOFTMAX_BWD_ROWTERM": ("softmax_bwd_rowterm",),
    # not a rewrite rule: the algebraic identity behind GRAD's softmax adjoint (no per-step
    # obligation; GRAD is validated numerically)
    "SOFTMAX_VJP": ("softmax_vjp_row",),
    "FOLD_STAT": ("online_lse",),
    # two sums over the same tiles as one fold of two accumulators (dK and dV in one kernel)
    "FUSE_SUMS": ("fold_pair_sum",),
    # split-KV (flash-decoding): partial (m, l, acc) states of consecutive key ranges merged
    "SPLIT_KV": ("online_split_kv_strided", "online_split_kv", "online_merge", "online_merge_splits",
                 "online_merge_fold", "online_merge_cover", "online_merge_global"),
    # split-K GEMM: a sum's tiles over S splits (strided), partial sums added in split order
    "SPLIT_K": ("sumTo_split_k_strided", "sumTo_strided", "sumTo_chunks"),
    # a key-tile span derived from a data mask (document masking): its cover, and the fold's skip
    "MASK_DATA": ("span_cover", "span_cover_at", "foldN_skip_span"),
}

# where a reader finds each rule's proofs (Coq file, Lean file), relative to the repo root
RULE_FILES: dict[str, tuple[str, str]] = {
    "TILE": ("proofs_ci/coq/Rules/Tile.v", "lean/Derivc/Rules/Tile.lean"),
    "REORDER": ("proofs_ci/coq/Rules/Reorder.v", "lean/Derivc/Rules/Reorder.lean"),
    "SPLIT": ("proofs_ci/coq/Rules/Split.v", "lean/Derivc/Rules/Split.lean"),
    "FUSE": ("proofs_ci/coq/Rules/Fuse.v", "lean/Derivc/Rules/Fuse.lean"),
    "CACHE": ("proofs_ci/coq/Rules/Cache.v", "lean/Derivc/Rules/Cache.lean"),
    "PARALLEL": ("proofs_ci/coq/Rules/Parallel.v", "lean/Derivc/Rules/Parallel.lean"),
    "ASSOC": ("proofs_ci/coq/Rules/Assoc.v", "lean/Derivc/Rules/Assoc.lean"),
    "SPLIT_SOFTMAX": ("proofs_ci/coq/Rules/SplitSoftmax.v",
                      "lean/Derivc/Rules/SplitSoftmax.lean"),
    "ONLINE_AGG": ("proofs_ci/coq/Rules/OnlineAgg.v", "lean/Derivc/Rules/OnlineAgg.lean"),
    "MASK": ("proofs_ci/coq/Rules/Mask.v", "lean/Derivc/Rules/Mask.lean"),
    "MAP_MMA": ("proofs_ci/coq/Rules/MapMma.v", "lean/Derivc/Rules/MapMma.lean"),
    "RECOMPUTE": ("proofs_ci/coq/Rules/Recompute.v", "lean/Derivc/Rules/Recompute.lean"),
    "SOFTMAX_BWD_ROWTERM": ("proofs_ci/coq/Rules/SoftmaxBwd.v",
                            "lean/Derivc/Rules/SoftmaxBwd.lean"),
    "SOFTMAX_VJP": ("proofs_ci/coq/Rules/SoftmaxVjp.v", "lean/Derivc/Rules/SoftmaxVjp.lean"),
    "FOLD_STAT": ("proofs_ci/coq/Rules/OnlineLse.v", "lean/Derivc/Rules/OnlineLse.lean"),
    "FUSE_SUMS": ("proofs_ci/coq/Rules/FuseSums.v", "lean/Derivc/Rules/FuseSums.lean"),
    "SPLIT_KV": ("proofs_ci/coq/Rules/OnlineMerge.v", "lean/Derivc/Rules/OnlineMerge.lean"),
    "SPLIT_K": ("proofs_ci/coq/Rules/SplitK.v", "lean/Derivc/Rules/SplitK.lean"),
    "MASK_DATA": ("proofs_ci/coq/Rules/MaskData.v", "lean/Derivc/Rules/MaskData.lean"),
}

# exp_ne_zero is a derived algebra fact (Algebra.v / Algebra.lean) used by SPLIT_SOFTMAX
_RULE_FILE_EXCEPTIONS = {"exp_ne_zero"}

ALL_RULE_THEOREMS: frozenset[str] = frozenset(n for ns in RULE_THEOREMS.values() for n in ns)

# the only axiom Coq's Print Assumptions may report
ALLOWED_COQ_AXIOMS = frozenset({"FunctionalExtensionality.functional_extensionality_dep",
                                "functional_extensionality_dep"})
# modules a library file may Require (besides Derivc.*)
ALLOWED_COQ_REQUIRES = frozenset({"Arith", "Lia", "List", "PeanoNat", "Bool",
                                  "FunctionalExtensionality", "ListNotations"})

COQ_FORBIDDEN = ("Admitted", "admit", "give_up", "Axiom", "Axioms", "Parameter", "Parameters",
                 "Conjecture", "Hypothesis", "Hypotheses", "Variable", "Variables")
LEAN_FORBIDDEN = ("sorry", "admit", "axiom", "Axiom", "unsafe", "implemented_by", "extern",
                  "native_decide", "opaque")


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def _coq_dir(root: Path) -> Path:
    return Path(root) / "proofs_ci" / "coq"


def _lean_dir(root: Path) -> Path:
    return Path(root) / "lean"


# ----------------------------------------------------------------------------- comments

def _strip_comments(text: str, open_: str, close: str, line: str | None, backslash_escapes: bool) -> str:
    """Remove (nested) block comments, optional line comments and string literals, keeping the
    line structure (newlines inside removed parts stay)."""
    out: list[str] = []
    i, depth, n = 0, 0, len(text)
    in_str = False
    while i < n:
        c = text[i]
        if in_str:
            if backslash_escapes and c == "\\":
                i += 2
                continue
            if c == '"':
                if not backslash_escapes and text.startswith('""', i):  # Coq's doubled quote
                    i += 2
                    continue
                in_str = False
            elif c == "\n":
                out.append(c)
            i += 1
            continue
        if text.startswith(open_, i):
            depth += 1
            i += 2
            continue
        if depth and text.startswith(close, i):
            depth -= 1
            i += 2
            continue
        if depth:
            if c == "\n":
                out.append(c)
            i += 1
            continue
        if line is not None and text.startswith(line, i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c == '"':
            in_str = True
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def strip_coq_comments(text: str) -> str:
    """Remove (nested) Coq comments and string literals, keeping line structure."""
    return _strip_comments(text, "(*", "*)", None, backslash_escapes=False)


def strip_lean_comments(text: str) -> str:
    """Remove Lean line comments, (nested) block/doc comments and string literals."""
    return _strip_comments(text, "/-", "-/", "--", backslash_escapes=True)


# ----------------------------------------------------------------------------- files

def coq_library_files(root: Path, include_examples: bool = False) -> list[Path]:
    d = _coq_dir(root)
    files = []
    for p in sorted(d.rglob("*.v")):
        rel = p.relative_to(d).parts
        if rel[0].startswith("_") or rel[0].startswith("."):
            continue
        if rel[0] in ("examples", "models") and not include_examples:
            continue
        files.append(p)
    return files


def lean_library_files(root: Path) -> list[Path]:
    d = _lean_dir(root)
    files = [d / "Derivc.lean"] if (d / "Derivc.lean").exists() else []
    files += sorted(p for p in (d / "Derivc").rglob("*.lean")) if (d / "Derivc").exists() else []
    return files


def coq_project_files(root: Path) -> list[str]:
    """The .v files of _CoqProject, in dependency order."""
    proj = _coq_dir(root) / "_CoqProject"
    return [ln.strip() for ln in proj.read_text().splitlines()
            if ln.strip().endswith(".v") and not ln.strip().startswith("#")]


# ----------------------------------------------------------------------------- names

_COQ_DECL = re.compile(
    r"(?m)^[ \t]*(?:#\[[^\]]*\][ \t]*)?(?:(?:Local|Global|Polymorphic)[ \t]+)*"
    r"(?:Theorem|Lemma|Corollary|Proposition|Fact|Remark)[ \t]+([A-Za-z_][A-Za-z0-9_']*)")
_LEAN_DECL = re.compile(
    r"(?m)^[ \t]*(?:@\[[^\]]*\][ \t]*)?(?:(?:private|protected|noncomputable)[ \t]+)*"
    r"(?:theorem|lemma)[ \t]+([A-Za-z_][A-Za-z0-9_'.!?]*)")


def coq_theorems(root: Path | str | None = None) -> set[str]:
    root = Path(root) if root is not None else repo_root()
    names: set[str] = set()
    for p in coq_library_files(root):
        names.update(_COQ_DECL.findall(strip_coq_comments(p.read_text())))
    return names


def lean_theorems(root: Path | str | None = None) -> set[str]:
    root = Path(root) if root is not None else repo_root()
    names: set[str] = set()
    for p in lean_library_files(root):
        for full in _LEAN_DECL.findall(strip_lean_comments(p.read_text())):
            names.add(full.split(".")[-1])
    return names


def check_same(lean: set[str], coq: set[str],
               rules: dict[str, tuple[str, ...]] = RULE_THEOREMS) -> list[str]:
    """Every rule theorem must exist in both libraries under the same name."""
    errors = []
    for rule, names in rules.items():
        for name in names:
            if name not in lean:
                errors.append(f"{rule}: theorem {name} missing from the Lean library")
            if name not in coq:
                errors.append(f"{rule}: theorem {name} missing from the Coq library")
    return errors


def rule_file_errors(root: Path) -> list[str]:
    """Each rule theorem is stated in its rule's file in both libraries."""
    errors = []
    for rule, (coq_f, lean_f) in RULE_FILES.items():
        cp, lp = Path(root) / coq_f, Path(root) / lean_f
        cn = set(_COQ_DECL.findall(strip_coq_comments(cp.read_text()))) if cp.exists() else set()
        ln = ({n.split(".")[-1] for n in _LEAN_DECL.findall(strip_lean_comments(lp.read_text()))}
              if lp.exists() else set())
        for name in RULE_THEOREMS[rule]:
            if name in _RULE_FILE_EXCEPTIONS:
                continue
            if name not in cn:
                errors.append(f"{rule}: {name} is not stated in {coq_f}")
            if name not in ln:
                errors.append(f"{rule}: {name} is not stated in {lean_f}")
    return errors


# ----------------------------------------------------------------------------- integrity

def _word_hits(text: str, words: tuple[str, ...]) -> list[tuple[int, str]]:
    hits = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for w in words:
            if re.search(rf"(?<![A-Za-z0-9_'.]){re.escape(w)}(?![A-Za-z0-9_'])", line):
                hits.append((lineno, w))
    return hits


_COQ_REQUIRE = re.compile(
    r"(?s)(?:From\s+(\S+)\s+)?Require\s+(?:(?:Import|Export)\s+)?(.*?)\.(?=\s|$)")


def _coq_require_errors(path: Path, text: str, models: bool = False) -> list[str]:
    """Library files may use Arith/Lia/…; a model (proofs_ci/coq/models/) may also use the
    standard reals, whose axioms are then those of the model, never of the library."""
    errors = []
    for m in _COQ_REQUIRE.finditer(text):
        prefix, mods = m.group(1), m.group(2).split()
        for mod in mods:
            if prefix == "Coq" and mod == "Reals" and not models:
                errors.append(f"{path}: Require of Reals outside proofs_ci/coq/models/")
                continue
            if prefix == "Coq" or mod.startswith("Coq.") or mod.startswith("Derivc."):
                continue
            if mod in ALLOWED_COQ_REQUIRES:
                continue
            errors.append(f"{path}: Require of non-allowed module {mod}")
    return errors


def integrity_errors(root: Path | str | None = None) -> list[str]:
    """Unfinished proofs, extra assumptions, foreign imports, unlisted files."""
    root = Path(root) if root is not None else repo_root()
    errors: list[str] = []
    coq_files = coq_library_files(root, include_examples=True)
    lean_files = lean_library_files(root)
    if not coq_files:
        errors.append(f"no Coq files under {_coq_dir(root)}")
    if not lean_files:
        errors.append(f"no Lean files under {_lean_dir(root)}")
    for p in coq_files:
        text = strip_coq_comments(p.read_text())
        for lineno, w in _word_hits(text, COQ_FORBIDDEN):
            errors.append(f"{p}:{lineno}: forbidden `{w}`")
        if re.search(r"Unset\s+\w+\s+Checking|bypass_check", text):
            errors.append(f"{p}: disables a kernel check")
        errors.extend(_coq_require_errors(p, text, models=p.parent.name == "models"))
    for p in lean_files:
        text = strip_lean_comments(p.read_text())
        for lineno, w in _word_hits(text, LEAN_FORBIDDEN):
            errors.append(f"{p}:{lineno}: forbidden `{w}`")
        for m in re.finditer(r"(?m)^\s*import\s+(.+)$", text):
            for mod in m.group(1).split():
                if not (mod == "Derivc" or mod.startswith("Derivc.")):
                    errors.append(f"{p}: import of non-library module {mod} (Lean core only)")
    # every library file is part of the build / export
    d = _coq_dir(root)
    if (d / "_CoqProject").exists():
        listed = set(coq_project_files(root))
        for p in coq_library_files(root):
            rel = p.relative_to(d).as_posix()
            if rel not in listed:
                errors.append(f"{rel} is not listed in _CoqProject")
        all_v = d / "All.v"
        if all_v.exists():
            exported = {m.rstrip(".") for m in
                        re.findall(r"Derivc\.([\w.]+)", strip_coq_comments(all_v.read_text()))}
            for rel in listed:
                mod = rel[:-2].replace("/", ".")
                if mod != "All" and mod not in exported:
                    errors.append(f"All.v does not export Derivc.{mod}")
        else:
            errors.append("proofs_ci/coq/All.v missing")
    else:
        errors.append("proofs_ci/coq/_CoqProject missing")
    lroot = _lean_dir(root) / "Derivc.lean"
    if lroot.exists():
        imported = set(re.findall(r"(?m)^\s*import\s+(\S+)", strip_lean_comments(lroot.read_text())))
        for p in lean_library_files(root)[1:]:
            mod = p.relative_to(_lean_dir(root)).with_suffix("").as_posix().replace("/", ".")
            if mod not in imported:
                errors.append(f"lean/Derivc.lean does not import {mod}")
    lake = _lean_dir(root) / "lakefile.toml"
    if not lake.exists() or "autoImplicit = false" not in lake.read_text():
        errors.append("lean/lakefile.toml missing or without autoImplicit = false")
    return errors


def coq_assumption_errors(root: Path | str | None = None) -> list[str]:
    """Build the Coq library in a temp dir and check `Print Assumptions` of every rule
    theorem: only functional extensionality may appear.  Needs coqc."""
    import tempfile

    from proofs_ci import coqlib
    root = Path(root) if root is not None else repo_root()
    with tempfile.TemporaryDirectory(prefix="derivc_coq_") as tmp:
        lib = coqlib.build_library(_coq_dir(root), Path(tmp) / "coq")
        report = coqlib.print_assumptions(sorted(ALL_RULE_THEOREMS), lib)
    errors = []
    for name, axioms in report.items():
        for ax in axioms:
            if ax not in ALLOWED_COQ_AXIOMS:
                errors.append(f"{name} depends on axiom {ax}")
    return errors


def compiler_rule_errors(root: Path) -> list[str]:
    """Every rule registered in compiler/ names theorems that exist in both libraries."""
    sys.path.insert(0, str(root))
    try:
        from compiler.rules import RULES
    except ImportError as exc:  # the compiler cannot be imported: say so, it is a real problem
        return [f"cannot import compiler.rules: {exc}"]
    finally:
        sys.path.pop(0)
    lean, coq = lean_theorems(root), coq_theorems(root)
    errors = []
    for name, rule in sorted(RULES.items()):
        for thm in (rule.theorem, *getattr(rule, "also", ())):
            missing = [lib for lib, names in (("lean/", lean), ("proofs_ci/coq/", coq)) if thm not in names]
            if missing:
                errors.append(f"rule {name} cites {thm}, missing from {' and '.join(missing)}")
    return errors


# ----------------------------------------------------------------------------- obligation lemmas

# where the obligations' proofs come from: the exporter's proof scripts and the Coq tactics
OBLIGATION_SOURCES = ("compiler/obligations.py", "compiler/obligations_base.py", "compiler/obligations_direct.py",
                      "compiler/obligations_frame.py", "compiler/obligations_bwd.py")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_']*")
_COQ_LTAC = re.compile(r"(?m)^[ \t]*Ltac[ \t]+([A-Za-z_][A-Za-z0-9_']*)")
_COQ_DEF = re.compile(r"(?m)^[ \t]*(?:Definition|Fixpoint)[ \t]+([A-Za-z_][A-Za-z0-9_']*)")
_LEAN_TACTIC = re.compile(r'(?m)^[ \t]*(?:macro|syntax)[ \t]+"([A-Za-z_][A-Za-z0-9_]*)"')
_LEAN_DEF = re.compile(
    r"(?m)^[ \t]*(?:@\[[^\]]*\][ \t]*)?(?:(?:private|protected|noncomputable)[ \t]+)*"
    r"(?:def|abbrev)[ \t]+([A-Za-z_][A-Za-z0-9_'.!?]*)")


def _python_strings(path: Path) -> str:
    """The string literals of a Python file (the proof scripts it emits)."""
    import ast

    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
    return "\n".join(out)


def coq_tactics(root: Path | str | None = None) -> set[str]:
    root = Path(root) if root is not None else repo_root()
    return set(_COQ_LTAC.findall(strip_coq_comments((_coq_dir(root) / "Tactics.v").read_text())))


def obligation_lemmas(root: Path | str | None = None) -> set[str]:
    """Library lemmas, definitions used in proofs and tactics that the generated obligations'
    proofs name: the identifiers of the exporter's proof scripts and of the Coq tactic bodies
    that are declared in the Coq library."""
    root = Path(root) if root is not None else repo_root()
    text = "\n".join(_python_strings(Path(root) / f) for f in OBLIGATION_SOURCES
                     if (Path(root) / f).exists())
    tactics = strip_coq_comments((_coq_dir(root) / "Tactics.v").read_text())
    text += "\n" + "\n".join(m.group(0) for m in re.finditer(r"(?ms)^Ltac .*?\.\s*$", tactics))
    declared = coq_theorems(root) | coq_tactics(root)
    for p in coq_library_files(root):
        declared |= set(_COQ_DEF.findall(strip_coq_comments(p.read_text())))
    return {w for w in _IDENT.findall(text) if w in declared}


def lean_names(root: Path | str | None = None) -> set[str]:
    """Theorems, definitions and tactics of the Lean library."""
    root = Path(root) if root is not None else repo_root()
    names = lean_theorems(root)
    for p in lean_library_files(root):
        raw = p.read_text()
        text = strip_lean_comments(raw)
        names |= {n.split(".")[-1] for n in _LEAN_DEF.findall(text)}
        # tactic names are string literals (which the stripper removes): a declaration counts
        # when its line is code, i.e. still starts with macro/syntax once comments are gone
        code_lines = text.splitlines()
        for m in _LEAN_TACTIC.finditer(raw):
            line = raw.count("\n", 0, m.start())
            if line < len(code_lines) and re.match(r"\s*(macro|syntax)\b", code_lines[line]):
                names.add(m.group(1))
    return names


# Coq definitions whose Lean counterpart is spelled differently (Lean core has its own `max`)
LEAN_SPELLING = {"max": "emax"}


def obligation_lemma_errors(root: Path | str | None = None) -> list[str]:
    """Every lemma / tactic the Coq obligations use exists in Lean under the same name."""
    lean = lean_names(root)
    missing = sorted(n for n in obligation_lemmas(root) if LEAN_SPELLING.get(n, n) not in lean)
    return [f"obligation lemma {n} is used by the Coq obligations but missing from lean/"
            for n in missing]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m proofs_ci.theorems", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=None, help="repository root (default: this checkout)")
    ap.add_argument("--coq", action="store_true",
                    help="also build the Coq library and check Print Assumptions (needs coqc)")
    args = ap.parse_args(argv)
    root = Path(args.root) if args.root else repo_root()
    lean, coq = lean_theorems(root), coq_theorems(root)
    errors = (check_same(lean, coq) + rule_file_errors(root) + integrity_errors(root)
              + compiler_rule_errors(root) + obligation_lemma_errors(root))
    if args.coq:
        errors += coq_assumption_errors(root)
    for e in errors:
        print("ERROR:", e)
    n = len(ALL_RULE_THEOREMS)
    used = obligation_lemmas(root)
    print(f"rules: {len(RULE_THEOREMS)}, rule theorems: {n}, "
          f"lean theorems: {len(lean)}, coq theorems: {len(coq)}, "
          f"common: {len(lean & coq)}, obligation lemmas: {len(used)} "
          f"(missing from Lean: {len(obligation_lemma_errors(root))}), problems: {len(errors)}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
