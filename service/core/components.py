"""The components the composition builds (service/app.py, declared with their types on
service/state.py's `AppState`), read from a request's application under a typed key.

Each domain names the components its routes take in its `deps.py` (`SETTINGS =
Component[Settings]("settings")`) and reads them there: `Component.of` is the one read of the
application's state outside the composition (tests/test_layers.py holds it so).
"""

from __future__ import annotations

from typing import Generic, TypeVar

from starlette.requests import HTTPConnection

T = TypeVar("T")


class Component(Generic[T]):
    """The component the composition puts on the application's state under `name`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def of(self, connection: HTTPConnection) -> T:
        """The component of the application serving `connection` (a plain call: the hot reads
        take no FastAPI dependency)."""
        value: T = getattr(connection.app.state, self.name)
        return value
