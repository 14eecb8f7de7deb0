"""Fixtures of the real-mount tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pffs.testing.servers import MotoServer


@pytest.fixture
def counted(tmp_path: Path) -> Iterator[MotoServer]:
    """A moto server of this test's own, whose access log counts the requests it served."""
    with MotoServer(access_log=str(tmp_path / "moto-access.log")) as server:
        yield server
