"""A workflow's result for its caller: the last step's result, or a failure as soon as the
workflow ended without one.

A pipeline whose member ended in the dead letters (or that was cancelled) never sends its last
step, so waiting for that step's result alone would last the whole timeout and end in
``ResultTimeout``; the caller gets ``ResultFailure`` naming the member instead, as Celery's
``chain.get()`` raises at once. The workflow's state is read between waits of at most
:data:`STATE_CHECK_MS`, each waited out whole (paused for what Dramatiq's wait left of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.results import ResultFailure, ResultMissing, ResultTimeout
from dramatiq.results.backend import DEFAULT_TIMEOUT

from jobsystem.store.workflows import WorkflowRecord
from middleware.workflows import find_workflows

__all__ = ["STATE_CHECK_MS", "failed_member", "unless_ended"]

#: The longest wait for a result before the workflow's state is read again (ms).
STATE_CHECK_MS = 1_000

#: Reads a result: ``fetch(block, timeout_ms)`` as ``Message.get_result``.
Fetch = Callable[[bool, int | None], Any]


def unless_ended(
    broker: dramatiq.Broker, workflow_id: str | None, fetch: Fetch, *, block: bool, timeout: int | None
) -> Any:
    """``fetch``'s result; ``ResultFailure`` once the workflow is recorded failed or cancelled
    and the result is not there (``ResultMissing`` / ``ResultTimeout`` otherwise, as Dramatiq's).
    ``timeout``: ms, Dramatiq's default (10 s) when None."""
    if not block:
        try:
            return fetch(False, None)
        except ResultMissing:
            _raise_if_ended(broker, workflow_id)
            raise
    deadline = time.monotonic() + (DEFAULT_TIMEOUT if timeout is None else timeout) / 1000
    wait_ms, last = 0, False  # a first look, the state, waits of at most STATE_CHECK_MS, a last look
    while True:
        started = time.monotonic()
        try:
            return fetch(True, wait_ms)
        except ResultTimeout:
            _raise_if_ended(broker, workflow_id)
            if last or time.monotonic() >= deadline:
                raise
            _pause_rest(started + wait_ms / 1000, deadline)
            left_ms = int((deadline - time.monotonic()) * 1000)
            wait_ms, last = min(STATE_CHECK_MS, max(0, left_ms)), left_ms <= 0


def _pause_rest(wait_end: float, deadline: float) -> None:
    """Sleep until the wait asked of Dramatiq would have ended (not past ``deadline``): its
    polling wait gives up at once when its first pause (100-200 ms) would pass the wait's end, so
    a short wait, and the end of every wait, came back early; read again at once, the store was
    read hundreds of times a call. After the deadline, one last look (a wait of 0) follows."""
    rest = min(wait_end, deadline) - time.monotonic()
    if rest > 0:
        time.sleep(rest)


def _raise_if_ended(broker: dramatiq.Broker, workflow_id: str | None) -> None:
    """``ResultFailure`` when the workflow is recorded failed or cancelled (named by member id,
    actor, state and the workflow's reason: no argument, no error text)."""
    if workflow_id is None:
        return
    found = find_workflows(broker).backend.get(workflow_id)
    if found is None or found.state not in ("failed", "cancelled"):
        return
    member = failed_member(found)
    said = f"workflow {workflow_id} {found.state}"
    if member is not None:
        named = " ".join(str(member[k]) for k in ("id", "actor") if member.get(k))
        said += f": member {named} ended {member.get('state')}"
    reason = (member or {}).get("reason") or found.state
    raise ResultFailure(said, f"Workflow{found.state.capitalize()}", reason)  # type: ignore[no-untyped-call]


def failed_member(found: WorkflowRecord) -> dict[str, Any] | None:
    """The member that failed the workflow (its record's fields, state and reason), if one did."""
    if found.failed is None:
        return None
    for step in found.record["steps"]:
        for member in step["members"]:
            if member["id"] == found.failed:
                reason = found.reasons.get(found.failed)
                return {
                    **member,
                    "state": found.states.get(found.failed),
                    **({"reason": reason} if reason else {}),
                }
    return {"id": found.failed}
