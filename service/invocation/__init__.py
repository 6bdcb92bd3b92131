"""The invocation plane (api.md §6): `pexec`/`exec` and their status polls, transparent mode,
queues and per-instance concurrency, function rate limits, and the request state other
replicas poll.

Modules: `router` (routes), `transparent` (Host/header mode, the front door), `inline` (the
common request answered in its handler's task; `wire`: its bytes on the connection),
`service` (`InvocationPlane`: accept, run, hand over or store, poll), `records` (a request
while it runs, polls, queues), `routing` (version and instances of a request), `access` (who
may invoke what), `dispatch` (queues and concurrency), `ratelimit` (function rate limits),
`forward` (headers both ways, poll time), `answers` (HTTP answers), `store` (SQL), `models`
(tables), `metrics`, `schemas`; `grpc/` the gRPC listener over the same engine.
"""

from __future__ import annotations

from service.invocation.service import InvocationPlane

__all__ = ["InvocationPlane"]
