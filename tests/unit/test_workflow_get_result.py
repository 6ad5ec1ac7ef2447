"""Waiting for a workflow's result: ``pipeline.get_result`` answers a failed or cancelled workflow
with ``ResultFailure`` naming the member (not ``ResultTimeout`` after the whole timeout), and
``group.get_results(timeout=0)`` waits no longer than it was told. In process, on both store
backends."""

from __future__ import annotations

import threading
from typing import Any

import dramatiq
import pytest
from dramatiq.results import ResultFailure, ResultTimeout

from jobsystem.store import StateStore
from jobsystem.store.results import StoreResultBackend
from jobsystem.store.workflows import WorkflowRecord
from jobsystem.workflow_results import STATE_CHECK_MS
from jobsystem.workflows import cancel, group, pipeline
from middleware.results import StoreResults
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery
from tests.unit.workflow_brokers import TTL


class NotingBackend(StoreResultBackend):
    """The store's result backend, noting the timeout of each wait it is asked for."""

    def __init__(self, store: StateStore) -> None:
        super().__init__(store, scrub=lambda text: text)
        self.timeouts: list[int | None] = []

    def get_result(self, message: Any, *, block: bool = False, timeout: int | None = None) -> Any:
        self.timeouts.append(timeout)
        return super().get_result(message, block=block, timeout=timeout)


def _results_broker(store: StateStore) -> tuple[RecordingBroker, Workflows, NotingBackend, Any, Any]:
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    backend = NotingBackend(store)
    broker = RecordingBroker(middleware=[StoreResults(backend, result_ttl=TTL), workflows])
    square = dramatiq.actor(broker=broker, actor_name="square", queue_name="q", store_results=True)(
        lambda i: i * i
    )
    total = dramatiq.actor(broker=broker, actor_name="total", queue_name="q", store_results=True)(
        lambda result: result
    )
    return broker, workflows, backend, square, total


def _end(broker: RecordingBroker, workflows: Workflows, flow: pipeline, ending: str) -> None:
    """End the pipeline's first member as ``ending`` says: dead-lettered, or the workflow cancelled."""
    (first, _), *_ = broker.enqueued
    if ending == "dead":
        dead = delivery(first)
        dead.fail()
        workflows.after_nack(broker, dead)
    else:
        cancel(str(flow.workflow_id), broker=broker)


@pytest.mark.parametrize("ending", ["dead", "cancelled"])
def test_a_failed_or_cancelled_pipeline_answers_get_result_with_a_failure(
    store: StateStore, ending: str
) -> None:
    broker, workflows, _, square, total = _results_broker(store)
    flow = pipeline([square.message(2), total.message()], broker=broker).run()
    _end(broker, workflows, flow, ending)
    with pytest.raises(ResultFailure) as failure:
        flow.get_result(block=True, timeout=9_000)
    assert failure.value.orig_exc_type == {"dead": "WorkflowFailed", "cancelled": "WorkflowCancelled"}[ending]
    if ending == "dead":
        assert broker.enqueued[0][0].message_id in str(failure.value)


@pytest.mark.parametrize("block", [False, True])
def test_a_failed_chord_ending_in_a_group_answers_with_a_failure(store: StateStore, block: bool) -> None:
    broker, workflows, _, square, total = _results_broker(store)
    flow = pipeline(
        [square.message(2), group([total.message(), total.message()], broker=broker)], broker=broker
    ).run()
    _end(broker, workflows, flow, "dead")
    with pytest.raises(ResultFailure):
        flow.get_result(block=block, timeout=9_000)


def test_a_running_pipeline_still_times_out_and_one_that_ended_well_answers(store: StateStore) -> None:
    broker, _, _, square, total = _results_broker(store)
    flow = pipeline([square.message(2), total.message()], broker=broker).run()
    with pytest.raises(ResultTimeout):
        flow.get_result(block=True, timeout=0)
    broker.emit_after("process_message", delivery(broker.enqueued[0][0]), result=4)
    broker.emit_after("process_message", delivery(broker.enqueued[1][0]), result=4)
    assert flow.get_result(block=True, timeout=9_000) == 4


def test_get_results_with_timeout_zero_waits_zero(store: StateStore) -> None:
    broker, _, backend, square, _ = _results_broker(store)
    fan_out = group([square.message(1), square.message(2)], broker=broker).run()
    with pytest.raises(ResultTimeout):
        list(fan_out.get_results(block=True, timeout=0))
    assert backend.timeouts == [0]


def _noting_reads(workflows: Workflows) -> list[str]:
    """The workflow ids the state checks read, in order."""
    reads: list[str] = []
    read = workflows.backend.get

    def noted(workflow_id: str) -> WorkflowRecord | None:
        reads.append(workflow_id)
        return read(workflow_id)

    workflows.backend.get = noted  # type: ignore[method-assign]
    return reads


@pytest.mark.parametrize("timeout", [90, 1_300])
def test_a_wait_for_a_running_pipeline_reads_the_store_a_few_times(store: StateStore, timeout: int) -> None:
    """Dramatiq's wait gives up at once when its first pause (100-200 ms) would pass its end: a
    short wait (all of it) and the end of each wait of a long one were a loop of store reads."""
    broker, workflows, backend, square, total = _results_broker(store)
    flow = pipeline([square.message(2), total.message()], broker=broker).run()
    reads = _noting_reads(workflows)
    with pytest.raises(ResultTimeout):
        flow.get_result(block=True, timeout=timeout)
    # A first look, a wait of at most STATE_CHECK_MS or what is left, a last look: a state read each.
    assert len(reads) <= 2 + 2 * (timeout // STATE_CHECK_MS + 1), (len(reads), backend.timeouts[:6])
    assert len(backend.timeouts) == len(reads)


def test_a_result_stored_during_a_wait_is_returned(store: StateStore) -> None:
    broker, _, _, square, total = _results_broker(store)
    flow = pipeline([square.message(2), total.message()], broker=broker).run()
    broker.emit_after("process_message", delivery(broker.enqueued[0][0]), result=4)
    last = delivery(broker.enqueued[1][0])
    ends = threading.Timer(0.3, lambda: broker.emit_after("process_message", last, result=16))
    ends.start()
    try:
        assert flow.get_result(block=True, timeout=9_000) == 16
    finally:
        ends.join()
