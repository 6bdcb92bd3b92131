"""What polls and queue reads answer."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.invocation.store import Outcome

if TYPE_CHECKING:
    from service.assets.files import Progress

log = logging.getLogger("nvcf.invocation")


@dataclass(frozen=True)
class PollAnswer:
    """A status poll's answer: still pending (`state`), or the outcome."""

    request_id: uuid.UUID
    function_id: uuid.UUID
    version_id: uuid.UUID
    state: str
    outcome: Outcome | None
    #: the worker's last progress report while pending (a worker on this machine)
    progress: Progress | None = None


@dataclass(frozen=True)
class QueueInfo:
    version_id: uuid.UUID
    name: str
    status: str
    depth: int
