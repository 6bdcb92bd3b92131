"""The reconciler's lease identity, kept in the data dir so a restart can take back its own
leases at once.

After a crash, a restarted server would otherwise wait a whole lease period (60 s by default)
before it may drive the instances its previous run had leased. The id is stored in
`<data dir>/reconciler-owner` and held under an exclusive `flock` for the life of the process:
the kernel drops the lock when the process dies, so a new process that gets the lock can prove
the previous holder is gone and reuse its id. A second live process on the same data dir does
not get the lock and uses a fresh id; other replicas' leases still expire normally.
"""

from __future__ import annotations

import fcntl
import os
import socket
import uuid
from pathlib import Path
from typing import IO

FILE = "reconciler-owner"


class OwnerId:
    """A lease identity; `close()` gives up the claim on the data dir's id, if held."""

    def __init__(self, value: str, handle: IO[str] | None = None) -> None:
        self.value = value
        self._handle = handle

    @property
    def persistent(self) -> bool:
        return self._handle is not None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()  # releases the lock
            self._handle = None


def fresh_owner() -> OwnerId:
    return OwnerId(f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:8]}")


def claim_owner(data_dir: Path) -> OwnerId:
    """The data dir's owner id when no live process holds it, else a fresh one."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        handle = open(data_dir / FILE, "a+", encoding="utf-8")  # noqa: SIM115 - held open
    except OSError:
        return fresh_owner()
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return fresh_owner()
    handle.seek(0)
    value = handle.read().strip()
    if not value or len(value) > 64:
        value = f"{socket.gethostname()[:32]}:{uuid.uuid4().hex[:16]}"
        handle.seek(0)
        handle.truncate()
        handle.write(value)
        handle.flush()
    return OwnerId(value, handle)
