"""A small Kubernetes API server for tests (operations.md §4: no real cluster runs here).

`FakeKubernetes` serves the REST API on 127.0.0.1 from a thread, for the verbs the kubernetes
adapter uses: server-side apply (`PATCH` with `application/apply-patch+yaml`: create or merge,
bumping `resourceVersion` only when the applied configuration changes), `GET`, `LIST` (label
and field selectors, list `resourceVersion`, items without `kind`/`apiVersion` as a real server
sends them), `DELETE` (a namespace goes `Terminating` first and disappears on a later `GET`) and
the discovery documents, and WATCH (`?watch=true` on a list path: a chunked stream of
`{"type", "object"}` lines from `resourceVersion` on — every existing object as ADDED when it
is not given — ended cleanly at `timeoutSeconds`; a version older than the last
`compact()` answers 410 Gone as etcd compaction does, and `drop_watches()` cuts every open
stream mid-body, as a lost connection). Every request must carry the bearer token of the
kubeconfig the server writes. Failures are real `Status` objects.

There are no controllers: tests play them by adding objects (`add_object`: pods, ReplicaSets,
events, nodes) and setting statuses (`set_status`), usually from the `kubectl get -o json`
fixtures in `k8s_fixtures/`. `inject_error` makes a path fail with a given Status and `hold`
makes it hang (for client timeouts). `requests` records every request in arrival order.

The service proxy (`/api/v1/namespaces/<ns>/services/<name>:<port>/proxy/...`) forwards to the
address `serve_endpoint` registered for that Service and port, as the API server forwards to a
ready pod; a Service without one answers 503 "no endpoints available", as a real one does. The
pod proxy (`.../pods/<name>:<port>/proxy/...`) forwards to the address `serve_pod` registered.

The Job controller and the kubelet of a Job's pod are played on demand: `start_job` creates the
pod from the Job's template (labels `job-name`, owner reference, Job `active`), `run_job_pod`
starts its containers (a native sidecar among its initContainers too), `finish_job` ends the
task container with an exit code (`lingering=True`: the sidecar is still in its `preStop`
hook, the pod still runs; else 0: pod `Succeeded`, Job `Complete`; else pod `Failed`, Job
`Failed` with `BackoffLimitExceeded`; `oom=True`: terminated `OOMKilled`, exit 137), and
`exceed_job_deadline` fails the Job with `DeadlineExceeded` and removes its pod, as the
controller does when `activeDeadlineSeconds` passes.

The pod log subresource (`GET .../pods/<pod>/log`) serves what tests wrote with `write_log`
(per container; `previous=True` for the run before a restart), with `container`, `previous`,
`tailLines`, `sinceSeconds`, `timestamps` and `limitBytes` as the kubelet applies them and the
API server's 400s (no container named in a pod of several, a container not yet started, no
previous run). `follow=true` streams the lines as they are written (a close-delimited body)
until `end_log` (the container exited), the pod is removed, or the server stops.
"""

from __future__ import annotations

import copy
import http.client
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

FIXTURES = Path(__file__).parent / "k8s_fixtures"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"


