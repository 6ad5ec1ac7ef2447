"""Whether this thread is a RabbitMQ consumer's, publishing on its own (not a worker's).

A consumer publishes a few messages itself: a delayed message moved into the delay cascade, a
follow-up (a retry, a dead letter) that a worker decided and RabbitMQ refused. Those sends run
the middleware's ``before_enqueue`` hooks on the consumer's thread, which also takes every
delivery of its queue: a hook that waits there on the state store (a timeout of seconds during
an outage) holds up consuming. A hook whose store call is an extra (a workflow's record kept for
the delay, already kept when the same message was first sent) asks :func:`on_consumer_thread`
and leaves it out there. Middleware reads this module; the consumer sets it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["consumer_publishing", "on_consumer_thread"]

_state = threading.local()


@contextmanager
def consumer_publishing() -> Iterator[None]:
    """Mark this thread as a consumer's publishing on its own, for the block."""
    before = getattr(_state, "publishing", False)
    _state.publishing = True
    try:
        yield
    finally:
        _state.publishing = before


def on_consumer_thread() -> bool:
    """Whether this thread is in :func:`consumer_publishing`."""
    return bool(getattr(_state, "publishing", False))
