"""Pipelines, groups and chords on the state store, their status, and cancellation.

``pipeline`` and ``group`` behave like Dramatiq's (``run()``, ``get_result``/``get_results``,
``add_completion_callback``) and add what Dramatiq lacks: a group as a step of a pipeline (a
chord: the next step gets the members' results in the group's order once every member
succeeded) and a group callback run once every member *finished* (``on_finish``: it gets the
counts). Every run is a workflow with an id (``workflow_id``), recorded in the state store, whose
steps and members ``workflow_status`` (``jobctl status``) shows. The counting is done by the
:class:`~middleware.workflows.Workflows` middleware in the workers. ``actors.workflows`` is the
public face of this module.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import dramatiq
from dramatiq import Message
from dramatiq.results.backend import DEFAULT_TIMEOUT

from jobsystem.runtime.workflow_steps import Step
from jobsystem.store.cancel_marks import Mark
from jobsystem.store.status_records import JobStatus
from jobsystem.workflow_launch import launch
from jobsystem.workflow_results import failed_member, unless_ended
from middleware.results import StoreResults
from middleware.status import Status, find_status
from middleware.workflows import Workflows, find_workflows

__all__ = ["cancel", "group", "pipeline", "workflow_status"]


def _results_backend(broker: dramatiq.Broker) -> Any:
    for middleware in broker.middleware:
        if isinstance(middleware, StoreResults):
            return middleware.backend
    raise RuntimeError("this broker has no Results middleware")


class group:
    """Run messages in parallel, like Dramatiq's ``group``; also a step of a :class:`pipeline`.

    Parameters:
      children: the messages (a group of groups or of pipelines is not supported).
      broker: the broker to send on (default: the global broker).
    """

    def __init__(self, children: Iterable[Message[Any]], *, broker: dramatiq.Broker | None = None) -> None:
        self.children = list(children)
        for child in self.children:
            if not isinstance(child, Message):
                raise NotImplementedError("a group's members must be messages")
        self.broker = broker or dramatiq.get_broker()
        self.completion_callbacks: list[Message[Any]] = []
        self.finish_callbacks: list[Message[Any]] = []
        self.workflow_id: str | None = None

    def __len__(self) -> int:
        return len(self.children)

    def add_completion_callback(self, message: Message[Any]) -> None:
        """Run ``message`` once every member succeeded (not if one ends in the dead letters)."""
        self.completion_callbacks.append(message.copy(options={"pipe_ignore": True}))

    def on_finish(self, message: Message[Any]) -> None:
        """Run ``message`` once every member finished, succeeded or not (at once for a group of
        no members); it gets as its last argument the counts ``{"succeeded": n, "dead": n,
        "cancelled": n}``."""
        self.finish_callbacks.append(message)

    def steps(self) -> list[Step]:
        if self.completion_callbacks and self.finish_callbacks:
            raise NotImplementedError("a group has completion callbacks or finish callbacks, not both")
        if self.finish_callbacks:
            return [Step(self.children, "finished", "counts"), Step(self.finish_callbacks)]
        steps = [Step(self.children, "success", "list")]
        return steps + ([Step(self.completion_callbacks)] if self.completion_callbacks else [])

    def run(self, *, delay: int | None = None, bulk: bool = False, key: str | None = None) -> group:
        """Send the members (``bulk``: in one pipelined, confirmed publish); returns the group.

        Run again with the same ``key``, the same members' idempotency keys, or by the same job
        redelivered, it is the same workflow (see :mod:`jobsystem.workflow_launch`): its messages
        then take the ids the first launch's had (``children`` has them once it returns)."""
        renamed = launch(
            self.broker, "group", self.steps(), delay=delay, bulk=bulk, key=key, on_id=self._launched
        )
        self.children = _renamed(self.children, renamed)
        return self

    def _launched(self, workflow_id: str) -> None:
        self.workflow_id = workflow_id

    def get_results(self, *, block: bool = False, timeout: int | None = None) -> Iterator[Any]:
        """The members' results in order (their actors must store results), as Dramatiq's."""
        backend = _results_backend(self.broker)
        deadline = time.monotonic() + (DEFAULT_TIMEOUT if timeout is None else timeout) / 1000
        for child in self.children:
            left = max(0, int((deadline - time.monotonic()) * 1000))
            yield child.get_result(backend=backend, block=block, timeout=left)

    def wait(self, *, timeout: int | None = None) -> None:
        for _ in self.get_results(block=True, timeout=timeout):
            pass


