"""Deployment state as stored. The API writes desired state; only the reconciler writes observed
state (instance phases, conditions) — the database is the single source of truth, so a restart
resumes exactly where it stopped.

Tables:
- `deployments`: at most one live ("deployed") per function version; "deleting" rows stay until
  the reconciler has torn their instances down.
- `deployment_specs`: the GPU specifications (`gpuSpecificationId` = id), each with the
  validated objects rendered for it (helm: chart + its `configuration`; container: generated).
- `instances`: one row per instance the reconciler created; `desired` = "present" | "absent";
  `condition` is the health machine's InstanceCondition JSON; `lease_*` stop two replicas from
  driving the same instance.
- `account_instances`: per account, the maxInstances summed over its live deployments (the
  instances quota's count, usage.py), maintained by `transitions` on deploy, rescale and
  undeploy so a deploy reads one row whatever the fleet.
- `autoscale_state`: the autoscaler's memory per deployment (samples, last request seen),
  compare-and-set by `revision`.
- `invocation_load` and `load_reporters`: the load signal the autoscaler reads, as the
  invocation replicas report it (load_signal.py): one row per (replica, version), current as
  of the replica's `reported_at`.
- `deployment_spec_revisions`: every accepted `configuration` (+ `helmValidationPolicy`) of a
  spec as a numbered revision with its validated objects, who accepted it and when. The spec's
  `revision` is the one its instances run once settled, `target_revision` the one they roll
  to (rollout.py); the spec's `configuration`/`helm_validation_policy`/`objects` are those of
  `target_revision` (what a new instance gets). Each instance records its `revision`.
- `deployment_events`: the timeline of `GET /deployments/{id}/events`. No foreign key: the
  timeline outlives its deployment, as history.
- `instance_last_logs`: the last lines of a failed instance's containers, kept with its failure
  so that "why did it fail" is answered after the instance was torn down (logs/keep.py). One
  row per failed instance (no foreign key: the row outlives the instance row, as the timeline
  does); `containers` is a list of `{pod, container, previous, lines}`, secret values already
  masked. Deleted with the deployment's history (history purge) or when the instance row is
  trimmed from the failed history.
- `deployment_history`: one row per removed deployment (its specifications and failed
  instances as the API showed them), readable until `expires_at`
  (`NVCF_HISTORY_RETENTION_SECONDS` after removal); the purge (`history.py`) then deletes it
  and its timeline.

`due_at` (indexed, on deployments and instances) is when the reconciler must look next: a
deployment is due from a change of desired state until it has settled (NULL once settled); an
instance is due for its next health check or resync. A pass reads only what is due, so the
cost of doing nothing does not grow with the fleet. Only `transitions/` and the reconciler's
store write these columns.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.core.db import Base, UTCDateTime, UUIDStr, utcnow

#: a due time that is already past on every clock: "look at it on the next pass"
ASAP = datetime(1970, 1, 1, tzinfo=UTC)


class DeploymentDesired(StrEnum):
    """What the owner wants of a deployment: running, or gone (rows stay until torn down)."""

    DEPLOYED = "deployed"
    DELETING = "deleting"


class InstanceDesired(StrEnum):
    """Whether an instance should exist (`absent` rows are torn down, then kept as history)."""

    PRESENT = "present"
    ABSENT = "absent"


class Deployment(Base):
    __tablename__ = "deployments"
    __table_args__ = (
        Index("ix_deployments_account_created", "account_id", "created_at", "id"),
        Index("ix_deployments_due_at", "due_at"),
        # At most one live deployment per version; rows being torn down ("deleting") may
        # linger while a new deployment of the same version starts.
        Index(
            "uq_deployments_live_version",
            "version_id",
            unique=True,
            sqlite_where=text("desired = 'deployed'"),
            postgresql_where=text("desired = 'deployed'"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    account_id: Mapped[str] = mapped_column(String(128))
    function_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), index=True)
    # No foreign key: a deleted version's deployment lives on until its instances are gone.
    version_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), index=True)
    function_name: Mapped[str] = mapped_column(String(128))
    desired: Mapped[str] = mapped_column(String(16), default=DeploymentDesired.DEPLOYED)
    # Workload-config feature flags (helm.md §4), e.g. {"StatusByWorkerReadiness": true}.
    feature_flags: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Bumped on every change of desired state; the reconciler compares it to skip idle work.
    generation: Mapped[int] = mapped_column(Integer, default=1)
    # Due for a unit of work from a change of desired state until settled (None).
    due_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=ASAP)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Graceful undeploy: when draining started (instances serve what they have, then go).
    drain_since: Mapped[datetime | None] = mapped_column(UTCDateTime())

    specs: Mapped[list[DeploymentSpec]] = relationship(
        back_populates="deployment",
        cascade="all, delete-orphan",
        passive_deletes=True,
        lazy="selectin",
        order_by="DeploymentSpec.position",
    )


#: a spec the autoscaler holds above its minimum (autoscaler/store.py `candidates` asks for
#: exactly these terms, so that its reading is an index read of those few)
ABOVE_MINIMUM = "target_instances IS NOT NULL AND target_instances > min_instances"


class DeploymentSpec(Base):
    __tablename__ = "deployment_specs"
    __table_args__ = (
        Index(
            "ix_deployment_specs_above_minimum",
            "deployment_id",
            sqlite_where=text(ABOVE_MINIMUM),
            postgresql_where=text(ABOVE_MINIMUM),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    deployment_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("deployments.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int] = mapped_column(Integer)
    gpu: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(128))
    backend: Mapped[str] = mapped_column(String(128))  # cluster group name
    clusters: Mapped[list[Any] | None] = mapped_column(JSON)
    regions: Mapped[list[Any] | None] = mapped_column(JSON)
    attributes: Mapped[list[Any] | None] = mapped_column(JSON)
    availability_zones: Mapped[list[Any] | None] = mapped_column(JSON)
    # Names of the candidate clusters resolved at deploy time, in placement order.
    candidate_clusters: Mapped[list[Any]] = mapped_column(JSON, default=list)
    min_instances: Mapped[int] = mapped_column(Integer)
    max_instances: Mapped[int] = mapped_column(Integer)
    max_request_concurrency: Mapped[int] = mapped_column(Integer, default=1)
    preferred_order: Mapped[int] = mapped_column(Integer, default=1)
    configuration: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    helm_validation_policy: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Validated objects (restricted and modified, before install-time mutations).
    objects: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # Instances created for the spec and how many of them failed: while the version is
    # DEPLOYING they decide between replacing a failure and ERROR (health/status.py).
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The autoscaler's desired instance count (None: minInstances); the reconciler converges
    # to it clamped to [min_instances, max_instances]. Written only by transitions/
    target_instances: Mapped[int | None] = mapped_column(Integer)
    # Held at zero instances while its account is suspended (accounts/); written only by
    # transitions/
    held: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    # The version's share (%) of its function's traffic split (100: no split); minInstances
    # counts in proportion (`floor_instances`). Written only by transitions/
    traffic_share: Mapped[int] = mapped_column(Integer, default=100, server_default="100")
    # NVCF's autoscalingConfigurationPolicy (None: PLATFORM_CONFIGURATION) and the custom
    # autoscalingConfiguration as given (API names), deployments/autoscale/policy.py.
    autoscaling_policy: Mapped[str | None] = mapped_column(String(32))
    autoscaling_configuration: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Revisions (deployment_spec_revisions): the one every instance runs once settled, the one
    # they roll to, and the last rollout's outcome (progressing | completed | failed).
    revision: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    target_revision: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    rollout_state: Mapped[str | None] = mapped_column(String(16))
    rollout_reason: Mapped[str | None] = mapped_column(Text)
    rollout_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    deployment: Mapped[Deployment] = relationship(back_populates="specs")

    @property
    def floor_instances(self) -> int:
        """The fewest instances kept: minInstances in proportion to the version's share of
        its function's traffic split, rounded up, and at least one while minInstances is (a
        canary at 5 % does not hold a fleet sized for all the traffic)."""
        share = self.traffic_share
        if share >= 100 or self.min_instances == 0:
            return self.min_instances
        return max(1, -(-self.min_instances * share // 100))

    @property
    def desired_instances(self) -> int:
        """How many instances the reconciler keeps: the autoscaler's target (the floor until
        it sets one), always within [floor, maxInstances]; none while held."""
        if self.held:
            return 0
        floor = self.floor_instances
        wanted = floor if self.target_instances is None else self.target_instances
        return max(floor, min(wanted, self.max_instances))


class AutoscaleState(Base):
    """The autoscaler's memory of one deployment (deployments/autoscaler/): utilisation samples
    since its last decision, when it last saw a request and since when its signal has been
    present. `revision` is compared and set by every write, so two replicas never both act on
    the same reading."""

    __tablename__ = "autoscale_state"

    deployment_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    version_id: Mapped[uuid.UUID] = mapped_column(UUIDStr())
    revision: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class SpecRevision(Base):
    """One accepted configuration of a spec: numbered from 1, kept while the spec lives."""

    __tablename__ = "deployment_spec_revisions"

    spec_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("deployment_specs.id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    configuration: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    helm_validation_policy: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    objects: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # Who accepted it: the principal's kind and subject (an API key id or a JWT subject).
    created_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Instance(Base):
    __tablename__ = "instances"
    __table_args__ = (
        Index("ix_instances_desired_lease", "desired", "lease_expires_at"),
        Index("ix_instances_due_at", "due_at"),
        # the time series recounts the versions whose instances were written since its
        # previous sample: a range of this index, not the table
        Index("ix_instances_updated_at", "updated_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    deployment_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("deployments.id", ondelete="CASCADE"), index=True
    )
    spec_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("deployment_specs.id", ondelete="CASCADE"), index=True
    )
    account_id: Mapped[str] = mapped_column(String(128))
    cluster: Mapped[str | None] = mapped_column(String(128))  # None until placed
    desired: Mapped[str] = mapped_column(String(16), default=InstanceDesired.PRESENT)
    applied: Mapped[bool] = mapped_column(Boolean, default=False)
    phase: Mapped[str] = mapped_column(String(32), default="Scheduling")
    reason: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[str | None] = mapped_column(Text)
    since: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    condition: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # When its lease owner must observe it next (health timer or resync); None when nothing
    # is scheduled (torn-down history).
    due_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=ASAP)
    # The generation of the version's secrets this instance's Secret holds.
    secrets_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # The spec revision it runs, and when it started draining (retired while Running: it
    # takes no new requests and is torn down once idle or after the drain timeout).
    revision: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    drain_since: Mapped[datetime | None] = mapped_column(UTCDateTime())


class DeploymentEvent(Base):
    __tablename__ = "deployment_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # No foreign key: the timeline of a removed deployment stays, with its DeploymentHistory
    # row, until the history purge deletes both.
    deployment_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # validation | dispatch | instance | observation | status | scaling | secrets | teardown
    kind: Mapped[str] = mapped_column(String(32))
    instance_id: Mapped[uuid.UUID | None] = mapped_column(UUIDStr())
    phase: Mapped[str | None] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text)


class DeploymentHistory(Base):
    """A removed deployment, kept readable until `expires_at` (then purged with its timeline).

    `specifications` and `failed_instances` are the API's GpuSpecificationOut and InstanceOut
    objects (camelCase JSON) as they were at removal: history is shown, never acted on.
    """

    __tablename__ = "deployment_history"
    __table_args__ = (
        # The purge reads only what has expired: one index probe when nothing has.
        Index("ix_deployment_history_expires_at", "expires_at"),
        # and the versions whose deployment was removed since then
        Index("ix_deployment_history_removed_at", "removed_at"),
        Index(
            "ix_deployment_history_account_version",
            "account_id",
            "version_id",
            "created_at",
            "id",
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)  # the deployment's
    account_id: Mapped[str] = mapped_column(String(128))
    function_id: Mapped[uuid.UUID] = mapped_column(UUIDStr())
    version_id: Mapped[uuid.UUID] = mapped_column(UUIDStr())
    function_name: Mapped[str] = mapped_column(String(128))
    specifications: Mapped[list[Any]] = mapped_column(JSON, default=list)
    failed_instances: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    removed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


class AccountInstances(Base):
    """The maxInstances of an account's live deployments, summed (usage.py)."""

    __tablename__ = "account_instances"

    account_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    deployed: Mapped[int] = mapped_column(Integer, default=0, nullable=False)


