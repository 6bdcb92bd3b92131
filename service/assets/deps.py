"""The assets component the composition builds (service/app.py), for the asset routes."""

from __future__ import annotations

from fastapi import Request

from service.assets.service import Assets
from service.core.components import Component

ASSETS = Component[Assets | None]("assets")


def assets_of(request: Request) -> Assets | None:
    """The application's assets; None in a process that serves none (`nvcf-server invoke`)."""
    return ASSETS.of(request)
