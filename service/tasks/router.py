"""HTTP routes of tasks at NVCT's paths (`/v1/nvct/...`) and scopes (the @PreAuthorize of
its REST layer); thin: parse, authorize, call one use case, render. `DELETE` and the secrets
update answer 204 with an empty body, as NVCT does."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse

from service.auth import scopes
from service.auth.deps import Session, require
from service.auth.service import Principal
from service.clusters.deps import AdaptersDep
from service.core.deps import SettingsDep
from service.core.http import inline_body_doc, parse_uuid, read_json
from service.core.pagination import Limit
from service.deployments.logs.deps import LogFollowsDep
from service.deployments.logs.router import LOG_TEXT, LogQuery, log_answer
from service.tasks.deps import tasks_of
from service.tasks.logs import task_reading
from service.tasks.schemas import (
    BulkTasksIn,
    CreateTaskIn,
    ListBasicTasksResponse,
    ListEventsResponse,
    ListGpuUsageResponse,
    ListResultsResponse,
    ListTasksResponse,
    TaskResponse,
    UpdateSecretsIn,
)
from service.tasks.service import basic, event_out, result_out

router = APIRouter(tags=["tasks"])
_ID = "taskId"


Launcher = Annotated[Principal, Depends(require(scopes.LAUNCH_TASK))]
Lister = Annotated[Principal, Depends(require(scopes.LIST_TASKS))]
Reader = Annotated[Principal, Depends(require(scopes.TASK_DETAILS))]
Canceler = Annotated[Principal, Depends(require(scopes.CANCEL_TASK))]
Deleter = Annotated[Principal, Depends(require(scopes.DELETE_TASK))]
EventReader = Annotated[Principal, Depends(require(scopes.LIST_EVENTS))]
ResultReader = Annotated[Principal, Depends(require(scopes.LIST_RESULTS))]
SecretWriter = Annotated[Principal, Depends(require(scopes.UPDATE_SECRETS))]
UsageReader = Annotated[Principal, Depends(require(scopes.LAUNCH_TASK, scopes.LIST_TASKS))]
Cursor = Annotated[str | None, Query(max_length=1024)]


@router.post(
    "/tasks",
    response_model=TaskResponse,
    response_model_exclude_none=True,
    openapi_extra=inline_body_doc(CreateTaskIn),
    summary="Create a task: it is queued, then launched where its GPUs are free",
)
async def create_task(request: Request, session: Session, principal: Launcher) -> TaskResponse:
    tasks = tasks_of(request)
    task = await tasks.create(session, principal.account_id, await read_json(request))
    return TaskResponse(task=tasks.describe(task))


@router.get(
    "/tasks",
    response_model=ListTasksResponse,
    response_model_exclude_none=True,
    summary="List the account's tasks, oldest first (limit and cursor: NVCT's pagination)",
)
async def list_tasks(
    request: Request,
    session: Session,
    principal: Lister,
    limit: Limit = None,
    cursor: Cursor = None,
    status: Annotated[str | None, Query(max_length=64)] = None,
) -> ListTasksResponse:
    tasks = tasks_of(request)
    rows, page_limit, next_cursor = await tasks.page(
        session, principal.account_id, limit, cursor, status
    )
    return ListTasksResponse(
        tasks=[tasks.describe(t) for t in rows], limit=page_limit, cursor=next_cursor
    )


@router.post(
    "/tasks/bulk",
    response_model=ListBasicTasksResponse,
    openapi_extra=inline_body_doc(BulkTasksIn),
    summary="Id, name and status of the given tasks of the account (others are left out)",
)
async def bulk_tasks(
    request: Request, session: Session, principal: Lister
) -> ListBasicTasksResponse:
    rows = await tasks_of(request).bulk(session, principal.account_id, await read_json(request))
    return ListBasicTasksResponse(nca_id=principal.account_id, tasks=[basic(t) for t in rows])


@router.get(
    "/tasks/{taskId}",
    response_model=TaskResponse,
    response_model_exclude_none=True,
    summary="Show a task; its secrets' names only with includeSecrets=true",
)
async def get_task(
    taskId: str,
    request: Request,
    session: Session,
    principal: Reader,
    includeSecrets: bool = False,
) -> TaskResponse:
    tasks = tasks_of(request)
    task = await tasks.owned(session, principal.account_id, parse_uuid(taskId, _ID))
    return TaskResponse(task=tasks.describe(task, include_secrets=includeSecrets))


@router.post(
    "/tasks/{taskId}/cancel",
    response_model=TaskResponse,
    response_model_exclude_none=True,
    summary="Cancel a task: its container is asked to stop, and killed after the grace period",
)
async def cancel_task(
    taskId: str, request: Request, session: Session, principal: Canceler
) -> TaskResponse:
    tasks = tasks_of(request)
    task = await tasks.cancel(session, principal.account_id, parse_uuid(taskId, _ID))
    return TaskResponse(task=tasks.describe(task))


@router.delete(
    "/tasks/{taskId}",
    status_code=204,
    response_class=Response,
    summary="Delete a task (a running one is canceled first, within its grace period)",
)
async def delete_task(
    taskId: str, request: Request, session: Session, principal: Deleter
) -> Response:
    await tasks_of(request).delete(session, principal.account_id, parse_uuid(taskId, _ID))
    return Response(status_code=204)


@router.get(
    "/tasks/{taskId}/events",
    response_model=ListEventsResponse,
    response_model_exclude_none=True,
    summary="The task's timeline, oldest first",
)
async def task_events(
    taskId: str,
    request: Request,
    session: Session,
    principal: EventReader,
    limit: Limit = None,
    cursor: Cursor = None,
) -> ListEventsResponse:
    rows, page_limit, next_cursor = await tasks_of(request).events(
        session, principal.account_id, parse_uuid(taskId, _ID), limit, cursor
    )
    return ListEventsResponse(
        events=[event_out(e) for e in rows], limit=page_limit, cursor=next_cursor
    )


@router.get(
    "/tasks/{taskId}/logs",
    response_class=StreamingResponse,
    responses=LOG_TEXT,
    summary="What the task's containers print (live, or the last lines kept when it ended)",
    description="Read as an instance's log (`GET /v2/nvcf/deployments/{deploymentId}/instances"
    "/{instanceId}/logs`: the same query parameters, bounds and answer). NVCT has no logs "
    "route: this one is the project's own. A task that ended and left the cluster answers the "
    "last lines of its containers, kept as they left. The task's secret values are masked.",
)
async def task_logs(
    taskId: str,
    request: Request,
    session: Session,
    principal: Reader,
    query: LogQuery,
    settings: SettingsDep,
    adapters: AdaptersDep,
    follows: LogFollowsDep,
) -> StreamingResponse:
    reading = await task_reading(
        session, tasks_of(request), adapters, principal.account_id, parse_uuid(taskId, _ID), query
    )
    return await log_answer(follows, settings, reading, principal.account_id)


@router.get(
    "/tasks/{taskId}/results",
    response_model=ListResultsResponse,
    response_model_exclude_none=True,
    summary="The results the task reported by name (with UPLOAD: where each was pushed)",
)
async def task_results(
    taskId: str,
    request: Request,
    session: Session,
    principal: ResultReader,
    limit: Limit = None,
    cursor: Cursor = None,
) -> ListResultsResponse:
    rows, page_limit, next_cursor = await tasks_of(request).results(
        session, principal.account_id, parse_uuid(taskId, _ID), limit, cursor
    )
    return ListResultsResponse(
        results=[result_out(r) for r in rows], limit=page_limit, cursor=next_cursor
    )


@router.put(
    "/secrets/tasks/{taskId}",
    status_code=204,
    response_class=Response,
    openapi_extra=inline_body_doc(UpdateSecretsIn),
    summary="Add or replace secrets of a task by name; a running container reads them in place",
)
async def update_task_secrets(
    taskId: str, request: Request, session: Session, principal: SecretWriter
) -> Response:
    await tasks_of(request).update_secrets(
        session, principal.account_id, parse_uuid(taskId, _ID), await read_json(request)
    )
    return Response(status_code=204)


@router.get(
    "/accounts/{ncaId}/usage/gpus",
    response_model=ListGpuUsageResponse,
    summary="GPUs the account's queued, launched and running tasks use, per cluster",
)
async def gpu_usage(
    ncaId: str, request: Request, session: Session, principal: UsageReader
) -> ListGpuUsageResponse:
    gpus = await tasks_of(request).usage(session, principal.account_id, ncaId)
    return ListGpuUsageResponse(gpus=gpus)
