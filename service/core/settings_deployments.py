"""The deployments' settings (a part of `Settings`, service/core/settings.py): the reconciler,
the history of removed deployments, instance logs, the autoscaler, instance health."""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.core.settings_platform import CommaList


class DeploymentSettings(BaseModel):
    # -- the reconciler (service/deployments/reconcile/)
    reconciler_enabled: bool = Field(
        default=True, description="Run the reconciler in this process."
    )
    tasks_interval: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between the task loop's passes (placement of queued tasks, "
        "progress, clocks); creating or canceling a task runs one at once.",
    )
    reconcile_interval: float = Field(
        default=2.0,
        gt=0,
        description="Seconds between reconciler passes (it also wakes on every change).",
    )
    reconcile_lease_seconds: float = Field(
        default=60.0, gt=0, description="Seconds a replica's claim on a deployment lasts."
    )
    reconcile_resync_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="Safety net: a Running instance with no timer pending is observed again "
        "this often even when its cluster reported no change of it (clusters report changes: "
        "the Kubernetes watch, the simulated timeline), at a slot of its own so the fleet's "
        "resyncs are spread evenly over the period; every instance is also observed at "
        "start-up and after a cluster's watch was re-established.",
    )
    reconcile_concurrency: int = Field(
        default=8, ge=1, le=256, description="Backend calls in flight at once."
    )
    reconcile_batch_size: int = Field(
        default=50,
        ge=1,
        le=1000,
        description="Deployments claimed and finished together in one unit of work (one "
        "transaction each).",
    )
    reconcile_deploy_attempts: int = Field(
        default=3,
        ge=1,
        le=100,
        description="While a version is DEPLOYING: instances tried per instance of a "
        "specification's minInstances (the first and the replacements of failed ones). The "
        "version goes to ERROR once as many instances as the minimum have failed with none "
        "left, or once a specification is out of attempts below its minimum.",
    )
    reconcile_gc_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="Seconds between collections of orphaned instance namespaces, a safety "
        "net that reads every instance id (0: off).",
    )
    reconcile_gc_timeout_seconds: float = Field(
        default=60.0, gt=0, description="Seconds one garbage collection round may take."
    )
    reconcile_gc_min_age_seconds: float = Field(
        default=120.0, ge=0, description="Namespaces younger than this are never collected."
    )
    drain_timeout_seconds: float = Field(
        default=300.0,
        ge=0,
        description="Seconds an instance being removed (rolling update, scale-down, "
        "`DELETE ...?graceful=true`) may take to finish its requests in flight (and, for a "
        "graceful undeploy, those queued) before it is torn down anyway.",
    )
    # -- history of removed deployments (service/deployments/history.py)
    history_retention_seconds: float = Field(
        default=7 * 86400.0,
        ge=0,
        description="Seconds a removed deployment stays readable after its removal (its "
        "timeline at `GET /v2/nvcf/deployments/{id}/events`, its failed instances, the "
        "version's `.../history`); then it is purged. 0 keeps no history.",
    )
    history_purge_seconds: float = Field(
        default=600.0,
        ge=0,
        description="Seconds between purges of expired deployment history (0: off), in a "
        "process that runs the reconciler.",
    )
    admin_token_networks: CommaList = Field(
        default=frozenset(),
        description="Comma list of CIDRs (e.g. `10.0.0.0/8`) whose clients get a management "
        "token for the default account from `POST /v1/admin/keys`, and revoke its non-operator "
        "keys with `DELETE /v1/keys/{id}`, without a credential, as NVCF's admin-issuer proxy "
        "inside a cluster (for `nvcf-cli init` and `api-key delete`); empty: a credential with "
        "scope `admin` is always needed. Behind a reverse proxy (nginx, a cluster ingress) "
        "every caller has the proxy's internal address: never list the proxy's network. A "
        "request carrying a proxy header (`Forwarded`, `X-Forwarded-For`, `X-Real-IP`, ...) "
        "is refused without a credential (401) whatever its address.",
    )
    timeseries_period_seconds: float = Field(
        default=10.0,
        ge=0,
        description="Seconds between samples of each function version's requests, latency, "
        "queue depth and instances kept for an hour for the console's charts "
        "(`GET .../versions/{id}/metrics`; this replica's counts); 0: off.",
    )
    # -- instance logs (service/deployments/logs/, docs/logs.md)
    logs_max_tail_lines: int = Field(
        default=10_000,
        gt=0,
        description="Most lines `GET .../logs` returns per container (`tailLines` may ask "
        "fewer; without it, this many of the last).",
    )
    logs_max_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        description="Most bytes one `GET .../logs` answer carries (a follow ends, with a note "
        "line, once it has sent this many).",
    )
    logs_max_follows_per_account: int = Field(
        default=4,
        ge=1,
        description="Log follows (`follow=true`) one account may have open at once in one "
        "server process; one more is answered 429.",
    )
    logs_follow_max_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="Longest a log follow stays open; then it ends (the caller may follow again).",
    )
    logs_kept_lines: int = Field(
        default=200,
        ge=0,
        description="Last lines of each container kept when an instance fails (shown after it "
        "was torn down), when a container of a Running instance restarts, or as a task's "
        "objects leave its cluster; 0 keeps none.",
    )
    logs_kept_bytes: int = Field(
        default=64 * 1024,
        gt=0,
        description="Most bytes of the last lines kept per container (a failure's or a restart's).",
    )
    # -- the autoscaler (service/deployments/autoscaler/, docs/autoscaling.md)
    autoscale_enabled: bool = Field(
        default=True,
        description="Run the autoscaler in this process (where the reconciler runs; several "
        "replicas may run it: each decision is taken under the deployment's row lock).",
    )
    autoscale_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between the autoscaler's readings of the load (it also wakes at "
        "once for a request queued on a version with no Running instance).",
    )
    canary_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between two readings of a canary release (docs/rollouts.md): each "
        "invocation replica adds what it measured of the release's versions to the step's "
        "figures, and the release is decided on them, this often.",
    )
    autoscale_window_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Seconds over which utilisation is averaged before it is compared with a "
        "threshold (samples since the last decision, at most this old).",
    )
    autoscale_idle_seconds: float = Field(
        default=1800.0,
        ge=0,
        description="A GPU specification with `minInstances: 0` goes to zero instances after "
        "this many seconds without a request, its utilisation below the scale-down threshold "
        "and its load signal present all along.",
    )
    autoscale_up_stickiness_seconds: float = Field(
        default=30.0,
        ge=0,
        description="Platform policy: seconds utilisation must stay above the scale-up "
        "threshold before the instance count grows (the stickiness threshold; the window is "
        "twice as long).",
    )
    autoscale_down_stickiness_seconds: float = Field(
        default=120.0,
        ge=0,
        description="Platform policy: seconds utilisation must stay below the scale-down "
        "threshold before the instance count shrinks (the stickiness threshold; the window is "
        "twice as long).",
    )
    autoscale_load_report_seconds: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between an invocation replica's reports of its per-version load "
        "to the database (also at once when a request waits for a version with no instance).",
    )
    autoscale_load_stale_seconds: float = Field(
        default=15.0,
        gt=0,
        description="A replica whose last load report is older than this has no signal: the "
        "autoscaler holds every version's count rather than read it as zero load.",
    )
    # -- instance health (docs/health.md)
    health_pod_scheduling_timeout: float = Field(
        default=600, ge=0, description="Seconds a pod may stay unschedulable."
    )
    health_image_pull_timeout: float = Field(
        default=60,
        ge=0,
        description="Seconds an image pull (or container creation) may keep failing.",
    )
    health_restart_loop_timeout: float = Field(
        default=600, ge=0, description="Seconds a container may keep restarting."
    )
    health_init_timeout: float = Field(
        default=7200, ge=0, description="Seconds init containers (or a Pending pod) may take."
    )
    health_worker_startup_timeout: float = Field(
        default=7200, ge=0, description="Seconds a worker may take to become ready."
    )
    health_worker_degradation_period: float = Field(
        default=1800, ge=0, description="Seconds a worker that was ready may stay not ready."
    )
    health_pending_timeout: float = Field(
        default=10800, ge=0, description="Seconds an instance may take to be Running at all."
    )
    health_failing_backoff: float = Field(
        default=90, ge=0, description="Seconds a failing object may recover before it fails."
    )
