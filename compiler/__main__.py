"""`python -m compiler …` is `derivc …` (for machines where the console script is not installed)."""
import os
import signal
import sys


def _before_start(signum: int, frame: object) -> None:
    """A signal while the command line is still being imported: nothing was done yet."""
    what = "interrupted (SIGINT)" if signum == signal.SIGINT else "terminated (SIGTERM)"
    sys.stderr.write(f"derivc: error: {what}: before it started, nothing written\n")
    os._exit(128 + signum)


for _signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_signum, _before_start)

from .cli import entry  # noqa: E402 - after the handlers: importing takes a while

entry()
