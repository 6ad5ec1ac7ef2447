"""``workflow_status`` (``jobctl status WORKFLOW_ID``) reads its members' job status records in
batches, not one store call per member; on both store backends, in process."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest

from jobsystem import workflows as workflow_module
from jobsystem.store import StateStore
from jobsystem.workflows import group, workflow_status
from middleware.status import Status
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery

TTL = 60_000


class CountingStatus:
    """The status backend's reads, counted: ``get`` (one call per record) and ``get_many``."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.gets = 0
        self.batches: list[int] = []

    def get(self, message_id: str) -> Any:
        self.gets += 1
        return self.backend.get(message_id)

    def get_many(self, message_ids: list[str]) -> Any:
        self.batches.append(len(message_ids))
        return self.backend.get_many(message_ids)


def started_group(store: StateStore, size: int, finished: int) -> tuple[RecordingBroker, Status, str]:
    """A group of ``size`` members sent (status ``queued``), the first ``finished`` counted as
    succeeded; returns the broker, the Status middleware and the workflow id."""
    status = Status(store)
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[workflows, status])
    job = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda i: i)
    fan_out = group([job.message(i) for i in range(size)], broker=broker).run()
    for message, _ in broker.enqueued[:finished]:
        workflows.after_process_message(broker, delivery(message), result=1)
    assert status.flush(10)
    return broker, status, str(fan_out.workflow_id)


@pytest.mark.parametrize(("chunk", "batches"), [(10_000, [40]), (15, [15, 15, 10])])
def test_a_groups_status_reads_its_members_records_in_batches(store, monkeypatch, chunk, batches):
    broker, status, workflow_id = started_group(store, size=50, finished=10)
    monkeypatch.setattr(workflow_module, "STATUS_CHUNK", chunk, raising=False)
    counting = CountingStatus(status.backend)
    monkeypatch.setattr(status, "backend", counting)
    try:
        flow = workflow_status(workflow_id, broker=broker)
    finally:
        status.writes.stop()
    assert flow is not None
    states = [m["state"] for m in flow["steps"][0]["members"]]
    assert states == ["succeeded"] * 10 + ["queued"] * 40
    # The counted members need no record; the others are read in batches, none one by one.
    assert counting.gets == 0 and counting.batches == batches
