"""Launching a workflow: record it, send its first step, and launch it only once.

A launch is idempotent when it can be recognised again: its workflow's id is then derived from
(in this order) the ``key`` the caller gives ``run()``, the idempotency keys of its first step's
members when every one has a key (with every step's shape: another pipeline sharing that first
step is another workflow), or the message of the job that launches it and how many
workflows that job launched before it. A relaunch (the launching job redelivered after its
worker was killed, ``run()`` called again with the same keys) finds the workflow recorded: it
sends nothing once the first launch sent the whole first step, else only the members not yet
counted, each carrying an idempotency key, so a member the first launch did send still runs once.
A relaunch's messages take the ids the first launch's had (by their place), so both name the same
members; the first launch's messages keep the ids their caller gave them.

A member dropped at send as the duplicate of an earlier message with its key ends as its original
did (:meth:`~middleware.workflows.Workflows.duplicate_finished`).

A launch whose publish fails records the workflow ``failed`` (the member not sent, and why) and
marks its first step's members cancelled in it, so none of those already sent runs; the error
raised carries ``workflow_id``, which ``run()`` has set already. An interrupt (the worker shutting
down, a time limit) leaves it running: the launching job's redelivery completes it. A launch
that finds its derived id's record failed at launch (its publish refused, not a member failed)
starts anew under the next attempt's id: the caller's retry, or Dramatiq's retry of the launching
job, must get a live workflow, not the failed one, whose members stay cancelled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq import Message
from dramatiq.middleware import CurrentMessage

from jobsystem.privacy.outage_lines import log_outage
from jobsystem.rabbitmq.bulk import send_bulk
from jobsystem.runtime.idempotency_keys import IdempotencyKeyError
from jobsystem.runtime.options import option_of
from jobsystem.runtime.workflow_steps import (
    Step,
    annotate,
    keyed_by_id,
    with_recorded_ids,
    without_empty_steps,
)
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.workflows import LAUNCHED, WorkflowRecord
from middleware.idempotency import Idempotency
from middleware.workflows import Workflows, find_workflows

__all__ = ["launch", "launch_id", "refused_at_launch"]

logger = logging.getLogger(__name__)

#: The namespace of derived workflow ids.
_NAMESPACE = uuid.UUID("5b0f6d38-8e0e-4f4e-9a53-2f1c1f6f7a10")

#: The reason recorded for the member a launch's refused publish did not send.
NOT_SENT = "not sent: the launch's publish failed"

#: How many refused launches of one derived id are started anew before a launch gives up.
MAX_ATTEMPTS = 20

#: How many workflows each job being run launched so far, by its delivery (``id``, and a weak
#: reference to tell a later object at the same address): a redelivery is a new delivery and
#: counts from zero again. Not per thread: async actors interleave on one thread.
_launched_by: dict[int, tuple[weakref.ref[Any], int]] = {}
_launched_lock = threading.Lock()


def _idempotency(broker: dramatiq.Broker) -> Idempotency | None:
    return next((m for m in broker.middleware if isinstance(m, Idempotency)), None)


def _hasher(broker: dramatiq.Broker) -> Callable[[str], str]:
    """The idempotency keys' hash (keyed with ``STATE_KEY_SECRET``): a caller's key may be an
    email address, and a workflow id is a store key name. SHA-256 without an Idempotency middleware."""
    idempotency = _idempotency(broker)
    if idempotency is not None:
        return idempotency.hasher
    return lambda text: hashlib.sha256(text.encode()).hexdigest()


def _members_keys(broker: dramatiq.Broker, messages: list[Message[Any]]) -> list[str] | None:
    """The scoped keys of ``messages`` when every one has a key, else None."""
    idempotency = _idempotency(broker)
    if idempotency is None or not messages:
        return None
    try:
        keys = [idempotency.key_of(broker, message) for message in messages]
    except IdempotencyKeyError:
        return None  # its send raises it to the caller
    return None if None in keys else [str(key) for key in keys]


def _launching_job() -> str | None:
    """``<message id>:<n>`` for the ``n``-th launch by the job being run here, or None."""
    current = CurrentMessage.get_current_message()
    if current is None:
        return None
    address, message_id = id(current), current.message_id
    with _launched_lock:
        ref, count = _launched_by.get(address, (None, 0))
        if ref is None or ref() is not current:
            ref, count = weakref.ref(current, lambda _: _launched_by.pop(address, None)), 0
        _launched_by[address] = (ref, count + 1)
    return f"{message_id}:{count + 1}"


def _shape(broker: dramatiq.Broker, steps: list[Step]) -> str:
    """Every step's shape, hashed: its mode and what it hands on, and each member's actor, queue
    and idempotency key (else a hash of its arguments), so that two pipelines sharing their first
    step's keys but not a later step are two workflows, not a relaunch of one."""
    hasher = _hasher(broker)

    def member(message: Message[Any]) -> str:
        key = message.options.get("idempotency_key")
        given = (
            f"key:{key}" if isinstance(key, str) else json.dumps([message.args, message.kwargs], default=repr)
        )
        return f"{message.actor_name}@{message.queue_name}:{hasher(given)}"

    shape = [[step.mode, step.pipe, *map(member, step.messages)] for step in steps]
    return hasher(json.dumps(shape))


