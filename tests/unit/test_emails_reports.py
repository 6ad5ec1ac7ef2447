"""The report actors in-process: sample rows, and the mail that tells a user their report failed."""

from __future__ import annotations

from datetime import date

import pytest

from actors import emails, reports
from middleware.idempotency import DuplicateMessage, Idempotency
from tests.unit.stub import RecordingBroker


def test_sample_rows_are_deterministic():
    assert reports.sample_rows("sales", date(2026, 1, 1)) == reports.sample_rows("sales", date(2026, 1, 1))
    assert reports.sample_rows("sales", date(2026, 1, 1)) != reports.sample_rows("sales", date(2026, 1, 2))


def test_each_failed_report_mails_its_user_once(store, monkeypatch):
    # The user's second failed report within IDEMPOTENCY_TTL_MS was dropped as a duplicate mail.
    idempotency = Idempotency(store, ttl_ms=60_000, lease_ms=10_000)
    broker = RecordingBroker(middleware=[idempotency])
    broker.declare_actor(emails.send_email)
    monkeypatch.setattr(emails.send_email, "broker", broker)

    def dead_lettered(message_id: str) -> None:
        failure = ("generate_report", "non_retryable", "InvalidReport", "", ["sales"])
        reports.report_failed(message_id, *failure, {"email_to": "a@b.co"})

    try:
        dead_lettered("report-1")
        dead_lettered("report-2")
        with pytest.raises(DuplicateMessage):
            dead_lettered("report-1")  # the hook run again for the same report: no second mail
    finally:
        idempotency.writes.stop()
        broker.close()
    mails = [message.kwargs for message, _ in broker.enqueued]
    assert [(mail["to"], mail["context"]["job"]) for mail in mails] == [
        ("a@b.co", "report-1"),
        ("a@b.co", "report-2"),
    ]
