"""The Idempotency middleware on a recording broker, for its unit tests: one keyed actor, its
hooks called as the worker calls them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dramatiq

from jobsystem.dramatiq_internals import ProjectMessage
from jobsystem.runtime import claims_ahead
from jobsystem.store.base import StateStore
from middleware.idempotency import Idempotency
from tests.unit.stub import RecordingBroker

__all__ = ["Setup", "run", "sent_ahead", "set_up"]


class Setup:
    def __init__(self, store: StateStore) -> None:
        self.middleware = Idempotency(store, ttl_ms=60_000, lease_ms=10_000)
        self.broker = RecordingBroker(middleware=[self.middleware])

        def job(token: str, bad: bool = False) -> None: ...

        def key(token: str, bad: bool = False) -> str:
            if bad:
                raise ValueError("no key for this one")
            return token

        declare = dramatiq.actor(broker=self.broker, actor_name="job", queue_name="q", idempotency_key=key)
        self.actor = declare(job)

    def message(self, token: str = "t1", **kwargs: Any) -> Any:
        return self.actor.message(token, **kwargs)

    def state(self, token: str = "t1") -> str | None:
        record = self.middleware.lookup("job", token)
        return record.state if record else None

    def deferred(self) -> list[Any]:
        return [message for message, delay in self.broker.enqueued if delay]


def set_up(store: StateStore) -> Iterator[Setup]:
    """A :class:`Setup` on ``store``, its writer stopped and its broker closed after: the test
    modules' fixture ``idem``."""
    setup = Setup(store)
    yield setup
    setup.middleware.writes.stop()
    setup.broker.close()


def sent_ahead(proxy: ProjectMessage) -> claims_ahead.Ahead:
    """The claim the middleware sent ahead for ``proxy`` at receipt. The delivery keeps it as an
    ``object`` (dramatiq_internals knows none of the runtime's types): read back as what it is."""
    found = proxy.claim_ahead
    assert isinstance(found, claims_ahead.Ahead), f"no claim sent ahead: {found!r}"
    return found


def run(idem: Setup, proxy: Any, *, result: Any = None, exception: BaseException | None = None) -> None:
    """What the worker does for a message that is not skipped: before, (the actor), after."""
    idem.middleware.before_process_message(idem.broker, proxy)
    idem.middleware.after_process_message(idem.broker, proxy, result=result, exception=exception)
    assert idem.middleware.writes.flush(10)
