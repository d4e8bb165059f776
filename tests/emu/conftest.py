"""The `ops` fixture: derivc_emu_ops.h compiled with tests/emu/ops_driver.cpp (emu_ops_testing)."""
from __future__ import annotations

import pytest

from emu_ops_testing import Ops, build_driver


@pytest.fixture(scope="session")
def ops() -> Ops:
    return Ops(build_driver())
