"""Review of ``jobsystem.workflow_results.unless_ended`` (fix/wfa): a busy loop on the store.

The module says the workflow's state is read "between waits of at most STATE_CHECK_MS". But
Dramatiq's polling backend gives up a wait at once when its first backoff (100-200 ms) would pass
the wait's end: the last 100-200 ms of every call (all of a short timeout) become a loop of one
result read and one workflow read with no pause, hundreds of store round trips a call.
"""

from __future__ import annotations

import pytest
from dramatiq.results import ResultTimeout

from jobsystem.store import StateStore
from jobsystem.store.workflows import WorkflowRecord
from jobsystem.workflows import pipeline
from tests.unit.test_workflow_get_result import _results_broker


@pytest.mark.xfail(
    strict=True,
    reason="a wait shorter than the first backoff (and the last 100-200 ms of any) spins on the store",
)
def test_a_short_wait_for_a_running_pipeline_reads_the_store_a_few_times(store: StateStore) -> None:
    broker, workflows, backend, square, total = _results_broker(store)
    flow = pipeline([square.message(2), total.message()], broker=broker).run()
    reads: list[str] = []
    read = workflows.backend.get

    def noted(workflow_id: str) -> WorkflowRecord | None:
        reads.append(workflow_id)
        return read(workflow_id)

    workflows.backend.get = noted  # type: ignore[method-assign]
    with pytest.raises(ResultTimeout):
        flow.get_result(block=True, timeout=90)  # shorter than Dramatiq's first backoff: spun whole
    # Dramatiq's own wait reads once here (its first pause would pass the end); a state check or two.
    assert len(reads) <= 5 and len(backend.timeouts) <= 5, (len(reads), backend.timeouts[-5:])
