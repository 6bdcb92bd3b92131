"""The platform's side of the worker-utils sidecar (worker_utils.py): for a worker whose
files live in its pod (Kubernetes), the engine sends the request's signed asset URLs and a
signed upload URL for its large result in the control header, reads the sidecar's verdict on
the answer, and asks it for the progress file while the request runs."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from service.assets.files import PROGRESS_MAX_BYTES, Output, Progress, parse_progress
from service.assets.models import Asset, result_key
from service.assets.service import Assets
from service.assets.worker_utils import (
    CONTROL_HEADER,
    PASSED,
    PROGRESS_HEADER,
    RESULT_HEADER,
    STORED,
    Instructions,
)
from service.backends.worker import WorkerEndpoint, WorkerResponse

log = logging.getLogger("nvcf.assets")

#: seconds a progress question to the sidecar may take (a poll waits for it)
PROGRESS_TIMEOUT = 5.0
#: bytes of a refusal's body read
REFUSAL_MAX_BYTES = 16 * 1024


class SidecarRefused(Exception):
    """The sidecar refused the request (or none answered for it): the request ends with
    `status` and `detail`."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class SidecarFiles:
    """`WorkerFiles` of a request whose directories the sidecar makes."""

    request_id: uuid.UUID
    asset_ids: tuple[uuid.UUID, ...]
    control: str
    endpoint: WorkerEndpoint
    cluster: str

    @classmethod
    async def prepare(
        cls,
        assets: Assets,
        request_id: uuid.UUID,
        inputs: Sequence[Asset],
        endpoint: WorkerEndpoint,
        base_url: str,
        cluster: str,
    ) -> SidecarFiles:
        """Sign a download URL per asset and the upload URL of the request's result."""
        base = assets.base_url(base_url)
        urls = {
            a.id: await assets.store.download_url(a.key, base_url=base, content_type=a.content_type)
            for a in inputs
        }
        upload = await assets.store.upload_url(
            result_key(request_id), base_url=base, max_bytes=assets.settings.asset_result_max_bytes
        )
        control = Instructions(request_id, urls, upload).encode()
        return cls(request_id, tuple(urls), control, endpoint, cluster)

    def worker_headers(self) -> list[tuple[str, str]]:
        return [(CONTROL_HEADER, self.control)]

    async def remove(self) -> None:
        return None  # the sidecar removes them when the request is over

    async def outputs(self, max_files: int, max_bytes: int) -> list[Output]:
        return []  # the sidecar uploads them

    async def progress(self) -> Progress | None:
        """The progress file, asked of the sidecar; None when it has none or cannot say."""
        try:
            async with asyncio.timeout(PROGRESS_TIMEOUT):
                response = await self.endpoint.send(
                    "GET", "/", [(PROGRESS_HEADER, str(self.request_id))], b""
                )
                try:
                    if response.status != 200:
                        return None
                    raw = await response.read(PROGRESS_MAX_BYTES)
                finally:
                    await response.aclose()
        except Exception as exc:
            log.debug("asking the sidecar for progress of %s failed: %r", self.request_id, exc)
            return None
        return parse_progress(raw, self.request_id)

    async def result(self, assets: Assets, response: WorkerResponse, base_url: str) -> str | None:
        """The sidecar's verdict on the worker's answer: the signed URL of the large result
        it uploaded, None for an answer passed on; `SidecarRefused` when it refused, or when
        no sidecar handled a request with input assets."""
        verdict = next((v for k, v in response.headers if k.lower() == RESULT_HEADER.lower()), None)
        if verdict == PASSED:
            return None
        if verdict == STORED:
            key = result_key(self.request_id)
            size = await assets.store.size(key)
            limit = assets.settings.asset_result_max_bytes
            if size is None:
                raise SidecarRefused(502, "the worker-utils sidecar's large result is missing")
            if size > limit:  # S3 cannot bound a presigned PUT
                await assets.store.delete(key)
                raise SidecarRefused(
                    502,
                    f"the worker's large result was refused: its {size} bytes pass {limit} "
                    "(NVCF_ASSET_RESULT_MAX_BYTES)",
                )
            return await assets.result_url(self.request_id, base_url)
        if verdict is not None:
            try:
                body = await response.read(REFUSAL_MAX_BYTES)
                detail = str(json.loads(body)["detail"])
            except Exception:
                detail = "the worker-utils sidecar refused the request"
            # as for a worker on this machine: what failed before the worker ran is a 503
            raise SidecarRefused(response.status if response.status >= 500 else 503, detail)
        if self.asset_ids:
            raise SidecarRefused(
                503,
                f"input assets cannot be handed to this worker of cluster {self.cluster}: its "
                "pod has no worker-utils sidecar (docs/kubernetes.md)",
            )
        return None


__all__ = ["SidecarFiles", "SidecarRefused"]
