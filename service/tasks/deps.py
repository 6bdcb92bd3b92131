"""The tasks component the composition builds (service/lifespan.py), for the task routes."""

from __future__ import annotations

from fastapi import Request

from service.core.components import Component
from service.core.errors import NotFound
from service.tasks.service import Tasks

TASKS = Component[Tasks | None]("tasks")


def tasks_of(request: Request) -> Tasks:
    tasks = TASKS.of(request)
    if tasks is None:  # only `nvcf-server invoke` runs without them, and not these routes
        raise NotFound(detail="tasks are not served by this process")
    return tasks
