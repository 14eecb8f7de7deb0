"""A mount keeps the objects of its startup out of the garbage collector's passes."""

from __future__ import annotations

import gc

from pffs.mounting.process import freeze_startup_objects


class _Startup:
    """Stands for what a mount's startup makes (modules, boto3 models, the cache's parts)."""


def test_startup_objects_are_frozen_and_later_ones_collected_as_before() -> None:
    made_at_startup = [_Startup() for _ in range(100)]
    try:
        freeze_startup_objects()
        made_later = _Startup()
        scanned = gc.get_objects()
        assert not any(obj is made_at_startup[0] for obj in scanned)
        assert any(obj is made_later for obj in scanned)
    finally:
        gc.unfreeze()  # the rest of the test session as it was
