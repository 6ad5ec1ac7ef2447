"""``check_health``: the queue health check as a job, alerting on conditions as they open.

The check itself is :mod:`jobsystem.ops.health` (``jobctl health`` runs it too); alerts are
:mod:`jobsystem.ops.alerts`. The reference schedule ``queue-health-check`` sends it every minute.
"""

from __future__ import annotations

import dramatiq

from jobsystem.observability.logs import get_logger
from jobsystem.ops.alerts import alert
from jobsystem.ops.deadline import Deadline
from jobsystem.ops.health import check
from jobsystem.ops.queue_names import resolve_queues
from jobsystem.system import get_system

logger = get_logger(__name__)


@dramatiq.actor(queue_name=get_system().settings.queue("health"), max_retries=0, time_limit=120_000)
def check_health(queues: list[str] | None = None) -> str:
    """Check the queues (all declared ones by default) and alert on new degraded conditions.

    On a queue of its own, so a backed-up work queue does not hold up the check that reports it.
    Returns the overall status.
    """
    system = get_system()
    deadline = Deadline(5.0)  # the names' look-up and the check share one time limit
    checked = resolve_queues(system.settings, system.broker, queues, deadline=deadline)
    report = check(checked, config=system.settings, state=system.store, deadline=deadline)
    logger.info(
        "health_checked", status=report.status, degraded=[h.queue for h in report.queues if h.problems]
    )
    alert(report, state=system.store, settings=system.settings)
    return report.status
