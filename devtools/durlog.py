"""pytest plugin for profiling the suite: appends `seconds<TAB>phase<TAB>outcome<TAB>nodeid` for
every test phase as it finishes to $DERIVC_DURLOG (so a run killed by a time limit still leaves
its times).

    DERIVC_DURLOG=/tmp/d.tsv python -m pytest -p devtools.durlog ...
    DERIVC_DURLOG=/tmp/d.tsv DERIVC_DURLOG_CLOCK=cpu python -m pytest -p devtools.durlog ...

The default clock is the wall clock (pytest's report.duration).  With DERIVC_DURLOG_CLOCK=cpu the
seconds are the CPU time of the phase: the test process's user + system time and that of the
child processes it waited for (g++, a subprocess build); on a machine shared with other work the
wall clock mostly measures the neighbours.

Each phase is written once, by the process that ran it: under pytest-xdist the controller gets
every report a second time from the workers and writes none of them.
"""
from __future__ import annotations

import os
import resource

import pytest

_CPU_KEY = pytest.StashKey[dict]()


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(item: pytest.Item, when: str):
    start = _cpu_seconds()
    yield
    item.stash.setdefault(_CPU_KEY, {})[when] = _cpu_seconds() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _timed(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _timed(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _timed(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    cpu = item.stash.get(_CPU_KEY, {}).get(call.when)
    if cpu is not None:
        outcome.get_result().cpu_seconds = cpu


def _controller(config: pytest.Config) -> bool:
    """An xdist controller: its reports come from the workers, which logged them already."""
    return not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None) not in (None, 0)


_config: pytest.Config | None = None


def pytest_configure(config):
    global _config
    _config = config


def pytest_runtest_logreport(report):
    path = os.environ.get("DERIVC_DURLOG")
    if not path or (_config is not None and _controller(_config)):
        return
    seconds = report.duration
    if os.environ.get("DERIVC_DURLOG_CLOCK") == "cpu":
        seconds = getattr(report, "cpu_seconds", seconds)
    with open(path, "a") as f:
        f.write(f"{seconds:.3f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")
