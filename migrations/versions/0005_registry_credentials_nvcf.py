"""Registry credentials in NVCF's shape: a name, artifact types, tags, provisionedBy.

Existing credentials keep doing what they did: each gets both CONTAINER (pull secrets of
instances) and HELM (chart pulls), provisionedBy USER, and a name derived from its user name
(`$oauthtoken` → `oauthtoken`), made unique per (account, hostname) with a `-2`, `-3`…
suffix. Uniqueness moves from (account, hostname, username) to (account, hostname, name), as
in NVCF. Passwords stay as they are (SecretBox ciphertext); nothing here decrypts them.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

NAME_MAX = 48
#: the naming convention's name would be longer than PostgreSQL's 63 characters
FK_NAME = "fk_registry_credential_artifact_types_credential"
_NOT_NAME_CHAR = re.compile(r"[^A-Za-z0-9_.\-]")
_LEADING = re.compile(r"^[^A-Za-z0-9]+")

credentials = sa.table(
    "registry_credentials",
    sa.column("id", sa.String),
    sa.column("account_id", sa.String),
    sa.column("registry_hostname", sa.String),
    sa.column("username", sa.String),
    sa.column("name", sa.String),
    sa.column("created_at", sa.DateTime),
)
artifact_types = sa.table(
    "registry_credential_artifact_types",
    sa.column("credential_id", sa.String),
    sa.column("artifact_type", sa.String),
)


def name_for(username: str, taken: set[str]) -> str:
    """A valid secret name (`^[A-Za-z0-9][A-Za-z0-9_.-]*$`, ≤48) from a user name, not in
    `taken`."""
    base = _LEADING.sub("", _NOT_NAME_CHAR.sub("-", username))[:NAME_MAX] or "credentials"
    name, n = base, 2
    while name in taken:
        suffix = f"-{n}"
        name = base[: NAME_MAX - len(suffix)] + suffix
        n += 1
    return name


def upgrade() -> None:
    with op.batch_alter_table("registry_credentials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("name", sa.String(length=NAME_MAX), nullable=True))
        batch_op.add_column(sa.Column("tags", sa.JSON(), nullable=True))
        batch_op.add_column(
            sa.Column("provisioned_by", sa.String(length=16), nullable=False, server_default="USER")
        )
    op.create_table(
        "registry_credential_artifact_types",
        sa.Column("credential_id", sa.String(length=36), nullable=False),
        sa.Column("artifact_type", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["credential_id"],
            ["registry_credentials.id"],
            name=FK_NAME,
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "credential_id", "artifact_type", name=op.f("pk_registry_credential_artifact_types")
        ),
    )

    conn = op.get_bind()
    rows = conn.execute(
        sa.select(
            credentials.c.id,
            credentials.c.account_id,
            credentials.c.registry_hostname,
            credentials.c.username,
        ).order_by(
            credentials.c.account_id,
            credentials.c.registry_hostname,
            credentials.c.created_at,
            credentials.c.id,
        )
    ).all()
    taken: dict[tuple[str, str], set[str]] = {}
    for cid, account, host, username in rows:
        used = taken.setdefault((account, host), set())
        name = name_for(username, used)
        used.add(name)
        conn.execute(credentials.update().where(credentials.c.id == cid).values(name=name))
    if rows:
        conn.execute(
            artifact_types.insert(),
            [
                {"credential_id": cid, "artifact_type": kind}
                for cid, *_ in rows
                for kind in ("CONTAINER", "HELM")
            ],
        )

    with op.batch_alter_table("registry_credentials", schema=None) as batch_op:
        batch_op.alter_column("name", existing_type=sa.String(length=NAME_MAX), nullable=False)
        batch_op.drop_constraint("uq_registry_credentials_account_host_user", type_="unique")
        batch_op.create_unique_constraint(
            "uq_registry_credentials_account_host_name",
            ["account_id", "registry_hostname", "name"],
        )


def downgrade() -> None:
    # The old schema allows one credential per (account, hostname, username): of several
    # with the same login, the oldest is kept. Every credential is used for every pull again.
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(
            credentials.c.id,
            credentials.c.account_id,
            credentials.c.registry_hostname,
            credentials.c.username,
        ).order_by(credentials.c.created_at, credentials.c.id)
    ).all()
    seen: set[tuple[str, str, str]] = set()
    for cid, account, host, username in rows:
        if (account, host, username) in seen:
            conn.execute(credentials.delete().where(credentials.c.id == cid))
        seen.add((account, host, username))
    op.drop_table("registry_credential_artifact_types")
    with op.batch_alter_table("registry_credentials", schema=None) as batch_op:
        batch_op.drop_constraint("uq_registry_credentials_account_host_name", type_="unique")
        batch_op.create_unique_constraint(
            "uq_registry_credentials_account_host_user",
            ["account_id", "registry_hostname", "username"],
        )
        batch_op.drop_column("provisioned_by")
        batch_op.drop_column("tags")
        batch_op.drop_column("name")
