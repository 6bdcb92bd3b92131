"""The invocation plane (api.md §6): `pexec`/`exec` and their status polls, transparent mode,
queues and per-instance concurrency, function rate limits, and the request state other
replicas poll.

Modules: `engine` (every request runs through it: admit, acquire, send, stream / whole /
detach / retry, finish), `http` (the HTTP entry: every invocation route as one plain ASGI
application, and its OpenAPI declarations), `answers` (its HTTP answers), `transparent`
(Host/header mode), `service` (`InvocationPlane`: the engine, polls, background work),
`records` (a request while it runs, polls, queues), `lookup` (polls and queue questions),
`routing` (version and instances of a request), `access` (who may invoke what), `dispatch`
and `dispatch_redis` (queues and concurrency), `ratelimit` (function rate limits), `forward`
(headers both ways, poll time), `tokens` (invocation tokens), `store` (SQL), `models`
(tables), `metrics`, `load`, `schemas`; `grpc/` the gRPC listener over the same engine.
"""

from __future__ import annotations

from service.invocation.service import InvocationPlane

__all__ = ["InvocationPlane"]