def fixture(name: str) -> dict[str, Any]:
    """A `kubectl get -o json` fixture from `k8s_fixtures/` (a fresh copy)."""
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """How error messages name the resource: `deployments.apps`, `pods`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "namespaces", "Namespace", namespaced=False),
    Resource("", "v1", "nodes", "Node", namespaced=False),
    Resource("", "v1", "pods", "Pod"),
    Resource("", "v1", "services", "Service"),
    Resource("", "v1", "configmaps", "ConfigMap"),
    Resource("", "v1", "secrets", "Secret"),
    Resource("", "v1", "serviceaccounts", "ServiceAccount"),
    Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
    Resource("", "v1", "events", "Event"),
    Resource("apps", "v1", "deployments", "Deployment"),
    Resource("apps", "v1", "replicasets", "ReplicaSet"),
    Resource("apps", "v1", "statefulsets", "StatefulSet"),
    Resource("batch", "v1", "jobs", "Job"),
    Resource("batch", "v1", "cronjobs", "CronJob"),
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    Resource("resource.nvidia.com", "v1beta1", "computedomains", "ComputeDomain"),
)
_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
_PROXY = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/services/(?P<svc>[^/:]+):(?P<port>\d+)/proxy"
    r"(?P<rest>/.*)?$"
)
_POD_PROXY = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<svc>[^/:]+):(?P<port>\d+)/proxy"
    r"(?P<rest>/.*)?$"
)
_BY_KIND = {(r.api_version, r.kind): r for r in RESOURCES}
_BY_PATH_KEY = {(r.api_version, r.plural): r for r in RESOURCES}


# ------------------------------------------------------------------------------ Status bodies


def status_body(
    code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A failure `Status` exactly as the API server writes it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = dict(details)
    return body


def forbidden_body(
    verb: str, resource: str, group: str, name: str, namespace: str
) -> dict[str, Any]:
    """RBAC denial of the service account, as kube-apiserver phrases it."""
    qualified = f"{resource}.{group}" if group else resource
    message = (
        f'{qualified} "{name}" is forbidden: User '
        '"system:serviceaccount:nvcf-system:nvcf-control-plane" cannot '
        f'{verb} resource "{resource}" in API group "{group}" in the namespace "{namespace}"'
    )
    return status_body(403, "Forbidden", message, {"name": name, "group": group, "kind": resource})


def invalid_body(kind: str, group: str, name: str, field_path: str, detail: str) -> dict[str, Any]:
    """A 422 validation failure with one cause."""
    qualified = f"{kind}.{group}" if group else kind
    message = f'{qualified} "{name}" is invalid: {field_path}: {detail}'
    return status_body(
        422,
        "Invalid",
        message,
        {
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": "FieldValueRequired", "message": detail, "field": field_path}],
        },
    )


def quota_body(resource: str, name: str, quota: str, item: str, used: int) -> dict[str, Any]:
    """A 403 from the ResourceQuota admission plugin."""
    message = (
        f'{resource} "{name}" is forbidden: exceeded quota: {quota}, requested: {item}=1, '
        f"used: {item}={used}, limited: {item}={used}"
    )
    return status_body(403, "Forbidden", message, {"name": name, "kind": resource})


# ------------------------------------------------------------------------------ selectors

_SET_EXPR = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def labels_match(selector: str, labels: Mapping[str, str]) -> bool:
    for term in _split_selector(selector):
        match = _SET_EXPR.match(term)
        if match:
            key, op, values = match.groups()
            wanted = {v.strip() for v in values.split(",")}
            inside = key in labels and labels[key] in wanted
            if inside != (op == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def fields_match(selector: str, obj: Mapping[str, Any]) -> bool:
    for term in _split_selector(selector):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if _field(obj, key.strip()) == value.strip():
                return False
        else:
            key, value = term.replace("==", "=").split("=", 1)
            if _field(obj, key.strip()) != value.strip():
                return False
    return True


# ------------------------------------------------------------------------------ the server


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any = None


@dataclass
class _Injected:
    method: str
    path: str
    code: int
    body: dict[str, Any]
    times: int | None


@dataclass
class _Hold:
    method: str
    path: str
    release: threading.Event = field(default_factory=threading.Event)


_SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class FakeKubernetes:
    """The test API server; use `start()` / `stop()` or as a context manager."""

    def __init__(self, token: str = "fake-token-0123456789") -> None:
        self.token = token
        self.requests: list[RecordedRequest] = []
        # Namespace deletion: how many GETs still see it Terminating before it is gone.
        self.terminating_reads = 1
        self._lock = threading.RLock()
        self._objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._applied: dict[tuple[str, str, str, str], str] = {}
        self._reads_left: dict[str, int] = {}
        self._errors: list[_Injected] = []
        self._holds: list[_Hold] = []
        self._rv = itertools.count(1000)
        self._last_rv = 1000
        self._httpd: ThreadingHTTPServer | None = None
        self._port = 0
        self._thread: threading.Thread | None = None
        self._endpoints: dict[tuple[str, str, int], tuple[str, int]] = {}
        self._pod_endpoints: dict[tuple[str, str, int], tuple[str, int]] = {}
        #: (namespace, pod, container, previous) -> (written at, line)
        self._logs: dict[tuple[str, str, str, bool], list[tuple[datetime, str]]] = {}
        self._log_ended: set[tuple[str, str, str]] = set()
        self._log_written = threading.Condition(self._lock)
        # WATCH: every change as (resourceVersion, type, key, object), oldest first
        self._history: list[tuple[int, str, tuple[str, str, str, str], dict[str, Any]]] = []
        self._changed = threading.Condition(self._lock)
        self._compacted = 0
        self._drops = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeKubernetes:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                fake._handle(self)

            do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _serve

            def log_message(self, format: str, *args: Any) -> None:
                return None

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # observe LISTs concurrently; 5 would drop SYNs
            daemon_threads = True
            block_on_close = False

        httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd = httpd
        self._port = int(httpd.server_address[1])
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; the port then refuses connections. Safe to call twice."""
        with self._lock:
            for hold in self._holds:
                hold.release.set()
            self._drops += 1
            self._changed.notify_all()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeKubernetes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._port, "server not started"
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path, *, context: str = "fake") -> Path:
        """A kubeconfig with context `context` pointing here (token auth) and a current
        context `elsewhere` pointing at a closed port, so only the named context works."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "fake", "cluster": {"server": self.url}},
                {"name": "elsewhere", "cluster": {"server": "http://127.0.0.1:9"}},
            ],
            "users": [{"name": "tester", "user": {"token": self.token}}],
            "contexts": [
                {"name": "elsewhere", "context": {"cluster": "elsewhere", "user": "tester"}},
                {"name": context, "context": {"cluster": "fake", "user": "tester"}},
            ],
            "current-context": "elsewhere",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # ------------------------------------------------------------------ test controls

    def inject_error(
        self, method: str, path: str, body: dict[str, Any], *, times: int | None = None
    ) -> None:
        """Answer `method path` (exact path, `*` for any method but a watch, `WATCH` for a
        watch request) with this Status body."""
        with self._lock:
            self._errors.append(_Injected(method.upper(), path, int(body["code"]), body, times))

    def clear_errors(self) -> None:
        with self._lock:
            self._errors.clear()

    def hold(self, method: str, path: str) -> threading.Event:
        """Make `method path` hang until the returned event is set (or the server stops)."""
        hold = _Hold(method.upper(), path)
        with self._lock:
            self._holds.append(hold)
        return hold.release

    def add_object(self, obj: Mapping[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        """Store an object as a controller or the kubelet would create it (no apply)."""
        stored = copy.deepcopy(dict(obj))
        resource = _BY_KIND[(str(stored["apiVersion"]), str(stored["kind"]))]
        metadata = stored.setdefault("metadata", {})
        if resource.namespaced:
            metadata["namespace"] = namespace or metadata.get("namespace") or "default"
        else:
            metadata.pop("namespace", None)
        if resource.kind == "Namespace":
            stored.setdefault("status", {"phase": "Active"})
        with self._lock:
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("creationTimestamp", _now())
            metadata["resourceVersion"] = self._next_rv()
            key = self._key(resource, metadata.get("namespace"), metadata["name"])
            self._record("MODIFIED" if key in self._objects else "ADDED", key, stored)
            self._objects[key] = stored
        return copy.deepcopy(stored)

    def set_status(self, kind: str, namespace: str | None, name: str, status: Any) -> None:
        """Replace an object's `status` (as its controller would), bumping resourceVersion."""
        with self._lock:
            obj = self.get(kind, namespace, name)
            assert obj is not None, f"{kind} {namespace}/{name} does not exist"
            resource = self._resource_of_kind(kind)
            stored = self._objects[self._key(resource, namespace, name)]
            stored["status"] = copy.deepcopy(status)
            stored["metadata"]["resourceVersion"] = self._next_rv()
            self._record("MODIFIED", self._key(resource, namespace, name), stored)

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """A stored object by kind (`Deployment`) or plural (`deployments`)."""
        resource = self._resource_of_kind(kind)
        with self._lock:
            obj = self._objects.get(self._key(resource, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def objects(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every stored object (of one namespace), sorted by kind and name."""
        with self._lock:
            found = [
                copy.deepcopy(o)
                for (_, _, ns, _), o in self._objects.items()
                if namespace is None or ns == namespace
            ]
        return sorted(found, key=lambda o: (o["kind"], o["metadata"]["name"]))

    def remove_object(self, kind: str, namespace: str | None, name: str) -> None:
        """Drop an object behind the adapter's back (someone ran `kubectl delete`)."""
        with self._lock:
            key = self._key(self._resource_of_kind(kind), namespace, name)
            self._forget(key)

    def finish_namespace_deletion(self, name: str) -> None:
        """Purge a terminating namespace and everything in it (the namespace controller)."""
        with self._lock:
            self._purge(name)

    def serve_endpoint(self, namespace: str, service: str, port: int, address: str) -> None:
        """Forward the service proxy of `service:port` in `namespace` to `host:port`."""
        host, _, target = address.rpartition(":")
        with self._lock:
            self._endpoints[(namespace, service, port)] = (host, int(target))

    def serve_pod(self, namespace: str, pod: str, port: int, address: str) -> None:
        """Forward the pod proxy of `pod:port` in `namespace` to `host:port`."""
        host, _, target = address.rpartition(":")
        with self._lock:
            self._pod_endpoints[(namespace, pod, port)] = (host, int(target))

    # ------------------------------------------------------------------ the Job controller

    def start_job(self, namespace: str, job: str) -> str:
        """Create the Job's pod from its template, as the Job controller does; its name."""
        stored = self.get("Job", namespace, job)
        assert stored is not None, f"Job {namespace}/{job} does not exist"
        template = copy.deepcopy(stored["spec"]["template"])
        metadata = template.setdefault("metadata", {})
        uid = stored["metadata"]["uid"]
        name = f"{job}-{uuid.uuid4().hex[:5]}"
        labels = metadata.setdefault("labels", {})
        labels.update({"batch.kubernetes.io/job-name": job, "job-name": job, "controller-uid": uid})
        metadata["name"] = name
        metadata["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid, "controller": True}
        ]
        self.add_object(
            {"apiVersion": "v1", "kind": "Pod", **template, "status": {"phase": "Pending"}},
            namespace=namespace,
        )
        self.set_status("Job", namespace, job, {"active": 1, "startTime": _now()})
        return name

    def job_pod(self, namespace: str, job: str) -> dict[str, Any]:
        pods = [
            o
            for o in self.objects(namespace)
            if o["kind"] == "Pod" and o["metadata"].get("labels", {}).get("job-name") == job
        ]
        assert len(pods) == 1, f"Job {namespace}/{job} has {len(pods)} pods"
        return pods[0]

    def run_job_pod(self, namespace: str, job: str) -> str:
        """Start the containers of the Job's pod (its init containers that are native
        sidecars keep running); the pod's name."""
        pod = self.job_pod(namespace, job)
        spec = pod["spec"]
        started = {"running": {"startedAt": _now()}}
        self.set_status(
            "Pod",
            namespace,
            pod["metadata"]["name"],
            {
                "phase": "Running",
                "startTime": _now(),
                "podIP": "10.0.0.7",
                "conditions": [
                    {"type": t, "status": "True"}
                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ],
                "initContainerStatuses": [
                    {
                        "name": c["name"],
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "image": c.get("image", ""),
                        "state": started,
                    }
                    for c in spec.get("initContainers", [])
                    if c.get("restartPolicy") == "Always"
                ],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "image": c.get("image", ""),
                        "state": started,
                    }
                    for c in spec["containers"]
                ],
            },
        )
        return str(pod["metadata"]["name"])

    def finish_job(
        self,
        namespace: str,
        job: str,
        exit_code: int = 0,
        *,
        oom: bool = False,
        lingering: bool = False,
    ) -> None:
        """The task container exits (then the sidecars stop); the pod and the Job say how.
        `lingering`: the sidecars are still in their `preStop` hook, so the pod still runs
        and the Job has not finished."""
        pod = self.job_pod(namespace, job)
        status = copy.deepcopy(pod.get("status") or {})
        reason = "OOMKilled" if oom else ("Completed" if exit_code == 0 else "Error")
        code = 137 if oom else exit_code
        keys = (
            ["containerStatuses"] if lingering else ["containerStatuses", "initContainerStatuses"]
        )
        for key in keys:
            for entry in status.get(key, []):
                own = key == "containerStatuses"
                entry["ready"] = False
                entry["state"] = {
                    "terminated": {
                        "exitCode": code if own else 0,
                        "reason": reason if own else "Completed",
                        "finishedAt": _now(),
                    }
                }
        if lingering:
            self.set_status("Pod", namespace, pod["metadata"]["name"], status)
            return
        status["phase"] = "Succeeded" if code == 0 else "Failed"
        self.set_status("Pod", namespace, pod["metadata"]["name"], status)
        now = _now()
        if code == 0:
            self.set_status(
                "Job",
                namespace,
                job,
                {
                    "succeeded": 1,
                    "startTime": now,
                    "completionTime": now,
                    "conditions": [
                        {"type": "SuccessCriteriaMet", "status": "True"},
                        {"type": "Complete", "status": "True"},
                    ],
                },
            )
        else:
            self.fail_job(
                namespace,
                job,
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )

    def exceed_job_deadline(self, namespace: str, job: str) -> None:
        """`activeDeadlineSeconds` passed: the Job fails and its pod is killed."""
        pod = self.job_pod(namespace, job)
        self.remove_object("Pod", namespace, pod["metadata"]["name"])
        self.fail_job(
            namespace, job, "DeadlineExceeded", "Job was active longer than specified deadline"
        )

    def fail_job(self, namespace: str, job: str, reason: str, message: str) -> None:
        condition = {"status": "True", "reason": reason, "message": message}
        self.set_status(
            "Job",
            namespace,
            job,
            {
                "failed": 1,
                "startTime": _now(),
                "conditions": [
                    {"type": "FailureTarget", **condition},
                    {"type": "Failed", **condition},
                ],
            },
        )

    def write_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *lines: str,
        previous: bool = False,
        at: datetime | None = None,
    ) -> None:
        """The container printed `lines` (its previous run did, with `previous=True`)."""
        when = at or datetime.now(UTC)
        with self._log_written:
            log = self._logs.setdefault((namespace, pod, container, previous), [])
            log.extend((when, line) for line in lines)
            self._log_written.notify_all()

    def end_log(self, namespace: str, pod: str, container: str) -> None:
        """The container exited: followers of its log see the stream end."""
        with self._log_written:
            self._log_ended.add((namespace, pod, container))
            self._log_written.notify_all()

    def compact(self) -> None:
        """Forget the history: a WATCH from an older resourceVersion answers 410 Gone."""
        with self._lock:
            self._compacted = self._last_rv
            self._history.clear()

    def drop_watches(self) -> None:
        """Cut every open WATCH stream mid-body (the connection to the API server was lost)."""
        with self._lock:
            self._drops += 1
            self._changed.notify_all()

    def watches(self) -> list[RecordedRequest]:
        """The WATCH requests, in order."""
        return [r for r in self.requests if r.query.get("watch") in ("true", "1")]

    def patches(self) -> list[str]:
        """Paths of the apply PATCH requests, in order."""
        return [r.path for r in self.requests if r.method == "PATCH"]

    # ------------------------------------------------------------------ internals

    def _record(self, kind: str, key: tuple[str, str, str, str], obj: dict[str, Any]) -> None:
        """Keep a change for WATCH streams (the lock is held)."""
        event = copy.deepcopy(obj)
        resource = _BY_PATH_KEY[(key[0], key[1])]
        event["kind"], event["apiVersion"] = resource.kind, resource.api_version
        self._history.append((int(event["metadata"]["resourceVersion"]), kind, key, event))
        self._changed.notify_all()

    def _next_rv(self) -> str:
        self._last_rv = next(self._rv)
        return str(self._last_rv)

    @staticmethod
    def _key(resource: Resource, namespace: str | None, name: str) -> tuple[str, str, str, str]:
        return (resource.api_version, resource.plural, namespace or "", name)

    @staticmethod
    def _resource_of_kind(kind: str) -> Resource:
        for r in RESOURCES:
            if kind in (r.kind, r.plural):
                return r
        raise KeyError(kind)

    def _forget(self, key: tuple[str, str, str, str]) -> None:
        obj = self._objects.pop(key, None)
        self._applied.pop(key, None)
        if obj is not None:
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._record("DELETED", key, obj)

    def _purge(self, namespace: str) -> None:
        for key in [k for k in self._objects if k[2] == namespace]:
            self._forget(key)
        self._forget(self._key(_BY_KIND[("v1", "Namespace")], None, namespace))
        self._reads_left.pop(namespace, None)

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        method = req.command.upper()
        proxy = _PROXY.match(req.path)
        if proxy is not None:
            self._proxy(req, method, proxy)
            return
        pod_proxy = _POD_PROXY.match(req.path)
        if pod_proxy is not None:
            self._proxy(req, method, pod_proxy, pod=True)
            return
        pod_log = _POD_LOG.match(urlsplit(req.path).path)
        if pod_log is not None and method == "GET":
            self._pod_log(
                req, pod_log["ns"], pod_log["pod"], dict(parse_qsl(urlsplit(req.path).query))
            )
            return
        parts = urlsplit(req.path)
        path = parts.path.rstrip("/") or "/"
        query = dict(parse_qsl(parts.query))
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        content_type = (req.headers.get("Content-Type") or "").split(";")[0].strip()
        body: Any = None
        if raw:
            try:
                body = yaml.safe_load(raw.decode())
            except yaml.YAMLError:
                body = raw.decode(errors="replace")
        hold: _Hold | None = None
        with self._lock:
            self.requests.append(RecordedRequest(method, path, query, content_type, body))
            hold = next(
                (h for h in self._holds if h.path == path and h.method in (method, "*")), None
            )
        if hold is not None:
            hold.release.wait(timeout=30)
        if req.headers.get("Authorization") != f"Bearer {self.token}":
            code, payload = 401, status_body(401, "Unauthorized", "Unauthorized")
        elif method == "GET" and query.get("watch") in ("true", "1"):
            route = self._route(path)
            injected = self._injected("WATCH", path)
            if injected is not None:
                code, payload = injected
            elif route is not None and route[2] is None:
                self._watch(req, route[0], route[1], query)
                return
            code, payload = 404, status_body(404, "NotFound", "the server could not find it")
        else:
            code, payload = self._dispatch(method, path, query, content_type, body)
        data = json.dumps(payload).encode()
        try:
            req.send_response(code)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except OSError:
            pass  # the client gave up (timeout test)

    def _watch(
        self,
        req: BaseHTTPRequestHandler,
        resource: Resource,
        namespace: str | None,
        query: dict[str, str],
    ) -> None:
        """Stream the changes of a list path as a real API server does (chunked JSON lines)."""
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout

        def matches(key: tuple[str, str, str, str], obj: Mapping[str, Any]) -> bool:
            if (key[0], key[1]) != (resource.api_version, resource.plural):
                return False
            if namespace is not None and key[2] != namespace:
                return False
            labels = {str(k): str(v) for k, v in (obj["metadata"].get("labels") or {}).items()}
            if "labelSelector" in query and not labels_match(query["labelSelector"], labels):
                return False
            return "fieldSelector" not in query or fields_match(query["fieldSelector"], obj)

        with self._lock:
            given = query.get("resourceVersion")
            since = int(given) if given else self._last_rv
            if since < self._compacted:
                message = f"too old resource version: {since} ({self._compacted})"
                self._reply(req, 410, status_body(410, "Expired", message))
                return
            drops = self._drops
            pending: list[dict[str, Any]] = []
            if not given:  # no version: the current state first, as ADDED
                for key, obj in sorted(self._objects.items()):
                    if matches(key, obj):
                        added = copy.deepcopy(obj)
                        added["kind"], added["apiVersion"] = resource.kind, resource.api_version
                        pending.append({"type": "ADDED", "object": added})
        req.protocol_version = "HTTP/1.1"
        try:
            req.send_response(200)
            req.send_header("Content-Type", "application/json")
            req.send_header("Transfer-Encoding", "chunked")
            req.send_header("Connection", "close")
            req.end_headers()
            while True:
                for event in pending:
                    data = (json.dumps(event) + "\n").encode()
                    req.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                req.wfile.flush()
                with self._lock:
                    while True:
                        if self._drops != drops:
                            return  # cut mid-body: no final chunk
                        left = deadline - time.monotonic()
                        if left <= 0:
                            req.wfile.write(b"0\r\n\r\n")
                            return
                        news = [
                            (rv, kind, obj)
                            for rv, kind, key, obj in self._history
                            if rv > since and matches(key, obj)
                        ]
                        if news:
                            break
                        self._changed.wait(min(left, 0.5))
                    since = news[-1][0]
                    pending = [{"type": k, "object": copy.deepcopy(o)} for _, k, o in news]
        except OSError:
            pass  # the client went away

    def _proxy(
        self, req: BaseHTTPRequestHandler, method: str, match: re.Match[str], *, pod: bool = False
    ) -> None:
        """The API server's service (or pod) proxy: forward the request to its endpoint."""
        namespace, service, port = match["ns"], match["svc"], int(match["port"])
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        kind = "Pod" if pod else "Service"
        with self._lock:
            self.requests.append(RecordedRequest(method, req.path.split("?")[0], {}, "", None))
            exists = self.get(kind, namespace, service) is not None
            endpoints = self._pod_endpoints if pod else self._endpoints
            endpoint = endpoints.get((namespace, service, port))
        if req.headers.get("Authorization") != f"Bearer {self.token}":
            self._reply(req, 401, status_body(401, "Unauthorized", "Unauthorized"))
            return
        if not exists:
            body = status_body(404, "NotFound", f'{kind.lower()}s "{service}" not found')
            self._reply(req, 404, body)
            return
        if endpoint is None:
            message = f'no endpoints available for {kind.lower()} "{service}"'
            self._reply(req, 503, status_body(503, "ServiceUnavailable", message))
            return
        headers = {
            k: v
            for k, v in req.headers.items()
            if k.lower() not in ("authorization", "host", "connection", "content-length")
        }
        conn = http.client.HTTPConnection(*endpoint, timeout=30)
        try:
            conn.request(method, match["rest"] or "/", body=raw, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            req.send_response(answer.status)
            for k, v in answer.getheaders():
                if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                    req.send_header(k, v)
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except ConnectionRefusedError:
            message = (
                f"error trying to reach service: dial tcp {endpoint[0]}:{endpoint[1]}: "
                "connect: connection refused"
            )
            self._reply(req, 503, status_body(503, "ServiceUnavailable", message))
        finally:
            conn.close()

    def _pod_log(
        self, req: BaseHTTPRequestHandler, namespace: str, name: str, query: dict[str, str]
    ) -> None:
        """The pod's `log` subresource (see the module docstring)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/log"
        with self._lock:
            self.requests.append(RecordedRequest("GET", path, query, "", None))
            pod = self.get("Pod", namespace, name)
        if req.headers.get("Authorization") != f"Bearer {self.token}":
            self._reply(req, 401, status_body(401, "Unauthorized", "Unauthorized"))
            return
        if pod is None:
            self._reply(req, 404, status_body(404, "NotFound", f'pods "{name}" not found'))
            return
        spec = pod.get("spec") or {}
        names = [
            str(c.get("name"))
            for key in ("initContainers", "containers")
            for c in spec.get(key) or []
        ]
        container = query.get("container")
        if container is None:
            main = [str(c.get("name")) for c in spec.get("containers") or []]
            if len(main) != 1:
                message = (
                    f"a container name must be specified for pod {name}, choose one of: "
                    f"[{' '.join(main)}]"
                )
                self._reply(req, 400, status_body(400, "BadRequest", message))
                return
            container = main[0]
        if container not in names:
            message = f"container {container} is not valid for pod {name}"
            self._reply(req, 400, status_body(400, "BadRequest", message))
            return
        previous = query.get("previous") == "true"
        key = (namespace, name, container, previous)
        with self._lock:
            started = key in self._logs
        if not started:
            message = (
                f'previous terminated container "{container}" in pod "{name}" not found'
                if previous
                else f'container "{container}" in pod "{name}" is waiting to start: '
                "ContainerCreating"
            )
            self._reply(req, 400, status_body(400, "BadRequest", message))
            return
        with self._lock:
            lines = list(self._logs[key])
        # a follow goes on from what this answer held, not from what was written since
        sent = len(lines)
        if "sinceSeconds" in query:
            edge = datetime.now(UTC) - timedelta(seconds=int(query["sinceSeconds"]))
            lines = [item for item in lines if item[0] >= edge]
        if "tailLines" in query:
            tail = int(query["tailLines"])
            lines = lines[-tail:] if tail else []
        limit = int(query["limitBytes"]) if "limitBytes" in query else None
        stamps = query.get("timestamps") == "true"

        def render(item: tuple[datetime, str]) -> bytes:
            text = item[1] + "\n"
            if stamps:
                text = item[0].strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z " + text
            return text.encode()

        data = b"".join(render(item) for item in lines)
        if limit is not None:
            data = data[:limit]
        follow = query.get("follow") == "true" and not previous
        try:
            req.send_response(200)
            req.send_header("Content-Type", "text/plain")
            if not follow:
                req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
            req.wfile.flush()
            if not follow:
                return
            while True:
                with self._log_written:
                    self._log_written.wait(timeout=0.05)
                    log = self._logs[key]
                    fresh, sent = log[sent:], len(log)
                    ended = (
                        (namespace, name, container) in self._log_ended
                        or self.get("Pod", namespace, name) is None
                        or self._httpd is None
                    )
                if fresh:
                    req.wfile.write(b"".join(render(item) for item in fresh))
                    req.wfile.flush()
                if ended:
                    break
            req.close_connection = True
        except OSError:
            pass  # the client left

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, code: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            req.send_response(code)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except OSError:
            pass

    def _injected(self, method: str, path: str) -> tuple[int, dict[str, Any]] | None:
        """An injected error for `method path` (`WATCH` for a watch request), used up once."""
        with self._lock:
            for err in self._errors:
                if err.path == path and err.method in (method, "*"):
                    if err.times is not None:
                        err.times -= 1
                        if err.times <= 0:
                            self._errors.remove(err)
                    return err.code, copy.deepcopy(err.body)
        return None

    def _dispatch(
        self, method: str, path: str, query: dict[str, str], content_type: str, body: Any
    ) -> tuple[int, dict[str, Any]]:
        injected = self._injected(method, path)
        if injected is not None:
            return injected
        with self._lock:
            discovery = self._discovery(path)
            if discovery is not None:
                return 200, discovery
            route = self._route(path)
            if route is None:
                return 404, status_body(
                    404, "NotFound", "the server could not find the requested resource"
                )
            resource, namespace, name = route
            if method == "GET" and name is None:
                return self._list(resource, namespace, query)
            if method == "GET":
                return self._get(resource, namespace, name or "")
            if method == "PATCH" and name is not None:
                return self._apply(resource, namespace, name, query, content_type, body)
            if method == "DELETE" and name is not None:
                return self._delete(resource, namespace, name)
            return 405, status_body(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )

    def _discovery(self, path: str) -> dict[str, Any] | None:
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/apis":
            groups: dict[str, list[str]] = {}
            for r in RESOURCES:
                if r.group:
                    groups.setdefault(r.group, [])
                    if r.version not in groups[r.group]:
                        groups[r.group].append(r.version)
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                        "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                    }
                    for g, vs in groups.items()
                ],
            }
        match = re.fullmatch(r"/api/(v1)|/apis/([^/]+)/([^/]+)", path)
        if match is None:
            return None
        group = match.group(2) or ""
        version = match.group(1) or match.group(3)
        listed = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
        if not listed:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [
                {
                    "name": r.plural,
                    "singularName": r.kind.lower(),
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                }
                for r in listed
            ],
        }

    @staticmethod
    def _route(path: str) -> tuple[Resource, str | None, str | None] | None:
        segments = path.strip("/").split("/")
        if segments[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", segments[2:]
        elif segments[0] == "apis" and len(segments) >= 3:
            group, version, rest = segments[1], segments[2], segments[3:]
        else:
            return None
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 2:
            return None
        resource = _BY_PATH.get((group, version, rest[0]))
        if resource is None or (namespace is not None and not resource.namespaced):
            return None
        return resource, namespace, rest[1] if len(rest) == 2 else None

    def _not_found(self, resource: Resource, name: str) -> tuple[int, dict[str, Any]]:
        return 404, status_body(
            404,
            "NotFound",
            f'{resource.qualified} "{name}" not found',
            {"name": name, "group": resource.group, "kind": resource.plural},
        )

    def _get(
        self, resource: Resource, namespace: str | None, name: str
    ) -> tuple[int, dict[str, Any]]:
        if resource.kind == "Namespace" and name in self._reads_left:
            if self._reads_left[name] <= 0:
                self._purge(name)
            else:
                self._reads_left[name] -= 1
        obj = self._objects.get(self._key(resource, namespace, name))
        if obj is None:
            return self._not_found(resource, name)
        return 200, copy.deepcopy(obj)

    def _list(
        self, resource: Resource, namespace: str | None, query: dict[str, str]
    ) -> tuple[int, dict[str, Any]]:
        items = []
        for (api_version, plural, ns, _), obj in sorted(self._objects.items()):
            if (api_version, plural) != (resource.api_version, resource.plural):
                continue
            if namespace is not None and ns != namespace:
                continue
            labels = {
                str(k): str(v) for k, v in (obj.get("metadata", {}).get("labels") or {}).items()
            }
            if "labelSelector" in query and not labels_match(query["labelSelector"], labels):
                continue
            if "fieldSelector" in query and not fields_match(query["fieldSelector"], obj):
                continue
            item = copy.deepcopy(obj)
            item.pop("kind", None)  # a real server leaves these out of list items
            item.pop("apiVersion", None)
            items.append(item)
        return 200, {
            "kind": f"{resource.kind}List",
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(self._last_rv)},
            "items": items,
        }

    def _apply(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        query: dict[str, str],
        content_type: str,
        body: Any,
    ) -> tuple[int, dict[str, Any]]:
        if content_type != APPLY_CONTENT_TYPE:
            return 415, status_body(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: application/json-patch+json, application/merge-patch+json, "
                f"{APPLY_CONTENT_TYPE}",
            )
        manager = query.get("fieldManager")
        if not manager:
            return 400, status_body(
                400, "BadRequest", "fieldManager is required for apply requests"
            )
        if not isinstance(body, dict):
            return 400, status_body(400, "BadRequest", "error decoding YAML: not an object")
        metadata: dict[str, Any] = (
            body["metadata"] if isinstance(body.get("metadata"), dict) else {}
        )
        if (body.get("apiVersion"), body.get("kind")) != (resource.api_version, resource.kind):
            return 400, status_body(
                400,
                "BadRequest",
                f"the API version in the data ({body.get('apiVersion')}) does not match the "
                f"expected API version ({resource.api_version}) or kind ({resource.kind})",
            )
        if metadata.get("name") != name:
            return 400, status_body(
                400,
                "BadRequest",
                f"the name of the object ({metadata.get('name')}) does not match the name on "
                f"the URL ({name})",
            )
        if resource.namespaced and metadata.get("namespace") not in (None, namespace):
            return 400, status_body(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the "
                "request",
            )
        if metadata.get("managedFields"):
            return 400, status_body(400, "BadRequest", "metadata.managedFields must be nil")
        key = self._key(resource, namespace, name)
        existing = self._objects.get(key)
        if resource.namespaced:
            ns_obj = self._objects.get(
                self._key(_BY_KIND[("v1", "Namespace")], None, namespace or "")
            )
            if ns_obj is None:
                return 404, status_body(
                    404,
                    "NotFound",
                    f'namespaces "{namespace}" not found',
                    {"name": namespace, "kind": "namespaces"},
                )
            if existing is None and ns_obj.get("status", {}).get("phase") == "Terminating":
                return 403, status_body(
                    403,
                    "Forbidden",
                    f'{resource.qualified} "{name}" is forbidden: unable to create new content '
                    f"in namespace {namespace} because it is being terminated",
                    {"name": name, "group": resource.group, "kind": resource.plural},
                )
        applied = copy.deepcopy(body)
        applied.pop("status", None)
        applied_meta = applied.setdefault("metadata", {})
        for server_field in _SERVER_FIELDS:
            applied_meta.pop(server_field, None)
        if resource.namespaced:
            applied_meta["namespace"] = namespace
        canonical = json.dumps(applied, sort_keys=True)
        managed = [
            {
                "manager": manager,
                "operation": "Apply",
                "apiVersion": resource.api_version,
                "time": _now(),
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {}},
            }
        ]
        if existing is None:
            obj = applied
            obj["metadata"].update(
                uid=str(uuid.uuid4()),
                resourceVersion=self._next_rv(),
                creationTimestamp=_now(),
                managedFields=managed,
            )
            if resource.kind not in ("Namespace", "Secret", "ConfigMap", "ServiceAccount"):
                obj["metadata"]["generation"] = 1
            if resource.kind == "Namespace":
                obj["spec"] = {"finalizers": ["kubernetes"]}
                obj["status"] = {"phase": "Active"}
                obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            self._objects[key] = obj
            self._applied[key] = canonical
            self._record("ADDED", key, obj)
            return 201, copy.deepcopy(obj)
        if self._applied.get(key) == canonical:
            return 200, copy.deepcopy(existing)  # nothing changed: same resourceVersion
        merged = copy.deepcopy(existing)
        previous = json.loads(self._applied.get(key, "{}"))
        for top, value in applied.items():
            if top == "metadata":
                continue
            merged[top] = copy.deepcopy(value)
        meta = merged["metadata"]
        for section in ("labels", "annotations"):
            before = set(previous.get("metadata", {}).get(section) or {})
            kept = {k: v for k, v in (meta.get(section) or {}).items() if k not in before}
            kept.update(applied_meta.get(section) or {})
            if kept:
                meta[section] = kept
            else:
                meta.pop(section, None)
        if resource.kind == "Namespace":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        if merged.get("spec") != existing.get("spec") and "generation" in meta:
            meta["generation"] = int(meta["generation"]) + 1
        meta["resourceVersion"] = self._next_rv()
        meta["managedFields"] = managed
        self._objects[key] = merged
        self._applied[key] = canonical
        self._record("MODIFIED", key, merged)
        return 200, copy.deepcopy(merged)

    def _delete(
        self, resource: Resource, namespace: str | None, name: str
    ) -> tuple[int, dict[str, Any]]:
        key = self._key(resource, namespace, name)
        obj = self._objects.get(key)
        if obj is None:
            return self._not_found(resource, name)
        if resource.kind == "Namespace":
            if obj.get("status", {}).get("phase") == "Terminating":
                return 409, status_body(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on namespaces "{name}": The system is '
                    "ensuring all content is removed from this namespace.  Upon completion, "
                    "this namespace will automatically be purged by the system.",
                    {"name": name, "kind": "namespaces"},
                )
            obj["metadata"]["deletionTimestamp"] = _now()
            obj["metadata"]["resourceVersion"] = self._next_rv()
            obj["status"] = {"phase": "Terminating"}
            self._reads_left[name] = self.terminating_reads
            self._record("MODIFIED", key, obj)
            return 200, copy.deepcopy(obj)
        self._forget(key)
        return 200, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "group": resource.group, "kind": resource.plural},
        }


_POD_LOG = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<pod>[^/]+)/log$")


def iter_fixture_items(name: str) -> Iterator[dict[str, Any]]:
    """The items of a `kubectl get -o json` List fixture, with their kind filled in."""
    data = fixture(name)
    kind = str(data.get("kind", "List"))
    for item in data.get("items", []):
        if "kind" not in item and kind.endswith("List") and kind != "List":
            item["kind"] = kind[: -len("List")]
        yield item