def launch_id(broker: dramatiq.Broker, kind: str, steps: list[Step], key: str | None) -> str | None:
    """The id a relaunch finds again (see the module), or None: a workflow like any other."""
    if key is not None:
        basis = f"key:{_hasher(broker)(key)}"
    elif (keys := _members_keys(broker, list(steps[0].messages) if steps else [])) is not None:
        basis = f"keys:{','.join(keys)}:{_shape(broker, steps)}"
    elif (job := _launching_job()) is not None:
        basis = f"job:{job}"
    else:
        return None
    return uuid.uuid5(_NAMESPACE, f"{kind}:{basis}").hex


def launch(
    broker: dramatiq.Broker,
    kind: str,
    steps: list[Step],
    *,
    delay: int | None,
    bulk: bool,
    key: str | None,
    on_id: Callable[[str], None],
) -> dict[str, str]:
    """Record the workflow of ``steps`` (unless a first launch did), give its id to ``on_id``,
    and send its first step; returns the ids a relaunch gave its messages (``{given: used}``)."""
    workflows = find_workflows(broker)
    steps = without_empty_steps(steps, ignores_pipe=lambda m: bool(option_of(broker, m, "pipe_ignore")))
    derived = launch_id(broker, kind, steps, key)
    given_first = list(steps[0].messages) if steps else []  # their delays are the annotated ones'
    ttl_ms = workflows.ttl_ms + max([0, *(d or 0 for d in _delays(given_first, delay))])
    workflow_id, renamed, first = _recorded(workflows, kind, steps, derived, ttl_ms, on_id)
    if derived is not None:
        first = [keyed_by_id(broker, message) for message in first]
    delays = _delays(first, delay)
    published: list[Message[Any]] = []
    bulk = bulk and not any(delays)
    try:
        _send(broker, workflows, first, delays, bulk, published)
    except Exception as exc:
        unsent = None if bulk or len(published) == len(first) else first[len(published)].message_id
        _abandon(broker, workflows, workflow_id, first, unsent, exc)
        raise
    workflows.backend.mark_sent(workflow_id, LAUNCHED, ttl_ms)
    return renamed


def _recorded(
    workflows: Workflows,
    kind: str,
    steps: list[Step],
    derived: str | None,
    ttl_ms: int,
    on_id: Callable[[str], None],
) -> tuple[str, dict[str, str], list[Message[Any]]]:
    """Record the workflow under ``derived`` (a new id when None), or find it recorded, giving
    ``on_id`` its id before the store is asked; returns its id, the ids its messages took
    (``{given: used}``) and the first step's messages to send.

    A record failed at launch (:func:`refused_at_launch`) is not this launch's workflow to resume:
    its members are cancelled in it for good. The launch starts anew under the next attempt's id
    (derived from ``derived`` and the attempt's number, so a retry of this one finds it again),
    its messages under new ids (a sent member of the refused launch, cancelled, keeps its own)."""
    workflow_id, given = derived, steps
    for attempt in range(1, MAX_ATTEMPTS + 1):
        record, first = annotate(kind, steps, workflow_id)
        on_id(str(record["id"]))
        if workflows.backend.create(record, ttl_ms):
            if not steps:  # only empty groups: nothing to run, done
                workflows.backend.set_state(str(record["id"]), "succeeded")
            return str(record["id"]), _ids(given, steps), first
        found = workflows.backend.get(str(workflow_id))
        if found is None:  # expired since the create: nothing of it is left to relaunch
            raise StoreUnavailable("the workflow's record is gone")
        if not refused_at_launch(found):
            return str(workflow_id), *_relaunch(kind, given, found)
        logger.info("workflow_launch_attempted_anew", extra={"workflow_id": workflow_id, "attempt": attempt})
        workflow_id = uuid.uuid5(_NAMESPACE, f"{derived}:attempt:{attempt}").hex
        steps = [
            Step([m.copy(message_id=uuid.uuid4().hex) for m in s.messages], s.mode, s.pipe) for s in given
        ]
    raise StoreUnavailable(f"the launch was refused {MAX_ATTEMPTS} times: launch it anew with another key")


