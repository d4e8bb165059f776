"""The console of the `derivc` command line: rich tables and rules on a terminal, plain text
otherwise (`--plain`, or no rich)."""
from __future__ import annotations

from collections.abc import Sequence

try:  # rich is a dependency, but keep a plain fallback for a bare checkout
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    HAVE_RICH = True

    class _Console(Console):
        def on_broken_pipe(self) -> None:  # rich would exit 1; compiler.cli.main ends quietly (141)
            self.quiet = True
            raise BrokenPipeError
except ImportError:  # pragma: no cover - exercised only without rich
    HAVE_RICH = False


class Out:
    """Rich output to stdout when available, plain text otherwise."""

    def __init__(self, plain: bool = False):
        self.rich = HAVE_RICH and not plain
        self.console = _Console(highlight=False, soft_wrap=False) if self.rich else None

    def line(self, text: str = "", style: str | None = None) -> None:
        if self.console is not None:
            self.console.print(Text(text, style=style or ""))
        else:
            print(text)

    def heading(self, text: str) -> None:
        if self.console is not None:
            self.console.rule(Text(text, style="bold"))
        else:
            print(f"== {text} ==")

    def block(self, text: str, title: str = "") -> None:
        if self.console is not None:  # no panel: long program lines must not be re-wrapped
            if title:
                self.console.print(Text(f"-- {title} --", style="bold cyan"))
            self.console.print(Text(text.rstrip("\n")), soft_wrap=True)
        else:
            if title:
                print(f"-- {title} --")
            print(text.rstrip("\n"))

    def table(self, columns: Sequence[str], rows: Sequence[Sequence[str]], title: str = "") -> None:
        if self.console is not None:
            t = Table(title=title or None)
            for c in columns:
                t.add_column(c)
            for r in rows:
                t.add_row(*(Text(str(x)) for x in r))
            self.console.print(t)
        else:
            if title:
                print(title)
            widths = [max(len(str(c)), *(len(str(r[k])) for r in rows)) if rows else len(c) for k, c in enumerate(columns)]
            print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths)))
            for r in rows:
                print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)))
