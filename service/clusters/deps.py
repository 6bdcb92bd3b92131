"""The cluster catalog and the backend adapters as typed FastAPI dependencies (the composition,
service/app.py, loads and builds them at start)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core.components import Component

CATALOG = Component[Catalog]("catalog")
ADAPTERS = Component[AdapterRegistry]("adapters")


async def catalog(request: Request) -> Catalog:
    return CATALOG.of(request)


async def adapters(request: Request) -> AdapterRegistry:
    return ADAPTERS.of(request)


CatalogDep = Annotated[Catalog, Depends(catalog)]
AdaptersDep = Annotated[AdapterRegistry, Depends(adapters)]
