"""The CSI tests' one driver fixture: a real `pffs csi` process under the test's directory
(tests/csi/csi_driver.py). A module changes the driver's environment by defining its own
`driver_env` fixture."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.csi.csi_driver import Driver, running


@pytest.fixture
def driver_env() -> dict[str, str] | None:
    """The driver's environment; None is the tests' own."""
    return None


@pytest.fixture
def driver(tmp_path: Path, driver_env: dict[str, str] | None) -> Iterator[Driver]:
    with running(tmp_path, env=driver_env) as started:
        yield started
