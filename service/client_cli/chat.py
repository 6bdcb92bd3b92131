"""`nvcf chat FUNCTION/MODEL "prompt"`: a chat completion of an LLM function through the
server's OpenAI-compatible gateway (docs/llm.md), the answer printed as it streams."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from service.client_cli.api import post_stream
from service.client_cli.common import OutputOpt, connect, fail
from service.client_cli.output import EXIT_CODES, Code, Output

CHAT = "/v2/nvcf/llm/v1/chat/completions"


def _error(body: bytes) -> str:
    """The message of an OpenAI error answer (else its text)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:500]
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return json.dumps(parsed)[:500]


def _content(chunk: Any) -> str:
    out = ""
    for choice in chunk.get("choices") or [] if isinstance(chunk, dict) else []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            out += delta["content"]
    return out


def chat(
    model: Annotated[
        str,
        typer.Argument(
            help="FUNCTION_ID/MODEL: an LLM function's model (see `nvcf function get`)."
        ),
    ],
    prompt: Annotated[str, typer.Argument(help="What to ask.")],
    system: Annotated[str | None, typer.Option(help="A system message first.")] = None,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, help="The most tokens the answer may have.")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Ask an LLM function's model; the answer streams as it is written.

    With -o json: {"model", "content", "usage"} once the answer is complete."""
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    with connect(output) as run:
        content, usage = "", None
        with post_stream(run.api, CHAT, body) as resp:
            if resp.status_code >= 400:
                message = _error(resp.read())
                raise fail(run.ui, f"{resp.status_code}: {message}", Code.API_ERROR)
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue
                text = _content(chunk)
                if text and not run.ui.json:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                content += text
                if isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
        if run.ui.json:
            run.ui.emit({"model": model, "content": content, "usage": usage})
            return
        sys.stdout.write("\n")


def register(app: typer.Typer) -> None:
    app.command(epilog=EXIT_CODES)(chat)
