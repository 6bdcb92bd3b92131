"""The checks of a `telemetries` field (NVCF's TelemetriesDto) that a function version, and
later a task, is created with: each id the account's telemetry of the right type, and no port
of the workload on the collector's reserved ports."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.core.errors import FieldError, ValidationFailed
from service.observability import repository
from service.observability.models import Kind

#: the OpenTelemetry Collector's ports in a workload that names a telemetry (NVCF's)
RESERVED_PORTS: dict[int, str] = {
    14357: "the collector's OTLP gRPC receiver",
    14358: "the collector's OTLP HTTP receiver",
    18888: "the collector's own metrics",
    13133: "the collector's health check",
}
#: each field of TelemetriesDto and the type its telemetry must receive
FIELDS: dict[str, Kind] = {
    "logsTelemetryId": Kind.LOGS,
    "metricsTelemetryId": Kind.METRICS,
    "tracesTelemetryId": Kind.TRACES,
}


def canonical(telemetries: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The given ids in canonical form (lower-case, hyphenated), nulls dropped; None when none
    is given. The ids were checked to be UUIDs."""
    if not telemetries:
        return None
    out = {k: str(uuid.UUID(str(v))) for k, v in telemetries.items() if k in FIELDS and v}
    return out or None


def reserved_port_errors(ports: Iterable[tuple[str, int | None]]) -> list[FieldError]:
    """A violation for each (field, port) on a reserved port."""
    return [
        FieldError(
            where,
            f"port {port} is reserved for {RESERVED_PORTS[port]} of a workload that names a "
            f"telemetry (reserved: {', '.join(str(p) for p in RESERVED_PORTS)})",
        )
        for where, port in ports
        if port in RESERVED_PORTS
    ]


async def reference_errors(
    session: AsyncSession,
    account_id: str,
    telemetries: Mapping[str, str] | None,
    field: str = "telemetries",
    *,
    held: bool = False,
) -> list[FieldError]:
    """A violation for each id that is not one of the account's telemetries (another
    account's is not found either) or whose telemetry does not receive its type; `held`: the
    telemetries read as they are now and kept from deletion until the transaction ends."""
    if not telemetries:
        return []
    ids = {uuid.UUID(v) for v in telemetries.values()}
    found = {t.id: t for t in await repository.by_ids(session, account_id, ids, held=held)}
    errors: list[FieldError] = []
    for key, value in telemetries.items():
        telemetry = found.get(uuid.UUID(value))
        where = f"{field}.{key}"
        if telemetry is None:
            errors.append(FieldError(where, f"telemetry {value} is not one of the account's"))
        elif FIELDS[key] not in telemetry.kinds:
            kinds = ", ".join(k.value for k in telemetry.kinds)
            errors.append(
                FieldError(
                    where,
                    f"telemetry '{telemetry.name}' ({value}) receives {kinds}, not "
                    f"{FIELDS[key].value}",
                )
            )
    return errors


async def hold(
    session: AsyncSession, account_id: str, telemetries: Mapping[str, str] | None
) -> None:
    """Keep the telemetries a version or task is stored naming from deletion until the
    transaction ends (a delete waits, then sees what names them), checked again as they are
    now: one deleted since the request's check is a 400, and nothing is stored."""
    errors = await reference_errors(session, account_id, telemetries, held=True)
    if errors:
        raise ValidationFailed.of(errors)
