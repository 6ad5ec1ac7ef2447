"""Review of today's merges, health: ``jobctl health --queue`` with a queue of this environment
named whole (``QUEUE_PREFIX`` included) that no actor of jobctl's declares, another service's
queue in this environment, as monitoring configured before today names it. fix/fixscope's
``own_queue`` takes a name whole only when it is an actor's queue, so the check adds the prefix a
second time and looks for a queue that does not exist.

A health check only reads, so a name RabbitMQ has whole (and not prefixed) is checked as given
(:func:`jobsystem.ops.queue_names.named_queues`). The queue is declared under the test's prefix
and deleted with it.
"""

from __future__ import annotations

import json

from tests.jobctl_run import jobctl
from tests.queues import Queues


def test_a_queue_of_this_environment_named_whole_is_the_one_checked(queues: Queues, prefix: str) -> None:
    theirs = prefix + "billing_service"
    queues.broker.channel.queue_declare(theirs, durable=True)

    result = jobctl(prefix, "health", "--queue", theirs, "--json", check=False)

    assert result.returncode != 2, result.stdout + result.stderr
    assert [q["queue"] for q in json.loads(result.stdout)["queues"]] == [theirs]
