"""The report actors in-process: what a message may ask for, files written whole or not at all,
the purge, and the mail that tells a user their report failed."""

from __future__ import annotations

import os
import time
from datetime import date

import pytest

from actors import emails, reports
from middleware.idempotency import DuplicateMessage, Idempotency
from tests.unit.stub import RecordingBroker


def fails_at_once(exc: BaseException) -> bool:
    """Whether ``exc`` is one of ``generate_report``'s ``throws``: dead-lettered without a retry."""
    return isinstance(exc, reports.generate_report.options.get("throws") or ())


def test_sample_rows_are_deterministic():
    assert reports.sample_rows("sales", date(2026, 1, 1)) == reports.sample_rows("sales", date(2026, 1, 1))
    assert reports.sample_rows("sales", date(2026, 1, 1)) != reports.sample_rows("sales", date(2026, 1, 2))


@pytest.mark.parametrize(
    ("kind", "rows", "day"),
    [
        ("../../escaped", None, "2026-11-02"),  # a file name outside REPORTS_DIR
        ("sales/../../escaped", None, "2026-11-02"),
        ("", None, "2026-11-02"),
        ("sales", [{"region": "north"}, {"unexpected": "column"}], "2026-11-02"),  # csv's ValueError
        ("sales", ["escaped"], "2026-11-02"),
        ("sales", None, "2026-13-45"),
    ],
)
def test_a_report_that_can_never_be_written_fails_at_once_and_writes_nothing(
    actor_settings, tmp_path, kind, rows, day
):
    actor_settings(reports_dir=tmp_path / "a" / "reports")
    with pytest.raises(Exception) as caught:
        reports.generate_report(kind, rows=rows, day=day)
    assert fails_at_once(caught.value), repr(caught.value)
    assert "escaped" not in str(caught.value) and "unexpected" not in str(caught.value)
    assert [path for path in tmp_path.rglob("*") if path.is_file()] == []


def test_a_failed_write_leaves_no_partial_file(tmp_path):
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("the disk filled up")

    rows = [{"amount": "1.00"}] * 1000 + [{"amount": Unprintable()}]
    with pytest.raises(RuntimeError):
        reports.write_csv(tmp_path / "sales.csv", rows)
    assert list(tmp_path.iterdir()) == []


def test_the_purge_removes_old_reports_and_partial_files_left_by_killed_jobs(actor_settings, tmp_path):
    actor_settings()
    folder = tmp_path / "reports"
    folder.mkdir()
    old = time.time() - 25 * 3600
    for name in ("old.csv", "old.partial", "old.5f2b9c.partial", "new.csv", "new.5f2b9c.partial"):
        (folder / name).write_text("region\nnorth\n")
        if name.startswith("old"):
            os.utime(folder / name, (old, old))
    assert reports.purge_exports(24) == 3
    assert sorted(path.name for path in folder.iterdir()) == ["new.5f2b9c.partial", "new.csv"]


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
