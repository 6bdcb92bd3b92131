"""Domain events: how a lower domain causes work in a higher one without importing it.

The lower domain declares its events (frozen dataclasses, e.g. functions/events.py) and publishes
them; the composition (service/lifespan.py) subscribes the higher domains' handlers. A handler runs
either inside the publisher's transaction (`within`: its writes commit or roll back with the
publisher's) or once that transaction has committed (`after_commit`: wake a loop, drop a cache
entry; it must not fail). Handlers run in the order they were subscribed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from service.core.db import after_commit

E = TypeVar("E")


class Events:
    """The subscriptions of one application."""

    def __init__(self) -> None:
        self._within: dict[type[Any], list[Callable[[AsyncSession, Any], Awaitable[None]]]] = (
            defaultdict(list)
        )
        self._after: dict[type[Any], list[Callable[[Any], None]]] = defaultdict(list)

    def within(self, kind: type[E], handler: Callable[[AsyncSession, E], Awaitable[None]]) -> None:
        """Run `handler(session, event)` in the publisher's transaction."""
        self._within[kind].append(handler)

    def after_commit(self, kind: type[E], handler: Callable[[E], None]) -> None:
        """Run `handler(event)` once the publisher's transaction has committed."""
        self._after[kind].append(handler)

    async def publish(self, session: AsyncSession, event: object) -> None:
        for handler in self._within.get(type(event), ()):
            await handler(session, event)
        for later in self._after.get(type(event), ()):
            after_commit(session, _bound(later, event))


def _bound(handler: Callable[[E], None], event: E) -> Callable[[], None]:
    return lambda: handler(event)
