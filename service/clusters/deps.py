"""The cluster catalog and the backend adapters as typed FastAPI dependencies (the composition,
service/app.py, loads and builds them at start)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog


async def catalog(request: Request) -> Catalog:
    value: Catalog = request.app.state.catalog
    return value


async def adapters(request: Request) -> AdapterRegistry:
    value: AdapterRegistry = request.app.state.adapters
    return value


CatalogDep = Annotated[Catalog, Depends(catalog)]
AdaptersDep = Annotated[AdapterRegistry, Depends(adapters)]
