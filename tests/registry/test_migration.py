"""Migration 0005: credentials stored in the old shape come out in NVCF's shape and keep
being used for both chart pulls (HELM) and pull secrets (CONTAINER); on both databases."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import create_engine, inspect, text

from service.core import migrate
from service.core.crypto import SecretBox, load_secret_box
from service.core.db import make_engine, make_sessionmaker
from service.registry.models import ArtifactType
from service.registry.pull_secrets import account_pull_secrets, pull_secret_name
from service.registry.service import credentials_for_host
from tests.support.app import ClientFactory, SettingsFactory
from tests.support.nvcf_cli import LIST_RESPONSE, add_request, go_decode

RC = "/v2/nvcf/registry-credentials"
ACCOUNT = "nvcf-default"
T0 = datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)
LONG = "u" * 255

#: (account, hostname, username, password, description) in creation order
OLD_ROWS = [
    (ACCOUNT, "nvcr.io", "$oauthtoken", "legacy-ngc-key", "NGC"),
    (ACCOUNT, "nvcr.io", "oauthtoken", "pw-b", None),
    (ACCOUNT, "registry.example.com:5000", "robot@corp", "pw-c", None),
    (ACCOUNT, "registry.example.com:5000", "---", "pw-d", None),
    (ACCOUNT, "registry.example.com:5000", LONG, "pw-f", None),
    (ACCOUNT, "registry.example.com:5000", "u" * 254 + "w", "pw-g", None),
    ("team-b", "nvcr.io", "$oauthtoken", "nvapi-team-b", None),
]
#: the names the migration gives them
NAMES = [
    "oauthtoken",
    "oauthtoken-2",
    "robot-corp",
    "credentials",
    "u" * 48,
    "u" * 46 + "-2",
    "oauthtoken",
]


def insert_old_rows(database_url: str, box: SecretBox) -> list[str]:
    engine = create_engine(migrate.sync_url(database_url))
    ids: list[str] = []
    with engine.begin() as conn:
        for i, (account, host, user, password, description) in enumerate(OLD_ROWS):
            ids.append(str(uuid.uuid4()))
            conn.execute(
                text(
                    "INSERT INTO registry_credentials (id, account_id, registry_hostname, "
                    "username, password_ciphertext, description, created_at, updated_at) "
                    "VALUES (:id, :account, :host, :user, :cipher, :description, :at, :at)"
                ),
                {
                    "id": ids[-1],
                    "account": account,
                    "host": host,
                    "user": user,
                    "cipher": box.encrypt(password),
                    "description": description,
                    "at": T0 + timedelta(seconds=i),
                },
            )
    engine.dispose()
    return ids


async def test_old_credentials_keep_pulling_charts_and_images(
    database_url: str, make_settings: SettingsFactory, client_factory: ClientFactory
) -> None:
    migrate.downgrade(database_url, "0004")
    box = load_secret_box(make_settings())  # the key the app will use (in its data dir)
    ids = insert_old_rows(database_url, box)
    migrate.upgrade(database_url)

    client = await client_factory()
    resp = await client.get(RC)
    assert resp.status_code == 200, resp.text
    items: list[dict[str, Any]] = resp.json()["registryCredentials"]
    go_decode(LIST_RESPONSE, resp.json())
    mine = [(i, row, name) for i, row, name in zip(ids, OLD_ROWS, NAMES, strict=True)]
    expected = [(i, row, name) for i, row, name in mine if row[0] == ACCOUNT]
    assert [c["registryCredentialId"] for c in items] == [i for i, _, _ in expected]
    for cred, (_, (_, host, _, _, description), name) in zip(items, expected, strict=True):
        assert cred["registryHostname"] == host
        assert cred["registryCredentialName"] == name
        assert cred["artifactTypes"] == ["CONTAINER", "HELM"]
        assert cred["provisionedBy"] == "USER"
        assert cred.get("description") == description
        assert "tags" not in cred
        assert cred["createdAt"] == cred["lastUpdatedAt"]
    assert items[0]["createdAt"] == "2026-03-01T12:00:00.123Z"
    assert items[0]["registryName"] == "NGC Private Registry"
    assert items[0]["keyType"] == "LEGACY"  # decrypted with the same key as before
    assert "keyType" not in items[1]
    assert items[2]["registryName"] == "Custom Registry"
    for password in ("legacy-ngc-key", "pw-b", "pw-c"):
        assert password not in resp.text
    other = (await client.get(RC, params={"artifactType": "HELM"})).json()
    assert len(other["registryCredentials"]) == len(expected)

    engine = make_engine(database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            helm = await credentials_for_host(
                session,
                ACCOUNT,
                "registry.example.com:5000",
                box=box,
                artifact_type=ArtifactType.HELM,
            )
            assert helm == [
                ("robot@corp", "pw-c"),
                ("---", "pw-d"),
                (LONG, "pw-f"),
                ("u" * 254 + "w", "pw-g"),
            ]
            secrets = dict(await account_pull_secrets(session, ACCOUNT, box))
            # the pull secrets keep their names: nothing is renamed in running instances
            assert sorted(secrets) == sorted(
                pull_secret_name(host, user)
                for account, host, user, *_ in OLD_ROWS
                if account == ACCOUNT
            )
    finally:
        await engine.dispose()

    # the new uniqueness is (account, hostname, name): nvcf-cli's `credentials` is taken on
    # registry.example.com:5000, free on nvcr.io
    taken = await client.post(RC, json=add_request("registry.example.com:5000", "x", "y", ["HELM"]))
    assert taken.status_code == 409
    free = await client.post(
        RC, json=add_request("nvcr.io", "$oauthtoken", "nvapi-k", ["CONTAINER"])
    )
    assert free.status_code == 200, free.text


async def test_downgrade_keeps_the_oldest_of_a_repeated_login(
    database_url: str, client_factory: ClientFactory
) -> None:
    client = await client_factory()
    for name in ("first", "second"):
        request = add_request("reg.example.com", "robot", f"pw-{name}", ["HELM"], name=name)
        assert (await client.post(RC, json=request)).status_code == 200
    first = (await client.get(RC)).json()["registryCredentials"][0]["registryCredentialId"]
    await client.aclose()

    migrate.downgrade(database_url, "0004")
    engine = create_engine(migrate.sync_url(database_url))
    with engine.connect() as conn:
        tables = inspect(conn).get_table_names()
        rows = conn.execute(text("SELECT id, username FROM registry_credentials")).all()
    assert "registry_credential_artifact_types" not in tables
    assert [(str(r[0]), r[1]) for r in rows] == [(first, "robot")]
    migrate.upgrade(database_url)
    with engine.connect() as conn:
        types = conn.execute(
            text("SELECT artifact_type FROM registry_credential_artifact_types ORDER BY 1")
        ).all()
    engine.dispose()
    assert [t[0] for t in types] == ["CONTAINER", "HELM"]
