"""`nvcf traffic get|set` against a real server: the split read, a refused one naming the
version, a malformed pair refused before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.client_cli import Nvcf


@pytest.fixture
def nvcf(server: str, tmp_path: Path) -> Nvcf:
    return Nvcf(server, tmp_path / "config")


def test_get_and_set_a_split(nvcf: Nvcf) -> None:
    fn = nvcf.json(
        "function", "create", "--name", "fn", "--image", "nvcr.io/acme/echo:1.0",
        "--inference-url", "/echo", "--inference-port", "8000",
    )["function"]  # fmt: skip
    fid, vid = fn["id"], fn["versionId"]
    assert nvcf.json("traffic", "get", fid) == {"functionId": fid, "traffic": []}
    shown = nvcf("traffic", "get", fid)
    assert shown.exit_code == 0 and "no split" in shown.stdout
    refused = nvcf("traffic", "set", fid, f"{vid}=100")
    assert refused.exit_code == 1
    assert vid in refused.stderr and "INACTIVE" in refused.stderr
    malformed = nvcf("traffic", "set", fid, f"{vid}=ninety")
    assert malformed.exit_code == 2 and "VERSION=WEIGHT" in malformed.stderr
    assert nvcf.json("traffic", "set", fid) == {"functionId": fid, "traffic": []}
