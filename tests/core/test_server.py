"""The serve commands' start-up: objects alive once the application is built are frozen out
of the cyclic garbage collector's reach (`NVCF_GC_FREEZE`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from service.core.server import freeze_startup_objects


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_start_up_objects_are_frozen_out_of_the_collector_when_asked() -> None:
    assert freeze_startup_objects(False) is False
    assert gc.get_freeze_count() == 0
    assert freeze_startup_objects(True) is True
    assert gc.get_freeze_count() > 0
    # what is created afterwards is collected as before
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1
