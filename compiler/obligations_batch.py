"""Obligation files as coqc sees them: the step-independent text an obligation's cache key is
taken from, and the combined file that checks many obligations in one coqc process.

Canonical text.  Obligations of different steps or examples are often the same up to the step
number in their own names (`Section Step13`, `Theorem step13_PARALLEL`) and the header comment.
`canonical_text` drops the header comment and renames the names the file declares with its own
step's prefix to `Step__` / `step__`: a bijective renaming of names declared in the file itself
(the proof library declares no `stepNN` / `StepNN` name: tests/test_obligations_batch.py), so
two files with the same canonical text are accepted or refused by coqc together.  Where the
renaming could not be bijective (the text already has a `tep__` name) the text is kept as it is.

Combined file.  Files with the same prelude (the comment and the Require / Set lines before their
first `Section`) are checked together: the prelude once, then each file's rest in a `Module` of
its own, followed by a marker line that coqc prints only after the module's theorems were
accepted (`Qed` is checked when it is read; coqc stops at the first error).  A file whose rest
could change what a later module's proofs mean (global options, hints, tactic redefinitions,
axioms, …: `SHARED_STATE`) is never combined; proofcheck checks it alone.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_OWN_SECTION = re.compile(r"^Section Step([0-9]+)\.$", re.M)
# vernacular that reaches past the module it is written in, or admits a goal
SHARED_STATE = re.compile(
    r"\b(Global|Local|Export|Hint|Instance|Existing|Unset|Set|Ltac|Tactic|Axioms?|Parameters?|Conjecture|"
    r"Hypothes[ie]s|Variables?|Admitted|admit|Abort|Require|Import|Declare|Obligations?|Opaque|Transparent|"
    r"Strategy|Arguments|Notation|Infix|Coercion|Canonical|Module|Redirect|Fail|Drop|Load|Extraction|Cd|Add|"
    r"Remove|Timeout|Back|Reset|Include|Program)\b")
# the one `Add` every obligation makes (inside its own section, over its own context variables)
_RING = "Add Ring derivc_ring : (@kalg_ring R KA)."
_SECTION = re.compile(r"^Section ", re.M)


def _header_comment_end(text: str) -> int:
    """End of the leading `(* ... *)` comment (0 when there is none, or it nests or holds a
    string: then it is not dropped)."""
    if not text.startswith("(*"):
        return 0
    end = text.find("*)")
    if end < 0 or "(*" in text[2:end] or '"' in text[:end]:
        return 0
    return end + 2


def canonical_text(text: str) -> str:
    """The text an obligation's cache key is taken from (see the module's docstring); its
    step is the one its first `Section StepNN.` names."""
    m = _OWN_SECTION.search(text)
    if m is None or "tep__" in text:
        return text
    end = _header_comment_end(text)
    body = "\n" * text.count("\n", 0, end) + text[end:]
    own = re.escape(m.group(1))
    declared = set(re.findall(rf"^\s*(?:Section|Theorem|Lemma)\s+([Ss]tep{own}(?![0-9])[\w']*)", body, re.M))
    if not declared:
        return body
    names = re.compile(r"(?<![\w.'])(" + "|".join(sorted(map(re.escape, declared))) + r")(?![\w'])")
    return names.sub(lambda n: n.group(1)[0] + "tep__" + n.group(1)[4 + len(m.group(1)):], body)


@dataclass(frozen=True)
class Split:
    """An obligation file cut where its first section starts."""

    prelude: str  # the header comment and the Require / Set lines (one per combined file)
    rest: str  # what goes into the obligation's module

    @property
    def combinable(self) -> bool:
        return bool(self.rest) and SHARED_STATE.search(self.rest.replace(_RING, "")) is None


def split(text: str) -> Split:
    m = _SECTION.search(text)
    if m is None:
        return Split(text, "")
    end = _header_comment_end(text)
    prelude = text[end:m.start()] if "(*" not in text[end:m.start()] else text[:m.start()]
    return Split(prelude, text[m.start():])


def marker(nonce: str, k: int) -> str:
    return f"derivc-batch-{nonce}-passed-{k}"


def combined_text(prelude: str, rests: list[str], nonce: str) -> str:
    """One file that checks every `rests[k]` (the part of an obligation after its prelude) in a
    module of its own, printing `marker(nonce, k)` once module k was accepted."""
    out = [prelude.rstrip("\n") + "\n"]
    for k, rest in enumerate(rests):
        out.append(f"\nModule DerivcObligation{k}.\n{rest.rstrip()}\nEnd DerivcObligation{k}.\n"
                   f'Goal True. idtac "{marker(nonce, k)}". exact I. Qed.\n')
    return "".join(out)


def passed_prefix(output: str, nonce: str, n: int) -> int:
    """How many modules of a combined file coqc accepted, in order (their markers are printed
    in order; the first missing one ends the prefix)."""
    k = 0
    while k < n and marker(nonce, k) in output:
        k += 1
    return k
