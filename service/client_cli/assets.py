"""`nvcf asset upload|list|get|delete`: NVCF's assets — files uploaded once through a
pre-signed URL, then referenced by id when invoking (docs/assets.md)."""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Annotated, Any

import typer

from service.client_cli.api import Api, V, signed_transfer
from service.client_cli.common import OutputOpt, connect
from service.client_cli.output import EXIT_CODES, Output, cell, table

app = typer.Typer(
    help="Assets: files uploaded once and referenced by id when invoking.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
)

AssetId = Annotated[str, typer.Argument(help="The asset's id.", show_default=False)]


def upload_file(
    api: Api, path: Path, content_type: str | None = None, description: str | None = None
) -> dict[str, Any]:
    """Create an asset and PUT the file to its upload URL; the created asset."""
    ctype = content_type or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    made: dict[str, Any] = api.call(
        "POST",
        f"{V}/assets",
        json={"contentType": ctype, "description": description or path.name},
    )
    signed_transfer(api, "PUT", made["uploadUrl"], path)
    return made


@app.command(epilog=EXIT_CODES)
def upload(
    file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="The file.")
    ],
    content_type: Annotated[
        str | None, typer.Option(help="Its media type (default: guessed from the name).")
    ] = None,
    description: Annotated[
        str | None, typer.Option(help="A description (default: the file's name).")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Upload a file as a new asset and print its id."""
    with connect(output) as run:
        made = upload_file(run.api, file, content_type, description)
        if run.ui.json:
            run.ui.emit({k: v for k, v in made.items() if k != "uploadUrl"})
        else:
            run.ui.show(made["assetId"])


@app.command("list", epilog=EXIT_CODES)
def list_assets(output: OutputOpt = Output.table) -> None:
    """The account's assets (not expired)."""
    with connect(output) as run:
        assets = run.api.call("GET", f"{V}/assets")["assets"]
        if run.ui.json:
            run.ui.emit(assets)
            return
        rows = table("ID", "CONTENT TYPE", "DESCRIPTION", "CREATED")
        for a in assets:
            rows.add_row(
                cell(a.get("assetId")),
                cell(a.get("contentType")),
                cell(a.get("description")),
                cell(a.get("createdAt")),
            )
        run.ui.show(rows)


@app.command(epilog=EXIT_CODES)
def get(
    asset_id: AssetId,
    download: Annotated[
        Path | None, typer.Option("--download", help="Save the asset's file here.")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """An asset's details; with --download, its file too."""
    with connect(output) as run:
        asset = run.api.call("GET", f"{V}/assets/{asset_id}")["asset"]
        if download is not None:
            url = run.api.call("GET", f"{V}/assets/{asset_id}/content-redirect")["presignedUrl"]
            size = signed_transfer(run.api, "GET", url, download)
            run.ui.note(f"saved {size} bytes to {download}")
        if run.ui.json:
            run.ui.emit(asset)
            return
        rows = table("FIELD", "VALUE")
        for key in ("assetId", "contentType", "description", "createdAt"):
            rows.add_row(key, cell(asset.get(key)))
        run.ui.show(rows)


@app.command(epilog=EXIT_CODES)
def delete(asset_id: AssetId, output: OutputOpt = Output.table) -> None:
    """Delete an asset and its file."""
    with connect(output) as run:
        run.api.call("DELETE", f"{V}/assets/{asset_id}")
        if run.ui.json:
            run.ui.emit({"assetId": asset_id, "deleted": True})
        else:
            run.ui.note(f"asset {asset_id} deleted")