class LoadReporter(Base):
    """An invocation replica that reports its load (load_signal.py): its `invocation_load`
    rows are current as of `reported_at`."""

    __tablename__ = "load_reporters"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    reported_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ReportedLoad(Base):
    """One replica's load of one function version, as of its reporter's `reported_at`:
    requests in flight (averaged since its previous report), waiting now, and its last
    accepted request."""

    __tablename__ = "invocation_load"
    __table_args__ = (Index("ix_invocation_load_version_id", "version_id"),)

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    version_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    in_flight: Mapped[float] = mapped_column(Float, default=0.0)
    waiting: Mapped[int] = mapped_column(Integer, default=0)
    last_request_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    sampled_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class KeptLog(Base):
    __tablename__ = "instance_last_logs"

    instance_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    deployment_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), index=True)
    account_id: Mapped[str] = mapped_column(String(128))
    captured_at: Mapped[datetime] = mapped_column(UTCDateTime())
    containers: Mapped[list[Any]] = mapped_column(JSON, default=list)


class TrafficWeight(Base):
    """One version's share of a function's traffic split (traffic.py): the invocations that
    name no version go to the split's versions by weight; no rows, the newest invocable
    version takes them all."""

    __tablename__ = "function_traffic"

    function_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("functions.id", ondelete="CASCADE"), primary_key=True
    )
    version_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("function_versions.id", ondelete="CASCADE"), primary_key=True
    )
    weight: Mapped[int] = mapped_column(Integer)


