"""An S3-compatible object store for the asset tests: moto's server (a werkzeug app speaking
the S3 wire protocol) behind a gate that checks pre-signed URLs as S3 does (s3_gate.py: moto
checks none), started as its own process on 127.0.0.1, with a bucket made through boto3 like
any client would."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tests.support.s3_gate import ACCESS_KEY, SECRET_KEY
from tests.support.server import free_port

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

REGION = "us-east-1"


class S3Unavailable(RuntimeError):
    pass


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes] = field(repr=False)

    def client(self) -> S3Client:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def new_bucket(self) -> str:
        name = f"nvcf-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def settings(self, bucket: str) -> dict[str, object]:
        """The server settings that put assets into `bucket`."""
        return {
            "asset_storage": "s3",
            "asset_s3_bucket": bucket,
            "asset_s3_endpoint_url": self.endpoint,
            "asset_s3_region": REGION,
            "asset_s3_access_key_id": ACCESS_KEY,
            "asset_s3_secret_access_key": SECRET_KEY,
        }

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_s3() -> S3Server:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.s3_gate", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).parents[2],  # the gate is a module of this tree
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise S3Unavailable(f"moto's server exited with {process.returncode}")
        try:
            if httpx.get(f"{endpoint}/moto-api/", timeout=1).status_code < 500:
                return S3Server(endpoint, process)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise S3Unavailable("moto's server did not answer")