class pipeline:
    """Run steps one after another, each result the next step's last positional argument, like
    Dramatiq's ``pipeline``; a :class:`group` as a step runs its members in parallel and hands on
    the list of their results (a chord).

    Parameters:
      children: messages, groups and pipelines (flattened).
      broker: the broker to send on (default: the global broker).
    """

    def __init__(
        self, children: Iterable[Message[Any] | group | pipeline], *, broker: dramatiq.Broker | None = None
    ) -> None:
        self.children: list[Message[Any] | group] = []
        for child in children:
            if isinstance(child, pipeline):
                self.children.extend(child.children)
            elif isinstance(child, group):
                if child.completion_callbacks or child.finish_callbacks:
                    raise NotImplementedError("a group in a pipeline hands its results to the next step")
                self.children.append(child)
            else:
                self.children.append(child)
        self.broker = broker or dramatiq.get_broker()
        self.workflow_id: str | None = None

    def __len__(self) -> int:
        return len(self.children)

    @property
    def messages(self) -> list[Message[Any]]:
        """Every message of the pipeline, step by step."""
        return [m for c in self.children for m in (c.children if isinstance(c, group) else [c])]

    def run(self, *, delay: int | None = None, key: str | None = None) -> pipeline:
        """Send the first step; returns the pipeline. ``key``: as :meth:`group.run`'s."""
        steps = [
            Step(c.children, "success", "list") if isinstance(c, group) else Step([c], "success", "value")
            for c in self.children
        ]
        kind = "chord" if any(isinstance(c, group) for c in self.children) else "pipeline"
        renamed = launch(self.broker, kind, steps, delay=delay, bulk=False, key=key, on_id=self._launched)
        for child in self.children:
            if isinstance(child, group):
                child.children = _renamed(child.children, renamed)
        self.children = [c if isinstance(c, group) else _renamed([c], renamed)[0] for c in self.children]
        return self

    def _launched(self, workflow_id: str) -> None:
        self.workflow_id = workflow_id

    def get_result(self, *, block: bool = False, timeout: int | None = None) -> Any:
        """The last step's result (its actor must store results); a group's: the list of results.
        Raises ``ResultFailure`` once the workflow failed or was cancelled without one (see
        :func:`~jobsystem.workflow_results.unless_ended`)."""
        last = self.children[-1]

        def fetch(block: bool, timeout: int | None) -> Any:
            if isinstance(last, group):
                return list(last.get_results(block=block, timeout=timeout))
            return last.get_result(backend=_results_backend(self.broker), block=block, timeout=timeout)

        return unless_ended(self.broker, self.workflow_id, fetch, block=block, timeout=timeout)


def _renamed(messages: list[Message[Any]], ids: dict[str, str]) -> list[Message[Any]]:
    """``messages`` with the ids their launch gave them (``{given: used}``)."""
    return [
        m if ids.get(m.message_id, m.message_id) == m.message_id else m.copy(message_id=ids[m.message_id])
        for m in messages
    ]


def _member_state(final: str | None, status: Any) -> str:
    if final is not None:
        return final
    return status.state if status is not None else "waiting"


def workflow_status(workflow_id: str, *, broker: dramatiq.Broker | None = None) -> dict[str, Any] | None:
    """The workflow's state and each step's members with their states (a member not sent yet is
    ``waiting``), or None when unknown or expired. Raises ``StoreUnavailable``."""
    broker = broker or dramatiq.get_broker()
    found = find_workflows(broker).backend.get(workflow_id)
    if found is None:
        return None
    status = find_status(broker)
    # One batched read of the job status records, of the members the workflow has not counted as
    # ended (a group of 10,000: one round trip, not 10,000).
    unfinished = [
        m["id"] for step in found.record["steps"] for m in step["members"] if m["id"] not in found.states
    ]
    records = status_records(status, unfinished)
    steps = []
    for number, step in enumerate(found.record["steps"]):
        members = []
        for member in step["members"]:
            record = records.get(member["id"])
            shown = {**member, "state": _member_state(found.states.get(member["id"]), record)}
            if member["id"] in found.reasons:
                shown["reason"] = found.reasons[member["id"]]
            members.append(shown)
        steps.append({"step": number, "mode": step["mode"], "members": members})
    return {
        "workflow_id": workflow_id,
        "kind": found.record["kind"],
        "state": found.state,
        "failed_member": failed_member(found),
        "created_at": found.record.get("created_at"),
        "steps": steps,
    }