class CanaryRelease(Base):
    """A canary release of a function's version (canary.py, transitions/canary.py): its plan,
    where it stands (`phase`, `step`, since `step_started_at`) and the figures and reason of
    its last decision. `active_function_id` is the function's id while the release runs or is
    paused, NULL once it ended: unique, so a function has at most one release under way.
    `revision` is compared and set by every write (two replicas never both advance a step)."""

    __tablename__ = "canary_releases"

    id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True, default=uuid.uuid4)
    function_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("functions.id", ondelete="CASCADE"), index=True
    )
    active_function_id: Mapped[uuid.UUID | None] = mapped_column(UUIDStr(), unique=True)
    canary_version_id: Mapped[uuid.UUID] = mapped_column(UUIDStr())
    stable_version_id: Mapped[uuid.UUID] = mapped_column(UUIDStr())
    plan: Mapped[dict[str, Any]] = mapped_column(JSON)
    undeploy_on_rollback: Mapped[bool] = mapped_column(Boolean, default=False)
    phase: Mapped[str] = mapped_column(String(16))
    step: Mapped[int] = mapped_column(Integer, default=0)
    step_started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revision: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str | None] = mapped_column(Text)
    analysis: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_by: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class CanaryFigures(Base):
    """What one replica (`owner`) measured of one version during one step of a release: the
    requests, those that failed and their latencies as bucket counts (canary_figures.py). Only
    the owner writes its rows; the release's decision sums them over the replicas."""

    __tablename__ = "canary_figures"

    release_id: Mapped[uuid.UUID] = mapped_column(
        UUIDStr(), ForeignKey("canary_releases.id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    version_id: Mapped[uuid.UUID] = mapped_column(UUIDStr(), primary_key=True)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[int] = mapped_column(Integer, default=0)
    latency: Mapped[list[int]] = mapped_column(JSON, default=list)
