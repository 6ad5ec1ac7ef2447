"""Workflows in the state store.

A workflow (a pipeline, a group, a chord) is a record of its steps, each a list of member message
ids, with the final state of each member and its JSON result. A member's end is counted with
:meth:`WorkflowBackend.finish`: one atomic operation (a Lua script on Redis, a ``BEGIN IMMEDIATE``
transaction on SQLite) that adds the member to its step's SET of finished ids, so a member that
is retried or delivered twice is counted once, and answers whether the step is now complete.

Redis: the hash ``wf:<id>`` (``record``, ``state``, ``failed``, ``steps``, per step ``size:<i>``,
``mode:<i>``, counters ``c:<i>:<state>``, ``by:<i>`` (the member that completed it) and
``sent:<i>``, per member ``s:<id>``, ``r:<id>`` and, for one that failed for a reason of the
workflow's own (a result too large to hand on), ``e:<id>``) and the set ``wf:<id>:done:<i>``.
On Redis in :mod:`jobsystem.store.workflows_redis`; SQLite: the same fields as rows, in
:mod:`jobsystem.store.workflows_sqlite`. Ids are UUIDs: no
personal data in a key name.
Cancellation marks are in :mod:`jobsystem.store.cancel_marks`; the arrival check of a
workflow's member reads its marks (by id, and its pair's in this workflow) and its workflow's
state in one call (:meth:`WorkflowBackend.cancelled_among`), since the marks may expire before the
member arrives. A pair's mark in another workflow does not stop it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobsystem.store.base import Backends, StateStore

__all__ = [
    "LAUNCHED",
    "Arrival",
    "StepProgress",
    "WorkflowBackend",
    "WorkflowRecord",
    "initial_fields",
    "parse_fields",
    "workflow_backend",
]

#: An arrival asked about on a cancellation check: its message id, and its workflow's id when it
#: is a workflow's member (one message may be a member of several workflows).
Arrival = tuple[str, str | None]

#: The step number :meth:`WorkflowBackend.mark_sent` is given once the first step was sent in
#: full (``sent:-1``): a relaunch of the workflow then sends nothing.
LAUNCHED = -1

#: A step's mode: its members must all succeed (a chord), or only finish (a "finished" callback).
MODES = ("success", "finished")


@dataclass(frozen=True)
class StepProgress:
    """What :meth:`WorkflowBackend.finish` answers."""

    #: The workflow's state after the call: running, succeeded, failed, cancelled (or unknown).
    state: str
    #: Whether this call counted the member (False: it was counted before).
    added: bool
    finished: int
    size: int
    #: How many of the step's members ended in each state (succeeded, dead, cancelled).
    counts: dict[str, int] = field(default_factory=dict)
    #: Whether the step after this one was sent already (:meth:`WorkflowBackend.mark_sent`).
    sent: bool = False
    #: Whether the step is complete and this member is the one whose end completed it (true of
    #: every member of a step completed by a release that did not record it).
    completer: bool = False

    @property
    def complete(self) -> bool:
        return self.size > 0 and self.finished >= self.size

    @property
    def send_next(self) -> bool:
        """Whether the caller is to send the next step: the step is complete, the workflow still
        runs, and this call completed it (exactly one caller), or this is the completing member
        again while the step is not noted as sent (its worker died or its publish failed, and its
        delivery came back). Another member delivered again (its worker died before acking it)
        must not send: its run can end while the completer is still sending, and a second publish
        would be a duplicate message of the next step."""
        return self.complete and self.state == "running" and self.completer and (self.added or not self.sent)


@dataclass(frozen=True)
class WorkflowRecord:
    """A workflow as read: its record (id, kind, steps and members), state, the failed member,
    and the final states and results of its members by message id."""

    record: dict[str, Any]
    state: str
    failed: str | None
    states: dict[str, str]
    results: dict[str, Any]
    #: The members whose result was kept (recorded empty: too large to keep, or not JSON).
    kept: frozenset[str] = frozenset()
    #: Why a member failed, when the workflow failed it (its result could not be handed on).
    reasons: dict[str, str] = field(default_factory=dict)
    #: Whether its first step was sent in full (``mark_sent(id, LAUNCHED, ...)``).
    launched: bool = False

    def step_results(self, step: int) -> list[Any]:
        """The results of step ``step``'s members, in the step's order."""
        return [self.results.get(m["id"]) for m in self.record["steps"][step]["members"]]


def _loads(raw: str | None) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def parse_fields(fields: Mapping[str, str]) -> WorkflowRecord | None:
    if "record" not in fields:
        return None
    states = {k[2:]: v for k, v in fields.items() if k.startswith("s:")}
    results = {k[2:]: _loads(v) for k, v in fields.items() if k.startswith("r:")}
    kept = frozenset(k[2:] for k, v in fields.items() if k.startswith("r:") and v)
    reasons = {k[2:]: v for k, v in fields.items() if k.startswith("e:")}
    return WorkflowRecord(
        json.loads(fields["record"]),
        fields.get("state", "running"),
        fields.get("failed") or None,
        states,
        results,
        kept,
        reasons,
        f"sent:{LAUNCHED}" in fields,
    )


def initial_fields(record: dict[str, Any]) -> dict[str, str]:
    steps = record["steps"]
    fields = {"record": json.dumps(record), "state": "running", "steps": str(len(steps))}
    for i, step in enumerate(steps):
        fields[f"size:{i}"] = str(len(step["members"]))
        fields[f"mode:{i}"] = step.get("mode", "success")
    return fields


class WorkflowBackend(ABC):
    """The workflow operations, one implementation per store backend."""

    @abstractmethod
    def create(self, record: dict[str, Any], ttl_ms: int) -> bool:
        """Store a new workflow ``record`` (``id``, ``kind``, ``steps``: each ``members`` and
        ``mode``) unless one with its id lives; returns whether it did (False: a relaunch)."""

    @abstractmethod
    def finish(
        self,
        workflow_id: str,
        step: int,
        member: str,
        state: str,
        result: str,
        ttl_ms: int,
        reason: str = "",
        *,
        replayed: bool = False,
    ) -> StepProgress:
        """Count ``member`` of ``step`` as ended in ``state`` (succeeded, dead, cancelled, failed)
        with its JSON ``result`` (and why it failed, ``reason``), once however often it is called,
        but for a member counted ``dead`` that is ``replayed`` from the dead letters and succeeded:
        it is counted again, as succeeded, and a workflow it failed runs again once no member of
        its step is left unsucceeded (another one left is named failed instead), with this member
        as the step's completer (it sends the next step, as Dramatiq's replayed pipelines go on).
        A member that did not succeed fails the workflow unless its step's mode is ``finished``;
        the last step complete succeeds it. A member ending ``succeeded`` that carries a
        cancellation mark (by id, or its pair's in this workflow: a cancel of another workflow
        it is a member of too does not count) counts as ``cancelled``: it was cancelled while it
        ran and returned before the mark could interrupt it, and its step must not be handed on
        as if it had not been cancelled."""

    @abstractmethod
    def fail_member(self, workflow_id: str, step: int, member: str, reason: str, ttl_ms: int) -> None:
        """Record ``member`` of ``step``, counted already, as ``failed`` for ``reason`` (the next
        step it completed was refused at send for good), and a running workflow as failed by it.
        Its step's counters follow (one fewer in its earlier state). Nothing when the workflow
        is unknown or expired."""

    @abstractmethod
    def keep(self, workflow_id: str, step: int, ttl_ms: int) -> None:
        """Keep the workflow, and ``step``'s finished members, ``ttl_ms`` from now at least (never
        shortened): a member re-enqueued with a delay must find them when it ends."""

    @abstractmethod
    def mark_sent(self, workflow_id: str, step: int, ttl_ms: int) -> None:
        """Note that the step after ``step`` was sent."""

    @abstractmethod
    def get(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow, or None when unknown or expired."""

    @abstractmethod
    def set_state(self, workflow_id: str, state: str, *, only_from: str = "running") -> bool:
        """Move the workflow to ``state`` if it is in ``only_from``; returns whether it moved."""

    def cancelled_among(self, arrivals: Sequence[Arrival]) -> list[bool]:
        """For each arrival (a message id, and its workflow's id when it is a workflow's member)
        whether it is to be skipped as cancelled, in one round trip: it carries a cancellation
        mark by id, or, as a member, its pair's mark in its own workflow (not another's), or it is
        a member whose workflow is recorded cancelled and has not counted it as ended otherwise.
        A mark lives ``CANCEL_TTL_MS``; the record lives as long as its workflow
        may still send or receive a step (a step sent, after the cancel, delayed past the marks'
        TTL arrives with no mark left). A member counted succeeded or dead before the cancel is
        not stopped by it (the cancel marked only those not yet finished), so a redelivery of it
        is not either. Each (member, workflow) pair is answered for its own workflow: one message
        may be a member of two workflows, and a batch may hold an arrival in each."""
        ids = list(dict.fromkeys(m for m, _ in arrivals))
        pairs = list(dict.fromkeys((m, w) for m, w in arrivals if w is not None))
        marked, stopped = self._cancelled(ids, pairs) if ids else (set(), set())
        return [m in marked or (m, w) in stopped for m, w in arrivals]

    @abstractmethod
    def _cancelled(
        self, ids: list[str], pairs: list[tuple[str, str]]
    ) -> tuple[set[str], set[tuple[str, str]]]:
        """In one round trip: which of ``ids`` carry a mark, and which (member, workflow) pairs
        of ``pairs`` are stopped by their own mark or their workflow recorded cancelled (see
        :meth:`cancelled_among`)."""


def workflow_backend(store: StateStore) -> WorkflowBackend:
    """The workflow operations for ``store``'s backend."""
    # Imported here: the Redis and SQLite modules build on this one's types.
    from jobsystem.store.workflows_redis import RedisWorkflows
    from jobsystem.store.workflows_sqlite import SqliteWorkflows

    return store.operations(Backends(redis=RedisWorkflows, sqlite=SqliteWorkflows))
