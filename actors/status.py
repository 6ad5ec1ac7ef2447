"""Job status for applications: ``get_status(message_id)`` from a request handler.

```python
from actors.status import get_status

def video_status(request, message_id):      # GET /videos/<id>/status
    status = get_status(message_id)
    if status is None:
        return 404, {"state": "unknown"}
    return 200, status.to_dict()             # state, progress, note, error, result, times
```

A record appears a few milliseconds after the send (writes are deferred) and is kept for
``JOB_STATUS_TTL_MS`` after its last change.
"""

from __future__ import annotations

from functools import cache

from actors import store
from jobsystem.store.base import StateStore
from jobsystem.store.status import JobStatus, StatusBackend, status_backend

__all__ = ["JobStatus", "get_status", "queue_totals"]


@cache
def _backend(state: StateStore) -> StatusBackend:
    return status_backend(state)


def get_status(message_id: str, *, state: StateStore | None = None) -> JobStatus | None:
    """The status of ``message_id`` (the id ``send()`` returned), or None when unknown or expired.

    Raises :class:`~jobsystem.store.base.StoreUnavailable` when the state store does not answer.
    """
    return _backend(state or store).get(message_id)


def queue_totals(queues: list[str], *, state: StateStore | None = None) -> dict[str, dict[str, int]]:
    """For each queue, how many jobs reached each state (``succeeded``, ``dead``...) so far."""
    return _backend(state or store).counts(queues)
