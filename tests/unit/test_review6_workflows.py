"""Review of workflows under faults (strict xfails: each fails today because of the fault named in
its reason, and passes once it is fixed). In process, on both store backends.

- each member carries the whole next step: a group followed by a group grows as their product."""

from __future__ import annotations

from typing import Any

import pytest

from jobsystem.runtime.workflow_steps import Step, annotate
from jobsystem.store import StateStore
from tests.unit.stub import RecordingBroker
from tests.unit.workflow_brokers import workflow_broker


def fault(reason: str) -> pytest.MarkDecorator:
    """A fault found by the review: the test fails until it is fixed (then it must pass)."""
    return pytest.mark.xfail(strict=True, reason=reason)


def _sent(broker: RecordingBroker) -> list[tuple[str, tuple[Any, ...]]]:
    return [(m.actor_name, tuple(m.args)) for m, _ in broker.enqueued]


@fault(
    "every member of a step carries the whole next step in its `workflow` option (and each "
    "of those the step after): a pipeline of group(N) then group(M) publishes N x M message copies, "
    "~49 KB per member at 100 x 100 and ~0.5 GB in all at 1000 x 1000, for one run()",
)
def test_a_member_carries_its_next_steps_in_a_size_that_does_not_grow_with_them(store: StateStore) -> None:
    square, total = workflow_broker(store)[2:]
    fetch, parse = ([square.message(i) for i in range(100)] for _ in "ab")
    _, first = annotate(
        "chord", [Step(fetch, pipe="list"), Step(parse, pipe="list"), Step([total.message()])]
    )
    plain = len(square.message(0).encode())
    assert len(first[0].encode()) < 20 * plain, len(first[0].encode())
