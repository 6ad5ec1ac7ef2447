"""The lease renewer survives any error of a renewal: it logs it by class and renews on.

It ended on anything but ``StoreUnavailable`` (a Redis error reply the store did not wrap, a bug
in a backend): it started again only with the process's next new lease, and meanwhile a long
job's lease lapsed and another worker could claim and run the same key beside it (review 6).
"""

from __future__ import annotations

import logging
import threading

import pytest
import redis

from jobsystem.runtime.leases import HeldLeases

#: The longest a test waits for the renewer's next turns (it renews every few milliseconds here).
RENEWED_WITHIN_S = 10.0


class FailingRenewals:
    """A store's renew whose first calls raise ``errors`` in turn; the later ones are noted."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.renewed: list[list[tuple[str, str]]] = []
        self.done = threading.Event()

    def __call__(self, claims: list[tuple[str, str]], lease_ms: int) -> None:
        if self.errors:
            raise self.errors.pop(0)
        self.renewed.append(claims)
        self.done.set()


def test_the_renewer_keeps_renewing_after_unexpected_errors(caplog: pytest.LogCaptureFixture) -> None:
    renew = FailingRenewals(
        ValueError("bad value for key order-7 of ada@example.com"),
        redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"),
    )
    leases = HeldLeases(renew, lease_ms=30)
    caplog.set_level(logging.DEBUG, logger="jobsystem.runtime.leases")
    try:
        leases.hold("order-7", "owner-1")
        assert renew.done.wait(RENEWED_WITHIN_S), "the renewer stopped renewing after an error"
    finally:
        leases.stop()
    assert renew.renewed[0] == [("order-7", "owner-1")]
    failed = [r for r in caplog.records if r.getMessage() == "lease_renewal_failed"]
    assert [(r.levelno, r.error) for r in failed] == [  # type: ignore[attr-defined]
        (logging.ERROR, "ValueError"),
        (logging.ERROR, "ResponseError"),
    ]
    assert all("ada@example.com" not in str(vars(r)) for r in failed)  # its text at DEBUG only
