"""The one writer of deployment state (runtime.md §3, §6).

Every change of an instance's phase or condition, of desired state (deployment or instance),
of a function version's status, and the removal of a deployment goes through a function here;
each writes the row change and its timeline event together, in the caller's session (callers
flush or commit). The API service (create, scale, undeploy, version delete) and the reconciler
both use it, so the timeline reads the same whoever made the change. The decisions themselves
(which phase, which status) are pure functions in `service.health`.

One module per aggregate: `status.py` (a version's status), `deployment.py`, `instance.py`,
`rollout.py`, `canary.py` (a canary release), `traffic.py` (a split's shares); callers use
the names this package exports (`transitions.deploy`, ...).
"""

from service.deployments.transitions.canary import (
    UNDER_WAY,
    analysis_of,
    decided,
    plan_of,
    start_canary,
    state_of,
    weight_of,
    write_state,
)
from service.deployments.transitions.deployment import (
    deploy,
    hold_account,
    remove_deployment,
    rescale,
    schedule,
    secrets_changed,
    secrets_delivered,
    set_targets,
    settle,
    undeploy,
)
from service.deployments.transitions.instance import (
    count_failure,
    create_instance,
    observe_instance,
    place_instances,
    retire_instance,
    schedule_instance,
    torn_down,
    unwant,
)
from service.deployments.transitions.rollout import (
    rollout_completed,
    rollout_failed,
    rollout_progressed,
    start_rollout,
)
from service.deployments.transitions.status import (
    StatusChange,
    set_version_status,
    set_version_statuses,
    status_message,
    status_of,
)
from service.deployments.transitions.traffic import set_split

__all__ = [
    "UNDER_WAY",
    "StatusChange",
    "analysis_of",
    "count_failure",
    "create_instance",
    "decided",
    "deploy",
    "hold_account",
    "observe_instance",
    "place_instances",
    "plan_of",
    "remove_deployment",
    "rescale",
    "retire_instance",
    "rollout_completed",
    "rollout_failed",
    "rollout_progressed",
    "schedule",
    "schedule_instance",
    "secrets_changed",
    "secrets_delivered",
    "set_split",
    "set_targets",
    "set_version_status",
    "set_version_statuses",
    "settle",
    "start_canary",
    "start_rollout",
    "state_of",
    "status_message",
    "status_of",
    "torn_down",
    "undeploy",
    "unwant",
    "weight_of",
    "write_state",
]
