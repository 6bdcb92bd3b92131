"""`nvcf` and LLM functions (issue 28) against a real server on the built-in simulated
catalog: `function create --type LLM --llm-model`, the models shown by `function get`,
`function update --llm-model-update`, and `nvcf chat` streaming the tiny model's answer."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import typer

from service.client_cli.functions import llm_model_of, llm_model_update_of
from tests.support.client_cli import Nvcf

H100 = ("--gpu", "H100", "--instance-type", "NCP.GPU.H100_1x")
MODEL = "name=tiny,uris=/v1/chat/completions|/v1/embeddings,routingMethod=round_robin,"
MODEL += "tokenRateLimit=100000-S,1000000-M"


@pytest.fixture
def nvcf(server: str, tmp_path: Path) -> Nvcf:
    return Nvcf(server, tmp_path / "config")


def test_llm_model_flags_read_as_nvcf_cli_writes_them() -> None:
    assert llm_model_of(MODEL) == {
        "name": "tiny",
        "llmConfig": {
            "uris": ["/v1/chat/completions", "/v1/embeddings"],
            "routingMethod": "round_robin",
            "tokenRateLimit": "100000-S,1000000-M",
        },
    }
    assert llm_model_update_of("name=tiny,tokenRateLimit=5-S") == {
        "modelName": "tiny",
        "llmConfig": {"tokenRateLimit": "5-S"},
    }
    for bad in ("uris=/v1/embeddings", "name=m,colour=red", "name=m,oops"):
        with pytest.raises(typer.BadParameter):
            llm_model_of(bad)
    with pytest.raises(typer.BadParameter):
        llm_model_update_of("name=m")


def test_create_deploy_and_chat_with_an_llm_function(nvcf: Nvcf) -> None:
    created = nvcf.json(
        "function",
        "create",
        "--name",
        "tiny-llm",
        "--image",
        "nvcr.io/acme/openai:1.0",
        "--inference-url",
        "/",
        "--type",
        "LLM",
        "--llm-model",
        MODEL,
    )["function"]
    fid, vid = created["id"], created["versionId"]
    assert created["functionType"] == "LLM"
    assert created["models"][0]["llmConfig"]["tokenRateLimit"] == "100000-S,1000000-M"
    shown = nvcf("function", "get", fid, vid)
    assert shown.exit_code == 0 and f"{fid}/tiny" in shown.stdout

    changed = nvcf.json(
        "function", "update", fid, vid, "--llm-model-update", "name=tiny,routingMethod=random"
    )
    assert changed["function"]["models"][0]["llmConfig"]["routingMethod"] == "random"

    done = nvcf("deploy", fid, vid, *H100, "--min", "1", "--wait")
    assert done.exit_code == 0, done.stderr
    answer = nvcf("chat", f"{fid}/tiny", "hello from the cli")
    assert answer.exit_code == 0, answer.stderr
    assert answer.stdout == "Echo: hello from the cli\n"
    as_json = nvcf.json("chat", f"{fid}/tiny", "two words")
    assert as_json["content"] == "Echo: two words"
    assert as_json["usage"]["completion_tokens"] == 3

    # a model the function does not declare reaches its worker, as on NVCF (docs/llm.md); a
    # function that does not exist is the error the CLI reports
    undeclared = nvcf("chat", f"{fid}/ghost", "hi")
    assert undeclared.exit_code == 0, undeclared.stderr
    missing = nvcf("chat", f"{uuid.uuid4()}/tiny", "hi")
    assert missing.exit_code == 1
    assert "404" in missing.stderr
    refused = nvcf("function", "create", "--name", "x", "--type", "LLM", "--llm-model", "name=m")
    assert refused.exit_code == 1 and "llmConfig.uris" in refused.stderr
