"""pytest plugin for profiling the suite: appends `seconds<TAB>outcome<TAB>nodeid` for every test
phase as it finishes to $DERIVC_DURLOG (so a run killed by a time limit still leaves its times).

    DERIVC_DURLOG=/tmp/d.tsv python -m pytest -p devtools.durlog ...
"""
import os


def pytest_runtest_logreport(report):
    path = os.environ.get("DERIVC_DURLOG")
    if not path:
        return
    with open(path, "a") as f:
        f.write(f"{report.duration:.3f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")
