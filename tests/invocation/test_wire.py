"""What the inline path writes on the server's connection (invocation/wire.py): request ids."""

from __future__ import annotations

import uuid

from service.invocation.wire import new_request_id


def test_request_ids_are_random_version_4_uuids_never_repeated() -> None:
    ids = [new_request_id() for _ in range(2000)]  # several reads of random bytes
    assert len(set(ids)) == len(ids)
    for text in ids[:300]:
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == text
