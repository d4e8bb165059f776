"""Which names may reach the generated Coq, Lean 4 and CUDA C++ sources.

Every name of a spec (sizes, tensors, indices, parameters) and every name a schedule step
introduces (tile `outer` / `inner`, cache buffer `name`, …) is printed verbatim into the proof
obligations and the kernel, so each must be an identifier in all three languages and must not
be one of their reserved words.  The keyword lists live here and nowhere else.
"""
from __future__ import annotations

import re

# Leading underscores are left to derivc's own generated names (and `__x` is reserved in C++).
IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
MAX_LENGTH = 64

COQ_RESERVED = frozenset({
    # Gallina keywords (Coq 8.16 reference manual, "Lexical conventions")
    "as", "at", "cofix", "else", "end", "exists", "exists2", "fix", "for", "forall", "fun", "if",
    "IF", "in", "let", "match", "return", "then", "where", "with", "by", "struct", "using",
    "Prop", "SProp", "Set", "Type",
    # vernacular commands that start a sentence in the generated files
    "Definition", "Theorem", "Lemma", "Proof", "Qed", "Defined", "Require", "Import", "Export",
    "Section", "End", "Variable", "Hypothesis", "Axiom", "Parameter", "Fixpoint", "Inductive",
    "Module", "Local", "Global", "Open", "Scope", "Notation", "Example", "Fact", "Remark",
    "Corollary", "Proposition", "Check", "Eval", "Compute", "Print",
})

LEAN_RESERVED = frozenset({
    # Lean 4 keywords and command words
    "abbrev", "at", "axiom", "break", "by", "calc", "catch", "class", "continue", "def", "deriving",
    "do", "else", "end", "example", "export", "extends", "finally", "for", "from", "fun", "have",
    "if", "import", "in", "inductive", "infix", "infixl", "infixr", "instance", "let", "local",
    "macro", "macro_rules", "match", "mut", "mutual", "namespace", "nomatch", "nofun",
    "noncomputable", "notation", "open", "opaque", "partial", "postfix", "prefix", "private",
    "protected", "return", "section", "set_option", "show", "sorry", "structure", "suffices",
    "syntax", "then", "theorem", "try", "universe", "unless", "unsafe", "variable", "where", "with",
    "Prop", "Sort", "Type", "forall", "exists", "λ", "this",
})

CUDA_RESERVED = frozenset({
    # C++20 keywords and alternative tokens
    "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break",
    "case", "catch", "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept",
    "const", "consteval", "constexpr", "constinit", "const_cast", "continue", "co_await",
    "co_return", "co_yield", "decltype", "default", "delete", "do", "double", "dynamic_cast",
    "else", "enum", "explicit", "export", "extern", "false", "float", "for", "friend", "goto",
    "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
    "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "register",
    "reinterpret_cast", "requires", "return", "short", "signed", "sizeof", "static",
    "static_assert", "static_cast", "struct", "switch", "template", "this", "thread_local",
    "throw", "true", "try", "typedef", "typeid", "typename", "union", "unsigned", "using",
    "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq",
    # CUDA built-in variables and types the kernels use
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "half", "half2", "nv_bfloat16",
    "nv_bfloat162", "float2", "float4", "int2", "int4", "uint2", "uint4", "dim3", "size_t",
    "int32_t", "int64_t", "uint32_t", "uint64_t", "NULL", "INFINITY", "NAN", "main",
})

RESERVED: dict[str, frozenset[str]] = {"Coq": COQ_RESERVED, "Lean 4": LEAN_RESERVED, "CUDA C++": CUDA_RESERVED}
ALL_RESERVED = COQ_RESERVED | LEAN_RESERVED | CUDA_RESERVED


def name_problem(name: object) -> str | None:
    """Why `name` cannot be used in the generated sources, or None when it can."""
    if not isinstance(name, str):
        return f"expected a name, got {type(name).__name__} {name!r}"
    if not IDENTIFIER.fullmatch(name):
        return f"{name!r} is not an identifier (a letter, then letters, digits or _)"
    if len(name) > MAX_LENGTH:
        return f"{name[:16]!r}… is longer than {MAX_LENGTH} characters"
    langs = [lang for lang, words in RESERVED.items() if name in words]
    if langs:
        return f"{name!r} is reserved in {' and '.join(langs)}"
    return None