def refused_at_launch(found: WorkflowRecord) -> bool:
    """Whether the workflow failed at its launch (its first step's publish refused: recorded by
    :func:`_abandon`), not while it ran (a member failed: a relaunch is the same workflow)."""
    if found.state != "failed" or found.launched:
        return False
    return found.failed is None or found.reasons.get(found.failed, "").startswith(NOT_SENT)


def _ids(given: list[Step], used: list[Step]) -> dict[str, str]:
    """``{given: used}``: the ids ``used`` gave the messages of ``given``, by their place."""
    return {
        old.message_id: new.message_id
        for step, again in zip(given, used, strict=True)
        for old, new in zip(step.messages, again.messages, strict=True)
        if old.message_id != new.message_id
    }


def _delays(first: list[Message[Any]], delay: int | None) -> list[int | None]:
    """Each first message waits the larger of the run's delay and its own, as Dramatiq's pipeline."""
    return [max(delay or 0, int(m.options.get("delay") or 0)) or None for m in first]


def _relaunch(
    kind: str, steps: list[Step], found: WorkflowRecord
) -> tuple[dict[str, str], list[Message[Any]]]:
    """A relaunch of the recorded workflow ``found``: its messages take the first launch's ids
    (``{given: used}``), and of its first step it sends none once the first launch sent them all
    (or the workflow ended), else those not counted as ended."""
    workflow_id = str(found.record["id"])
    logger.info(
        "workflow_relaunched",
        extra={"workflow_id": workflow_id, "launched": found.launched, "workflow_state": found.state},
    )
    recorded = with_recorded_ids(steps, found.record)
    _, first = annotate(kind, recorded, workflow_id)
    if found.launched or found.state != "running":
        return _ids(steps, recorded), []
    return _ids(steps, recorded), [m for m in first if m.message_id not in found.states]


def _send(
    broker: dramatiq.Broker,
    workflows: Workflows,
    first: list[Message[Any]],
    delays: list[int | None],
    bulk: bool,
    published: list[Message[Any]],
) -> None:
    """Publish ``first`` (each one published is added to ``published``, unless in ``bulk``: one
    pipelined publish); a member dropped as a duplicate ends as its original did."""
    if bulk:
        sent = send_bulk(first, broker=broker)  # type: ignore[arg-type]
    else:
        sent = []
        for message, d in zip(first, delays, strict=True):
            sent.append(broker.enqueue(message, delay=d))
            published.append(message)
    for member, outcome in zip(first, sent, strict=True):
        if outcome.options.get("duplicate"):
            workflows.duplicate_finished(broker, member)


def _abandon(
    broker: dramatiq.Broker,
    workflows: Workflows,
    workflow_id: str,
    first: list[Message[Any]],
    unsent: str | None,
    exc: Exception,
) -> None:
    """A publish of the launch failed: mark the first step's members cancelled in this workflow
    (those sent are then skipped), record it failed, naming the member not sent (``unsent``,
    unknown in a bulk send) and why, and attach its id to ``exc``. A store that does not answer
    leaves it as it is (logged): the caller has the id, to cancel it."""
    from jobsystem.workflows import mark_ttl_ms  # the module that imports this one

    exc.workflow_id = workflow_id  # type: ignore[attr-defined]
    exc.add_note(f"workflow_id: {workflow_id}")
    logger.warning("workflow_launch_failed", extra={"workflow_id": workflow_id, "error": type(exc).__name__})
    try:
        ids = [m.message_id for m in first]
        ttl_ms = mark_ttl_ms(broker, ids, workflows.cancel_ttl_ms)
        workflows.marks.mark_cancelled([(i, workflow_id) for i in ids], ttl_ms)
        if unsent is not None:
            reason = f"{NOT_SENT} ({type(exc).__name__})"
            workflows.backend.finish(workflow_id, 0, unsent, "failed", "", workflows.ttl_ms, reason)
        workflows.backend.set_state(workflow_id, "failed")
    except Exception as store_exc:
        log_outage(logger, logging.ERROR, "workflow_launch_unrecorded", store_exc, workflow_id=workflow_id)
