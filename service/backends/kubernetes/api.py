"""The Kubernetes adapter's calls to one API server through `lightkube`: the configuration
(a kubeconfig or the in-cluster service account), the client made on first use, and the verbs
the adapter uses (server-side apply, get, list, delete of a namespace), every failure turned
into an `AdapterError` with the server's own message (errors.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from lightkube import ALL_NS, AsyncClient, ConfigError, KubeConfig, SingleConfig
from lightkube.config.client_adapter import AsyncClient as lightkube_http_client
from lightkube.config.client_adapter import ConnectionParams
from lightkube.types import CascadeType, PatchType

from service.backends.kubernetes.errors import CAUGHT, translate
from service.backends.kubernetes.kinds import (
    NAMESPACE,
    KindInfo,
    global_resource,
    namespaced_resource,
)
from service.backends.kubernetes.objects import terminating
from service.backends.protocol import AdapterError
from service.backends.worker import CONNECT_TIMEOUT

T = TypeVar("T")


class KubeApi:
    """One cluster's API server. The client is created on first use, so a missing kubeconfig
    surfaces as an `AdapterError` of the first call rather than at start-up."""

    def __init__(
        self,
        cluster: str,
        *,
        kubeconfig: Path | None,
        context: str | None,
        in_cluster: bool,
        field_manager: str,
        timeout: float,
    ) -> None:
        self.cluster = cluster
        self.kubeconfig = kubeconfig
        self.context = context
        self.in_cluster = in_cluster
        self.field_manager = field_manager
        self.timeout = timeout
        self.server = "in-cluster" if in_cluster else str(kubeconfig)
        self._client: AsyncClient | None = None
        self._config: SingleConfig | None = None

    def client(self) -> AsyncClient:
        if self._client is None:
            config = self.config()
            try:
                self._client = AsyncClient(
                    config, field_manager=self.field_manager, timeout=httpx2.Timeout(self.timeout)
                )
            except (OSError, ValueError) as exc:  # e.g. an unreadable CA or client certificate
                raise self.setup_failed(exc) from exc
            self.server = config.cluster.server or self.server
        return self._client

    def proxy_client(self) -> httpx2.AsyncClient:
        """A client of the API server with the adapter's credentials and no read timeout (an
        invocation may take long; its own deadline bounds it)."""
        params = ConnectionParams(
            timeout=httpx2.Timeout(connect=CONNECT_TIMEOUT, read=None, write=60.0, pool=None)
        )
        try:
            return lightkube_http_client(self.config(), params)
        except (OSError, ValueError) as exc:
            raise self.setup_failed(exc) from exc

    def setup_failed(self, exc: Exception) -> AdapterError:
        return AdapterError(
            f"cluster {self.cluster}: cannot set up the Kubernetes client: {exc}",
            retryable=False,
        )

    def config(self) -> SingleConfig:
        if self._config is not None:
            return self._config
        try:
            if self.in_cluster:
                loaded = KubeConfig.from_service_account().get()
            else:
                assert self.kubeconfig is not None
                loaded = KubeConfig.from_file(self.kubeconfig).get(context_name=self.context)
        except (ConfigError, OSError, KeyError, ValueError, TypeError) as exc:
            source = "in-cluster service account" if self.in_cluster else str(self.kubeconfig)
            detail = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            raise AdapterError(
                f"cluster {self.cluster}: cannot load the Kubernetes configuration from "
                f"{source}: {detail}",
                retryable=False,
            ) from exc
        if loaded is None:  # pragma: no cover - `get` raises when no context is set
            raise AdapterError(f"cluster {self.cluster}: no Kubernetes context", retryable=False)
        self._config = loaded
        return loaded

    def failure(self, exc: Exception, operation: str) -> AdapterError:
        return translate(exc, operation, self.cluster, self.server)

    async def call(self, operation: str, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except AdapterError:
            raise
        except CAUGHT as exc:
            raise self.failure(exc, operation) from exc

    async def gather(self, calls: Sequence[Awaitable[T]]) -> list[T]:
        results = await asyncio.gather(*calls, return_exceptions=True)
        out: list[T] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            out.append(result)
        return out

    async def apply(self, info: KindInfo, namespace: str | None, body: dict[str, Any]) -> None:
        """Server-side apply one object (`force`, the adapter's field manager)."""
        name = str(body["metadata"]["name"])
        what = f"applying {info.kind} {name}" + (f" in {namespace}" if namespace else "")
        client = self.client()
        if info.namespaced:
            await self.call(
                what,
                client.patch(
                    namespaced_resource(info),
                    name,
                    body,
                    namespace=namespace,
                    patch_type=PatchType.APPLY,
                    field_manager=self.field_manager,
                    force=True,
                ),
            )
        else:
            await self.call(
                what,
                client.patch(
                    global_resource(info),
                    name,
                    body,
                    patch_type=PatchType.APPLY,
                    field_manager=self.field_manager,
                    force=True,
                ),
            )

    async def get(self, info: KindInfo, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when the API server answers 404."""
        what = f"reading {info.kind} {name}"
        client = self.client()
        try:
            if info.namespaced:
                found: dict[str, Any] = await self.call(
                    what, client.get(namespaced_resource(info), name, namespace=namespace)
                )
            else:
                found = await self.call(what, client.get(global_resource(info), name))
        except AdapterError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(found)

    async def list_objects(
        self,
        info: KindInfo,
        namespace: str | None,
        *,
        labels: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Every object of a kind (in a namespace, or all namespaces with `ALL_NS`).

        List items come without `kind`/`apiVersion`; they are filled in here.
        """
        where = "all namespaces" if namespace == ALL_NS else (namespace or "the cluster")
        return await self.call(
            f"listing {info.plural} in {where}", self._collect(info, namespace, labels, fields)
        )

    async def _collect(
        self,
        info: KindInfo,
        namespace: str | None,
        labels: dict[str, Any] | None,
        fields: dict[str, Any] | None,
    ) -> list[dict[str, Any]]:
        client = self.client()
        listing: AsyncIterable[Mapping[str, Any]]
        if info.namespaced:
            listing = client.list(
                namespaced_resource(info), namespace=namespace, labels=labels, fields=fields
            )
        else:
            listing = client.list(global_resource(info), labels=labels, fields=fields)
        out: list[dict[str, Any]] = []
        async for item in listing:
            obj = dict(item)
            obj["kind"] = info.kind
            obj["apiVersion"] = info.api_version
            out.append(obj)
        return out

    async def delete_namespace(self, name: str, *, known_present: bool = False) -> bool:
        """Start deleting a namespace (foreground); True once the API server no longer has it."""
        if not known_present:
            existing = await self.get(NAMESPACE, None, name)
            if existing is None:
                return True
            if terminating(existing):
                return False
        try:
            await self.call(
                f"deleting namespace {name}",
                self.client().delete(
                    global_resource(NAMESPACE), name, cascade=CascadeType.FOREGROUND
                ),
            )
        except AdapterError as exc:
            if exc.status == 404:
                return True
            if exc.status == 409:  # already terminating
                return False
            raise
        return False

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
