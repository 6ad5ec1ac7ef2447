"""What the workflow integration tests share: a workflow's recorded state, its results, and
``jobctl`` run as an operator runs it."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from dramatiq.results import ResultBackend

from actors.workflows import group, pipeline, workflow_status
from tests.queues import Queues
from tests.support import BIN, ROOT, TEST_REDIS_URL

__all__ = ["flow_state", "jobctl", "launched", "member_state", "recorded", "run_backend"]


def flow_state(sender: Queues, workflow_id: str) -> str | None:
    flow = workflow_status(workflow_id, broker=sender.broker)
    return flow["state"] if flow else None


def member_state(sender: Queues, workflow_id: str, step: int) -> str:
    """The state of the one member of step ``step``, as ``workflow_status`` shows it."""
    flow = workflow_status(workflow_id, broker=sender.broker)
    assert flow is not None, f"no record of workflow {workflow_id}"
    (member,) = flow["steps"][step]["members"]
    state: str = member["state"]
    return state


def launched(flow: group | pipeline) -> str:
    """The id ``run()`` gave ``flow`` (its ``workflow_id`` is None only before it runs)."""
    assert flow.workflow_id is not None, "the workflow was never run"
    return flow.workflow_id


def recorded(queues: Queues, flow: group | pipeline) -> dict[str, Any]:
    """``flow``'s workflow status: recorded before its first message is sent, so never missing."""
    found = workflow_status(launched(flow), broker=queues.broker)
    assert found is not None, f"no record of workflow {flow.workflow_id}"
    return found


def run_backend(sender: Queues) -> ResultBackend:
    return sender.broker.get_results_backend()


def jobctl(prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUEUE_PREFIX": prefix, "STATE_URL": TEST_REDIS_URL, "LOG_LEVEL": "WARNING"}
    return subprocess.run(
        [str(BIN / "jobctl"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
