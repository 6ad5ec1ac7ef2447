"""How a workflow travels with its messages: the ``workflow`` option and the step after a member.

Each member message of a workflow carries the option :data:`WORKFLOW`: the workflow's id, its
step number, what the step hands on (``pipe``: ``value`` for one message, ``list`` for a group,
``counts`` for a group whose callback runs once every member finished) and, unless it is the
last step, ``next``: the next step's messages as Dramatiq encodes them (which carry their own
option in turn). Nothing of a workflow but ids, states and results is kept in the state store;
the messages' arguments travel in RabbitMQ only, as Dramatiq's pipelines do.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dramatiq import Message
from dramatiq.broker import Broker

from jobsystem.runtime.options import option_of

__all__ = [
    "WORKFLOW",
    "Step",
    "annotate",
    "keyed_by_id",
    "next_messages",
    "with_recorded_ids",
    "without_empty_steps",
]

#: The message option carrying a member's place in its workflow.
WORKFLOW = "workflow"


@dataclass(frozen=True)
class Step:
    """One step: its messages, whether all must succeed (``success``) or only finish
    (``finished``), and what it hands to the next step (``value``, ``list`` or ``counts``)."""

    messages: Sequence[Message[Any]]
    mode: str = "success"
    pipe: str = "value"


#: What a step of no members hands on, by its ``pipe``: no results, or nothing counted.
_EMPTY_PIPED: dict[str, Any] = {"list": [], "counts": {"succeeded": 0, "dead": 0, "cancelled": 0}}


def without_empty_steps(steps: list[Step], *, ignores_pipe: Callable[[Message[Any]], bool]) -> list[Step]:
    """``steps`` without those of no members (an empty group), each complete at once: no member
    would ever end to count it, and the steps after it travel in its members' messages. The step
    after one gets what it hands on (``[]``, or zero counts) now, and ignores the pipe of the step
    before (whose result is not its input)."""
    kept: list[Step] = []
    piped: list[Any] = []  # what the last empty step hands on, if the step before was one
    for step in steps:
        if piped:
            messages = [
                m if ignores_pipe(m) else m.copy(args=(*m.args, piped[0]), options={"pipe_ignore": True})
                for m in step.messages
            ]
            step = Step(messages, step.mode, step.pipe)
        piped = [] if step.messages else [_EMPTY_PIPED.get(step.pipe)]
        if step.messages:
            kept.append(step)
    return kept


def annotate(
    kind: str, steps: list[Step], workflow_id: str | None = None
) -> tuple[dict[str, Any], list[Message[Any]]]:
    """A new workflow of ``steps``: its record for the store and the first step's messages, each
    carrying the option :data:`WORKFLOW` (and through it every later step).

    ``workflow_id``: its id when derived from its launch (see :mod:`jobsystem.workflow_launch`).

    Raises ValueError when one message (one message id) is given twice: members are counted by
    id, so its step would never complete."""
    ids = [m.message_id for step in steps for m in step.messages]
    if len(set(ids)) != len(ids):
        raise ValueError(
            "a message is given more than once in this workflow: build one message per run "
            "([actor.message(...) for _ in range(n)], not [message] * n)"
        )
    workflow_id = workflow_id or uuid.uuid4().hex
    following: list[dict[str, Any]] | None = None
    first: list[Message[Any]] = []
    for number in reversed(range(len(steps))):
        step = steps[number]
        option: dict[str, Any] = {"id": workflow_id, "step": number, "pipe": step.pipe}
        if following is not None:
            option["next"] = following
        first = [m.copy(options={WORKFLOW: option}) for m in step.messages]
        following = [m.asdict() for m in first]
    record = {
        "id": workflow_id,
        "kind": kind,
        "created_at": int(time.time() * 1000),
        "steps": [
            {
                "mode": step.mode,
                "members": [
                    {"id": m.message_id, "actor": m.actor_name, "queue": m.queue_name} for m in step.messages
                ],
            }
            for step in steps
        ],
    }
    return record, first


def with_recorded_ids(steps: list[Step], record: dict[str, Any]) -> list[Step]:
    """``steps`` with the message ids of the workflow ``record`` a first launch made of them: a
    relaunch's messages are new objects with new ids, and members are counted by id.

    Raises ValueError when the steps are not those of the record (other members, in number or
    in their actors)."""
    recorded = [[member["id"] for member in step["members"]] for step in record["steps"]]
    actors = [[member.get("actor") for member in step["members"]] for step in record["steps"]]
    if [[m.actor_name for m in step.messages] for step in steps] != actors:
        raise ValueError("this workflow was launched before with other steps: its key or launch is reused")
    return [
        Step([m.copy(message_id=i) for m, i in zip(step.messages, ids, strict=True)], step.mode, step.pipe)
        for step, ids in zip(steps, recorded, strict=True)
    ]


def keyed_by_id(broker: Broker, message: Message[Any]) -> Message[Any]:
    """``message``, given an idempotency key made from its own id unless it has one: a step (or
    a relaunched first step) sent twice then still runs once (the copy is skipped at run)."""
    if message.options.get("idempotency_key") is None and not option_of(broker, message, "idempotency_key"):
        message.options["idempotency_key"] = f"workflow-step:{message.message_id}"
    return message


def next_messages(option: dict[str, Any], piped: Any, *, ignores_pipe: Any) -> list[Message[Any]]:
    """The next step's messages, ``piped`` appended to the arguments of each one that does not
    ignore it (``ignores_pipe(message)``: Dramatiq's ``pipe_ignore``, message or actor option).

    Each is dated now, when it is sent, not when the workflow was launched: an age limit
    (``max_age``) counts from here, or a step after a long one would arrive too old to run."""
    messages = []
    now = int(time.time() * 1000)
    for data in option.get("next") or []:
        message: Message[Any] = Message(**{**data, "message_timestamp": now})
        if not ignores_pipe(message):
            message = message.copy(args=(*message.args, piped))
        messages.append(message)
    return messages
