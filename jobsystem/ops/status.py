"""Job status for applications and operators: ``get_status(message_id)``, totals per queue.

A record appears a few milliseconds after the send (writes are deferred) and is kept for
``JOB_STATUS_TTL_MS`` after its last change. Without a ``state`` store given, the process's
system's store is read (:func:`~jobsystem.system.get_system`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cache
from typing import Any

from jobsystem.store.base import StateStore
from jobsystem.store.status import StatusBackend, status_backend
from jobsystem.store.status_records import JobStatus
from jobsystem.system import get_system

__all__ = ["JobStatus", "get_status", "queue_totals", "shown_status"]


@cache
def _backend(state: StateStore) -> StatusBackend:
    return status_backend(state)


def get_status(message_id: str, *, state: StateStore | None = None) -> JobStatus | None:
    """The status of ``message_id`` (the id ``send()`` returned), or None when unknown or expired.

    Raises :class:`~jobsystem.store.base.StoreUnavailable` when the state store does not answer.
    """
    return _backend(state or get_system().store).get(message_id)


def queue_totals(queues: list[str], *, state: StateStore | None = None) -> dict[str, dict[str, int]]:
    """For each queue, how many jobs reached each state (``succeeded``, ``dead``...) so far."""
    return _backend(state or get_system().store).counts(queues)


def shown_status(record: JobStatus, scrubber: Callable[[Any], Any]) -> JobStatus:
    """``record`` as a person is shown it (``jobctl status``, the dashboard's job page and API): its
    result, kept as the actor returned it, scrubbed as a structure by ``scrubber`` (the system's
    :class:`~jobsystem.privacy.scrub.Scrubber`: a dict under ``address`` goes whole), which a
    scrubber of text lines cannot do. Its other texts (note, error, traceback, shown arguments)
    were scrubbed when they were written."""
    return dataclasses.replace(record, result=scrubber(record.result))
