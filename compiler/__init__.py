"""derivc compiler: spec parsing, IR, rules, reference interpreter, trace, CLI."""
__version__ = "0.1.0"
