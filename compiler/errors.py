"""The two kinds of failure `derivc` reports, each with its own exit code."""
from __future__ import annotations

import difflib
from collections.abc import Iterable

EXIT_OK = 0
EXIT_INVALID_INPUT = 2
EXIT_DERIVATION_FAILED = 3
EXIT_VERIFY_FAILED = 4


class SpecError(Exception):
    """The input file is malformed: bad YAML, unknown names, shape or dtype mismatch."""

    exit_code = EXIT_INVALID_INPUT

    def __init__(self, where: str, reason: str, file: str = ""):
        self.file, self.where, self.reason = file, where, reason
        super().__init__(self.message())

    def message(self) -> str:
        loc = f"{self.file}: " if self.file else ""
        return f"{loc}{self.where}: {self.reason}"

    def in_file(self, file: str) -> "SpecError":
        return SpecError(self.where, self.reason, file)


class DerivationError(Exception):
    """A rule's precondition or a step's numeric check failed."""

    exit_code = EXIT_DERIVATION_FAILED

    def __init__(self, rule: str, reason: str, step: int | None = None, file: str = ""):
        self.rule, self.reason, self.step, self.file = rule, reason, step, file
        super().__init__(self.message())

    def message(self) -> str:
        loc = f"{self.file}: " if self.file else ""
        step = f"step {self.step} " if self.step is not None else ""
        return f"{loc}{step}({self.rule}): {self.reason}"

    def at(self, step: int, file: str = "") -> "DerivationError":
        return type(self)(self.rule, self.reason, step, file)


class StepInputError(DerivationError):
    """A schedule step names something that does not exist (a definition, an index, a
    tensor) or a name that is already taken: bad input (exit 2), reported at its step."""

    exit_code = EXIT_INVALID_INPUT


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest of `known`, or ''."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
