"""The two kinds of failure `derivc` reports, each with its own exit code."""
from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable
from typing import Any

EXIT_OK = 0
EXIT_INVALID_INPUT = 2
EXIT_DERIVATION_FAILED = 3
EXIT_VERIFY_FAILED = 4

# The longest `where: reason` of an error line (the file name comes on top): whatever the input
# holds, the one line stays readable.  A statement is shown cut around its failing column
# (excerpt), a value by a bounded repr (shown_value); this is the net under both.
MAX_MESSAGE = 300
EXCERPT_CONTEXT = 60
MAX_WHERE = 100  # a field's path, which may hold a name the input made up


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (a line break of str.splitlines, an
    escape) written as its Python escape, so that an error stays one visible line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def clip(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` if at most `limit` characters, else its start and end around a '…'."""
    text = str(text)
    if len(text) <= limit:
        return text
    head = (limit - 1) * 2 // 3
    return text[:head] + "…" + text[len(text) - (limit - 1 - head):]


def excerpt(text: str, column: int, context: int = EXCERPT_CONTEXT) -> str:
    """`text` cut to `context` characters either side of the 1-based `column`, '…' where cut,
    with the failing character marked by '⟦ ⟧' when the text had to be cut."""
    at = max(0, min(column - 1, len(text)))
    if len(text) <= 2 * context:
        return text
    lo, hi = max(0, at - context), min(len(text), at + context)
    marked = text[lo:at] + "⟦" + text[at:at + 1] + "⟧" + text[at + 1:hi]
    return ("…" if lo else "") + marked + ("…" if hi < len(text) else "")


def located(file: str, text: str) -> str:
    """`file: text`, the text one printable line of at most MAX_MESSAGE characters."""
    return (f"{file}: " if file else "") + clip(printable(text))


_SHOWN = reprlib.Repr()
_SHOWN.maxlist = _SHOWN.maxdict = _SHOWN.maxtuple = _SHOWN.maxset = 6
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlevel = 3


def shown_value(value: Any) -> str:
    """A value of the input as an error shows it: its repr, bounded in length and depth."""
    return clip(_SHOWN.repr(value), 120)


class SpecError(Exception):
    """The input file is malformed: bad YAML, unknown names, shape or dtype mismatch."""

    exit_code = EXIT_INVALID_INPUT

    def __init__(self, where: str, reason: str, file: str = ""):
        self.file, self.where, self.reason = file, where, reason
        super().__init__(self.message())

    def message(self) -> str:
        return located(self.file, f"{clip(self.where, MAX_WHERE)}: {self.reason}")

    def in_file(self, file: str) -> "SpecError":
        return SpecError(self.where, self.reason, file)


class DerivationError(Exception):
    """A rule's precondition or a step's numeric check failed."""

    exit_code = EXIT_DERIVATION_FAILED

    def __init__(self, rule: str, reason: str, step: int | None = None, file: str = ""):
        self.rule, self.reason, self.step, self.file = rule, reason, step, file
        super().__init__(self.message())

    def message(self) -> str:
        step = f"step {self.step} " if self.step is not None else ""
        return located(self.file, f"{step}({self.rule}): {self.reason}")

    def at(self, step: int, file: str = "") -> "DerivationError":
        return type(self)(self.rule, self.reason, step, file)


class StepInputError(DerivationError):
    """A schedule step names something that does not exist (a definition, an index, a
    tensor) or a name that is already taken: bad input (exit 2), reported at its step."""

    exit_code = EXIT_INVALID_INPUT

    def message(self) -> str:
        """As a parameter error reads: the schedule entry first (schedule[k-1] is step k)."""
        if self.step is None or self.step < 1:
            return super().message()
        return located(self.file, f"schedule[{self.step - 1}]: step {self.step} ({self.rule}): {self.reason}")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest of `known`, or ''."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
