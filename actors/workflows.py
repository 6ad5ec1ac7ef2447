"""Workflows and cancellation, the public API: ``pipeline``, ``group`` (and a group as a step of a
pipeline, a chord), ``cancel``, ``workflow_status`` and ``JobCancelled``.

    from actors.workflows import group, pipeline, cancel

    pipeline([add.message(1, 2), add.message(10)]).run().get_result(block=True)       # 13
    pipeline([group([square.message(i) for i in range(5)]), total.message()]).run()  # a chord
    cancel(message_id_or_workflow_id)

How it works is in ``docs/architecture.md`` ("Workflows and cancellation").
"""

from jobsystem.runtime.cancellation import JobCancelled
from jobsystem.workflows import cancel, group, pipeline, workflow_status

__all__ = ["JobCancelled", "cancel", "group", "pipeline", "workflow_status"]
