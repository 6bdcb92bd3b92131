"""What a unit of work holds: what the reconciler lends it (`Runtime`, with the process's
`Memory`), and what it decides outside the transactions, per leased instance (`Work`) and per
deployment of the batch (`Claimed`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.backends.protocol import InstanceSpec
from service.clusters.adapters import AdapterRegistry
from service.clusters.catalog import Catalog
from service.core.crypto import SecretBox
from service.deployments.logs.keep import ContainerKey
from service.deployments.models import Deployment, DeploymentDesired, DeploymentSpec, Instance
from service.deployments.reconcile.config import ReconcilerConfig
from service.deployments.reconcile.drain import Activity
from service.deployments.reconcile.store import ReconcileStore
from service.functions.models import FunctionVersion
from service.health.machine import HealthMode, InstanceCondition

Clock = Callable[[], datetime]
ResyncInfo = tuple[InstanceSpec, HealthMode, dict[str, Any]]


@dataclass
class Memory:
    """What this process remembers to spare database round trips and to time its sleep;
    losing it (a restart) costs one full unit of work per deployment, nothing else.

    `resync`: Running instances re-observable without the database (target, mode and the
    condition JSON as stored). `next_check`: health timers of the instances this process
    drives. `busy`: deployments inside a unit right now. `restarts`: the containers' restart
    counts of the Running instances at their last observation (a count that went up: the
    run that ended is kept, deployments/logs/keep.py).
    """

    resync: dict[uuid.UUID, ResyncInfo] = field(default_factory=dict)
    next_check: dict[uuid.UUID, datetime] = field(default_factory=dict)
    busy: set[uuid.UUID] = field(default_factory=set)
    restarts: dict[uuid.UUID, dict[ContainerKey, int]] = field(default_factory=dict)

    def forget(self, instance_ids: Sequence[uuid.UUID]) -> None:
        for inst_id in instance_ids:
            self.resync.pop(inst_id, None)
            self.next_check.pop(inst_id, None)
            self.restarts.pop(inst_id, None)


@dataclass
class Runtime:
    """What a unit of work needs from its reconciler."""

    sessionmaker: async_sessionmaker[AsyncSession]
    registry: AdapterRegistry
    catalog: Catalog
    config: ReconcilerConfig
    store: ReconcileStore
    clock: Clock
    memory: Memory
    secret_box: SecretBox | None
    wake: Callable[[], None]
    #: called after a unit in which an instance became Running (the invocation plane re-reads
    #: the versions whose requests wait)
    on_running: Callable[[], None] | None = None
    #: told the versions with an instance draining (the invocation plane of this process
    #: forgets their cached routes at once: a draining instance takes no new request)
    on_draining: Callable[[uuid.UUID], None] | None = None
    #: the invocation plane's view of requests in flight (drain.py; None: none in view)
    activity: Activity | None = None

    @property
    def owner(self) -> str:
        return self.store.owner


@dataclass
class Work:
    """One leased instance during a unit: what was decided outside the transactions."""

    row: Instance
    spec: DeploymentSpec
    condition: InstanceCondition | None = None
    placed_on: str | None = None
    placement_event: str | None = None
    gone: bool = False  # torn down on the backend in this unit
    observed: bool = False
    target: InstanceSpec | None = None
    mode: HealthMode = "default"
    #: the secrets generation its Secret received in this unit (rotated: in place)
    secrets_generation: int | None = None
    rotated: bool = False
    #: the last lines of its containers, read as it failed or as a container of it restarted
    #: while Running (deployments/logs/keep.py)
    kept_logs: list[dict[str, Any]] | None = None
    #: its containers' restart counts as observed in this unit
    restarts: dict[ContainerKey, int] | None = None


@dataclass
class Claimed:
    """One deployment of the batch as T1 left it."""

    dep: Deployment
    version: FunctionVersion | None
    work: list[Work]

    @property
    def tearing_down(self) -> bool:
        return self.dep.desired != DeploymentDesired.DEPLOYED or self.version is None