#: The most job status records read in one call (SQLite's host parameters, 32,766 by default).
STATUS_CHUNK = 10_000


def status_records(status: Status | None, message_ids: list[str]) -> dict[str, JobStatus]:
    """The job status records of ``message_ids`` that exist, in one call per ``STATUS_CHUNK``."""
    if status is None:
        return {}
    found: dict[str, JobStatus] = {}
    for start in range(0, len(message_ids), STATUS_CHUNK):
        found.update(status.backend.get_many(message_ids[start : start + STATUS_CHUNK]))
    return found


def cancel(*ids: str, broker: dramatiq.Broker | None = None) -> list[str]:
    """Cancel jobs by message id, or workflows by id (every member not yet finished).

    A message id is stopped wherever it runs. A workflow's members are stopped as its members
    only: each is marked with the pair (its message id, the workflow's id), so the same message
    in another workflow (a message given to two groups) or sent on its own runs on. Workers of
    the previous release read such a mark as a mark by id and stop the message everywhere, as
    they did before: during a rollout nothing of a cancelled workflow runs, at worst the copy
    in the other workflow is stopped too.

    A queued or delayed job is skipped when it arrives (a workflow's member also once its mark
    expired, while the workflow's record says cancelled); a running one has ``JobCancelled``
    raised in its thread (unless its actor is ``interruptible=False``). Returns the message ids
    marked. Raises ``StoreUnavailable`` when the state store does not answer. The marks are
    written before any workflow is recorded as cancelled: a failure between the two leaves
    members stopped under a workflow still shown running (the call raised; calling it again
    finishes), never a workflow shown cancelled whose members run on. A member counted between
    the two (cancelled, by its mark) fails the running workflow: the cancel then records it
    cancelled all the same.
    """
    broker = broker or dramatiq.get_broker()
    workflows: Workflows = find_workflows(broker)
    marks: list[Mark] = []
    cancelled: list[str] = []
    for given in ids:
        found = workflows.backend.get(given)
        if found is None:
            marks.append(given)
            continue
        members = [m["id"] for step in found.record["steps"] for m in step["members"]]
        marks.extend((m, given) for m in members if m not in found.states)
        cancelled.append(given)
    marked = [m if isinstance(m, str) else m[0] for m in marks]
    workflows.marks.mark_cancelled(marks, mark_ttl_ms(broker, marked, workflows.cancel_ttl_ms))
    for workflow_id in cancelled:
        _record_cancelled(workflows, workflow_id)
    return marked


def _record_cancelled(workflows: Workflows, workflow_id: str) -> None:
    """Move a running workflow to cancelled; also one that a member failed by being counted
    cancelled (its mark written, by this cancel or an earlier one, before the workflow's state)."""
    if workflows.backend.set_state(workflow_id, "cancelled"):
        return
    found = workflows.backend.get(workflow_id)
    if found is not None and found.state == "failed" and found.states.get(found.failed or "") == "cancelled":
        workflows.backend.set_state(workflow_id, "cancelled", only_from="failed")


def mark_ttl_ms(broker: dramatiq.Broker, message_ids: list[str], ttl_ms: int) -> int:
    """How long marks on ``message_ids`` must live: ``ttl_ms``, or past the due time of one
    scheduled further ahead (a job delayed 30 days arrives after a 7-day mark would be gone)."""
    status = find_status(broker)
    if status is None or not message_ids:
        return ttl_ms
    now = int(time.time() * 1000)
    dues = [record.due_at for record in status_records(status, message_ids).values() if record.due_at]
    return max([ttl_ms, *(due - now + ttl_ms for due in dues)])
