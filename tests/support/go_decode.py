"""Decode JSON as Go's `encoding/json` decodes it into NVIDIA nvcf-cli's structs, to check that
the CLI can read a response (a field of the wrong JSON kind fails its whole decode: `secrets`
as objects once broke `nvcf-cli function list` for an account).

The descriptions below follow `src/clis/nvcf-cli/internal/client/client.go` in NVIDIA/nvcf: a
struct is a dict of JSON field name to shape; `str`, `int`, `float`, `bool`, `ANY`
(`interface{}`), `ListOf(shape)` (a slice), `MapOf(shape)` (a map with string keys). As in Go,
object keys match field names ignoring case (an exact match first), unknown keys are ignored,
`null` leaves any field at its zero value, and an `int` field takes only a JSON integer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class _Any:
    def __repr__(self) -> str:
        return "interface{}"


ANY = _Any()


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class MapOf:
    value: Any


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def go_decode_errors(doc: Any, shape: Any, path: str = "$") -> list[str]:
    """Why Go would refuse to decode `doc` into `shape` (empty: it decodes)."""
    if doc is None or shape is ANY:
        return []
    if shape is bool:
        ok = isinstance(doc, bool)
    elif shape is int:
        ok = isinstance(doc, int) and not isinstance(doc, bool)
    elif shape is float:
        ok = isinstance(doc, int | float) and not isinstance(doc, bool)
    elif shape is str:
        ok = isinstance(doc, str)
    elif isinstance(shape, ListOf):
        if not isinstance(doc, list):
            return [f"{path}: cannot unmarshal {_kind(doc)} into a slice"]
        return [
            e for i, v in enumerate(doc) for e in go_decode_errors(v, shape.item, f"{path}[{i}]")
        ]
    elif isinstance(shape, MapOf):
        if not isinstance(doc, dict):
            return [f"{path}: cannot unmarshal {_kind(doc)} into a map"]
        return [e for k, v in doc.items() for e in go_decode_errors(v, shape.value, f"{path}.{k}")]
    elif isinstance(shape, dict):
        if not isinstance(doc, dict):
            return [f"{path}: cannot unmarshal {_kind(doc)} into a struct"]
        errors: list[str] = []
        for key, value in doc.items():
            name = (
                key if key in shape else next((n for n in shape if n.lower() == key.lower()), None)
            )
            if name is not None:
                errors += go_decode_errors(value, shape[name], f"{path}.{name}")
        return errors
    else:
        raise TypeError(f"unknown shape {shape!r}")
    return [] if ok else [f"{path}: cannot unmarshal {_kind(doc)} into {shape.__name__}"]


def assert_go_decodes(doc: Any, shape: Any) -> None:
    errors = go_decode_errors(doc, shape)
    assert not errors, errors


# --- nvcf-cli's structs (internal/client/client.go) ---------------------------------------

HEALTH_DTO = {"protocol": str, "uri": str, "port": int, "timeout": str, "expectedStatusCode": int}
CONTAINER_ENVIRONMENT_ENTRY = {"key": str, "value": str}
LLM_CONFIG_DTO = {"uris": ListOf(str), "tokenRateLimit": str, "routingMethod": str}
ARTIFACT_DTO = {"name": str, "version": str, "uri": str, "llmConfig": LLM_CONFIG_DTO}
RATE_LIMIT_DTO = {"rateLimit": str, "exemptedNcaIds": ListOf(str), "syncCheck": bool}

#: `FunctionDto`: `function list`, `function versions` and `function get` decode into it
FUNCTION_DTO = {
    "id": str,
    "ncaId": str,
    "versionId": str,
    "name": str,
    "status": str,
    "inferenceUrl": str,
    "ownedByDifferentAccount": bool,
    "inferencePort": int,
    "containerArgs": str,
    "containerEnvironment": ListOf(CONTAINER_ENVIRONMENT_ENTRY),
    "containerImage": str,
    "apiBodyFormat": str,
    "helmChart": str,
    "helmChartServiceName": str,
    "healthUri": str,
    "createdAt": str,
    "tags": ListOf(str),
    "description": str,
    "health": HEALTH_DTO,
    "functionType": str,
    "secrets": ListOf(str),
    "rateLimit": RATE_LIMIT_DTO,
    "models": ListOf(ARTIFACT_DTO),
}
LIST_FUNCTIONS_RESPONSE = {"functions": ListOf(FUNCTION_DTO)}
LIST_FUNCTION_IDS_RESPONSE = {"functionIds": ListOf(str)}
#: `GetFunctionDetails` decodes `{"function": FunctionDto}`
FUNCTION_DETAILS_WRAPPER = {"function": FUNCTION_DTO}

#: `CreateFunctionResponse`
CREATE_FUNCTION_RESPONSE = {
    "function": {
        "id": str,
        "versionId": str,
        "name": str,
        "status": str,
        "inferenceUrl": str,
        "inferencePort": int,
        "containerImage": str,
        "creationTime": str,
    }
}
#: `GetFunctionResponse` (`GetFunction`, polled by `WaitForFunctionDeployment`)
GET_FUNCTION_RESPONSE = {
    "function": {
        "id": str,
        "versionId": str,
        "name": str,
        "status": str,
        "inferenceUrl": str,
        "inferencePort": int,
        "containerImage": str,
        "creationTime": str,
        "activeInstances": ListOf(
            {"instanceId": str, "instanceType": str, "gpu": str, "status": str}
        ),
        "health": {"status": str},
    }
}

GPU_SPECIFICATION_DTO = {
    "gpuSpecificationId": str,
    "gpu": str,
    "instanceType": str,
    "minInstances": int,
    "maxInstances": int,
    "backend": str,
    "availabilityZones": ListOf(str),
    "maxRequestConcurrency": int,
    "configuration": MapOf(ANY),
    "clusters": ListOf(str),
    "regions": ListOf(str),
    "attributes": ListOf(str),
    "preferredOrder": int,
    "cpuArch": str,
    "os": str,
    "driverVersion": str,
    "storage": str,
    "systemMemory": str,
    "gpuMemory": str,
}
#: `DeploymentResponse` (`GetDeployment`, `deploy update` reads the spec ids from it)
DEPLOYMENT_RESPONSE = {
    "deployment": {
        "functionId": str,
        "functionVersionId": str,
        "deploymentId": str,
        "functionName": str,
        "ncaId": str,
        "functionStatus": str,
        "requestQueueUrl": str,
        "healthInfo": ListOf({"status": str, "message": str, "reason": str}),
        "deploymentSpecifications": ListOf(GPU_SPECIFICATION_DTO),
        "createdAt": str,
        "lastUpdatedAt": str,
        "status": str,
        "creationTime": str,
    }
}
UPDATE_GPU_SPECIFICATION_RESPONSE = {"gpuSpecification": GPU_SPECIFICATION_DTO}
CLUSTER_GROUPS_RESPONSE = {
    "clusterGroups": ListOf(
        {
            "id": str,
            "name": str,
            "ncaId": str,
            "authorizedNcaIds": ListOf(str),
            "gpus": ListOf({"name": str}),
            "clusters": ListOf({"id": str, "name": str}),
        }
    )
}


# --- nvcf-cli's task structs (internal/client/tasks.go) -----------------------------------

NVCT_GPU_SPECIFICATION_DTO = {
    "gpu": str,
    "backend": str,
    "clusters": ListOf(str),
    "instanceType": str,
    "configuration": MapOf(ANY),
    "helmValidationPolicy": {
        "name": str,
        "extraKubernetesTypes": ListOf({"group": str, "version": str, "kind": str}),
    },
}
NVCT_INSTANCE_DTO = {
    "instanceId": str,
    "taskId": str,
    "instanceType": str,
    "instanceState": str,
    "icmsRequestId": str,
    "ncaId": str,
    "gpu": str,
    "backend": str,
    "location": str,
    "instanceCreatedAt": str,
    "instanceUpdatedAt": str,
}
TELEMETRIES_DTO = {"logsTelemetryId": str, "metricsTelemetryId": str, "tracesTelemetryId": str}
#: `TaskDto`: create, list, get and cancel decode into it
TASK_DTO = {
    "id": str,
    "ncaId": str,
    "name": str,
    "status": str,
    "gpuSpecification": NVCT_GPU_SPECIFICATION_DTO,
    "containerImage": str,
    "containerArgs": str,
    "containerEnvironment": ListOf(CONTAINER_ENVIRONMENT_ENTRY),
    "models": ListOf(ARTIFACT_DTO),
    "resources": ListOf(ARTIFACT_DTO),
    "tags": ListOf(str),
    "description": str,
    "resultHandlingStrategy": str,
    "resultsLocation": str,
    "maxRuntimeDuration": str,
    "maxQueuedDuration": str,
    "terminationGracePeriodDuration": str,
    "helmChart": str,
    "healthInfo": HEALTH_DTO,
    "secrets": ListOf(str),
    "percentComplete": int,
    "lastHeartbeatAt": str,
    "lastUpdatedAt": str,
    "telemetries": TELEMETRIES_DTO,
    "createdAt": str,
    "instances": ListOf(NVCT_INSTANCE_DTO),
}
TASK_RESPONSE = {"task": TASK_DTO}
LIST_TASKS_RESPONSE = {"tasks": ListOf(TASK_DTO), "limit": int, "cursor": str}
LIST_BASIC_TASK_DETAILS_RESPONSE = {
    "ncaId": str,
    "tasks": ListOf({"id": str, "name": str, "status": str}),
}
LIST_TASK_EVENTS_RESPONSE = {
    "events": ListOf(
        {"eventId": str, "taskId": str, "ncaId": str, "message": str, "createdAt": str}
    ),
    "limit": int,
    "cursor": str,
}
LIST_TASK_RESULTS_RESPONSE = {
    "results": ListOf(
        {
            "resultId": str,
            "taskId": str,
            "ncaId": str,
            "name": str,
            "metadata": MapOf(ANY),
            "createdAt": str,
        }
    ),
    "limit": int,
    "cursor": str,
}
_GPU_PLACEMENT_DTO = {
    "clusterId": str,
    "cluster": str,
    "clusterGroupId": str,
    "clusterGroup": str,
    "cloudProvider": str,
    "region": str,
    "currentMaxUsage": int,
    "currentMinUsage": int,
}
LIST_GPU_USAGE_RESPONSE = {
    "gpus": ListOf(
        {
            "gpu": str,
            "instanceType": str,
            "currentMaxUsage": int,
            "currentMinUsage": int,
            "placements": ListOf(_GPU_PLACEMENT_DTO),
        }
    )
}

# --- nvcf-cli's admin accounts (internal/client/accounts.go) --------------------------------

ACCOUNT_DTO = {
    "ncaId": str,
    "adminClientIds": ListOf(str),
    "name": str,
    "maxFunctionsAllowed": int,
    "maxTasksAllowed": int,
    "maxTelemetriesAllowed": int,
    "maxRegistryCredentialsAllowed": int,
}
LIST_ACCOUNTS_RESPONSE = {"cloudAccounts": ListOf(ACCOUNT_DTO)}
ACCOUNT_RESPONSE = {"account": ACCOUNT_DTO}
