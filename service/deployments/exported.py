"""The instances' side of the in-process export (observability/export.py): each version's
instances by phase for its METRICS telemetry, and the logs of instances whose version names a
LOGS telemetry — every line the instance logs route would show, masked and cut the same way,
labelled with the function, version, instance and account.

A pass every `period` seconds counts the wanted instances by phase of the deployed versions
naming a metrics telemetry (the export's `nvcf.function.instances` gauge reads the last
count), and reads the live instances this replica leads (their lease is this replica's) of
versions naming a logs telemetry — nothing is read or followed for other versions — keeping
one follower task per instance, at most `limit` at once. A follower reads
the instance's containers through its cluster's adapter from the instance's start, and when a
follow ends (a container restarted) follows again from the last line's time, skipping lines
already sent. A follower that waited for a line rests DRAIN_PERIOD before reading on, so that
the lines written meanwhile come in one read: a busy worker's lines cost a few wake-ups a
second, not one each. While the logs endpoint is in backoff (its last export failed) the
follower reads nothing — each line read would only be dropped — and follows again from the
last line sent once the backoff ends. An instance no longer live, or no longer this
replica's, is left. A pass that found no version naming telemetries makes the next ones read
nothing until the clusters report a change (`changed()`: a version deployed starts instances).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.backends.kubernetes.adapter import adds_collector
from service.backends.logs import LogLine, LogRequest, cut
from service.backends.protocol import AdapterError, InstanceSpec
from service.clusters.adapters import AdapterRegistry
from service.core.crypto import SecretBox
from service.core.loops import FollowingLoop
from service.deployments import repository
from service.deployments.logs.service import LIVE_PHASES, masker_of
from service.functions import repository as functions_repository
from service.health.conditions import Phase
from service.observability.events import Logged, Phased
from service.observability.export import DRAIN_PERIOD, Exports
from service.observability.logs import Line, time_of
from service.observability.models import Kind
from service.observability.references import FIELDS

log = logging.getLogger("nvcf.observability")


@dataclass(frozen=True)
class Followed:
    """A live instance to follow and its labels."""

    instance_id: uuid.UUID
    account: str
    function_id: uuid.UUID
    version_id: uuid.UUID
    deployment_id: uuid.UUID
    cluster: str
    telemetries: Mapping[str, str]

    def spec(self) -> InstanceSpec:
        return InstanceSpec(
            instance_id=str(self.instance_id),
            function_id=str(self.function_id),
            version_id=str(self.version_id),
            instance_type="",
            gpu="",
            gpus_per_node=1,
            cluster=self.cluster,
            deployment_id=str(self.deployment_id),
            nca_id=self.account,
        )


def names(telemetries: Mapping[str, object] | None, kind: Kind) -> bool:
    return any(FIELDS.get(k) is kind and v for k, v in (telemetries or {}).items())


Named = Mapping[uuid.UUID, Mapping[str, Any]]


async def phases(session: AsyncSession, named: Named | None = None) -> list[Phased]:
    """Each deployed version naming a metrics telemetry, with its wanted instances by phase
    (every phase, 0 included, so that a phase left shows as 0). `named`: the versions naming
    telemetries, if read already."""
    if named is None:
        named = await functions_repository.telemetries_named(session)
    metrics = {vid: n for vid, n in named.items() if names(n, Kind.METRICS)}
    if not metrics:
        return []
    deployed = {
        vid: (account, fid) for account, fid, vid in await repository.deployed_of(session, metrics)
    }
    if not deployed:
        return []
    counts = {v: {phase.value: 0 for phase in Phase} for v in deployed}
    for vid, phase, n in await repository.instances_by_phase(session, deployed):
        counts[vid][phase] = counts[vid].get(phase, 0) + n
    return [
        Phased(account, str(fid), str(vid), metrics[vid], counts[vid])
        for vid, (account, fid) in deployed.items()
    ]


async def followed(
    session: AsyncSession, owner: str, adapters: AdapterRegistry, named: Named | None = None
) -> list[Followed]:
    """The live instances this replica leads of versions naming a logs telemetry, except on
    clusters that add the collector to their pods (it sends the pods' lines itself)."""
    if named is None:
        named = await functions_repository.telemetries_named(session)
    logs = {vid: n for vid, n in named.items() if names(n, Kind.LOGS)}
    if not logs:
        return []
    rows = await repository.leased_instances_of(session, owner, LIVE_PHASES, logs)
    return [
        Followed(*row[:5], row[5] or "", logs[row[3]])
        for row in rows
        if not adds_collector(adapters.get(row[5] or ""))
    ]


async def paced(lines: AsyncIterator[LogLine], pause: float) -> AsyncIterator[LogLine]:
    """The lines, resting `pause` seconds after each one the follow had to wait for (the
    event loop ran meanwhile), so that the lines written while it rests are read together."""
    loop = asyncio.get_running_loop()
    while True:
        waited: list[bool] = []
        handle = loop.call_soon(waited.append, True)  # runs only if the read waits
        try:
            line = await anext(lines)
        except StopAsyncIteration:
            return
        finally:
            handle.cancel()
        yield line
        if waited:
            await asyncio.sleep(pause)


class InstanceExports(FollowingLoop[uuid.UUID]):
    """The replica's phase counts and followers of instance logs (a loop service)."""

    def __init__(
        self,
        maker: async_sessionmaker[AsyncSession],
        adapters: AdapterRegistry,
        box: SecretBox,
        exports: Exports,
        owner: str,
        *,
        period: float,
        limit: int,
    ) -> None:
        self._maker, self._adapters, self._box = maker, adapters, box
        self._exports, self._owner = exports, owner
        super().__init__(
            "telemetry-instances",
            self.pass_once,
            period,
            log=log,
            failure="telemetry export of instances: a pass failed",
        )
        self.period, self.limit = period, limit
        #: the last pass found no version naming telemetries: passes read nothing until
        #: `changed()` (a server with no telemetry in use does no periodic reads for it)
        self._idle = False
        self._changed = False

    def changed(self) -> None:
        """The clusters reported a change (an instance started, say): the next pass reads."""
        self._changed = True  # read at the next pass: at most one a period, however many

    async def pass_once(self) -> None:
        if self._idle and not self._changed:
            return
        self._changed = False
        async with self._maker() as session:
            named = await functions_repository.telemetries_named(session)
            self._exports.phases(await phases(session, named))
            wanted = {
                f.instance_id: f
                for f in await followed(session, self._owner, self._adapters, named)
            }
        self._idle = not named and not self.following
        for instance_id in [i for i in self.following if i not in wanted]:
            self.following.pop(instance_id).cancel()
        for instance_id, f in wanted.items():
            task = self.following.get(instance_id)
            if task is not None and not task.done():
                continue
            if len(self.following) >= self.limit and instance_id not in self.following:
                self._exports.drops.add("log_followers_full")
                continue
            self.following[instance_id] = asyncio.create_task(
                self._follow(f), name=f"telemetry-logs-{instance_id}"
            )

    async def _follow(self, f: Followed) -> None:
        """Follow the instance until it ends; again, from the last line, when a follow ends."""
        last = ""
        while True:
            adapter = self._adapters.get(f.cluster)
            if adapter is not None and not self._exports.failing(f.telemetries, Kind.LOGS):
                async with self._maker() as session:
                    masker = await masker_of(session, self._box, f.version_id)
                since = None
                if last:
                    taken = time_of(last, time.time_ns())
                    since = max(1, int((time.time_ns() - taken) / 1e9) + 1)
                request = LogRequest(timestamps=True, follow=True, since_seconds=since)
                try:
                    async for line in paced(adapter.logs(f.spec(), request), DRAIN_PERIOD):
                        if last and line.timestamp and line.timestamp <= last:
                            continue  # sent before the follow ended
                        if self._exports.failing(f.telemetries, Kind.LOGS):
                            break  # this line is read again when the backoff ends
                        last = line.timestamp or last
                        now = time.time_ns()
                        self._hand(
                            f,
                            Line(
                                f.account,
                                str(f.function_id),
                                str(f.version_id),
                                str(f.instance_id),
                                line.pod,
                                line.container,
                                cut(masker(line.text)),  # masked whole, then cut
                                time_of(line.timestamp, now),
                            ),
                        )
                except AdapterError as exc:
                    log.info("following the logs of instance %s: %s", f.instance_id, exc.message)
            await asyncio.sleep(self.period)

    def _hand(self, f: Followed, line: Line) -> None:
        """One line to the export's bounded queue (never blocks: a full queue drops it)."""
        self._exports.invocation(
            Logged(f.account, str(f.function_id), str(f.version_id), f.telemetries, (line,))
        )


__all__ = ["InstanceExports", "followed", "names", "phases"]
