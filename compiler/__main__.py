"""`python -m compiler …` is `derivc …` (for machines where the console script is not installed)."""
import sys

from .cli import main

sys.exit(main())
