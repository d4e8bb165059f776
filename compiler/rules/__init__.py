"""The rule registry: schedule `rule:` names → rule objects (one module per rule)."""
from __future__ import annotations

from .base import Rule

RULES: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    RULES[rule.name] = rule
    return rule


def _load() -> None:
    from importlib import import_module

    for mod in (
        "tile", "reorder", "split", "fuse", "unfuse", "cache", "parallel", "assoc",
        "split_softmax", "online_agg", "skip_masked", "map_mma", "fuse_let", "cache_row",
        "recompute", "softmax_rowterm", "fold_stat", "split_kv", "split_k", "fuse_sums",
        "skip_data_span",
    ):
        try:
            import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as exc:  # a rule module not written yet
            if exc.name != f"{__name__}.{mod}":
                raise


_load()
