"""The reference actors against a real SMTP server (aiosmtpd) and a real worker."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from actors import emails, reports
from tests.servers import free_port, smtp_server
from tests.support import wait_for


@pytest.fixture
def smtp():
    with smtp_server() as server:
        yield server


def test_email_is_delivered(start_worker, queues, smtp):
    port, received = smtp
    worker = start_worker(SMTP_URL=f"smtp://127.0.0.1:{port}", MAIL_FROM="shop@example.org")
    queues.send(emails.send_email, to="ana@example.com", template="welcome", context={"name": "Ana"})
    wait_for(lambda: received, what="the mail")
    wait_for(lambda: "job_succeeded" in worker.output(), what="the job's end")
    # The actor returns a value; Dramatiq's "no Results middleware" warning is not noise we keep.
    assert "Results middleware" not in worker.output()
    mail = received[0]
    assert mail["To"] == "ana@example.com"
    assert mail["From"] == "shop@example.org"
    assert mail["Subject"] == "Welcome, Ana"


@pytest.mark.parametrize("address", ["not-an-address", "bounce@example.com"])
def test_invalid_recipient_fails_at_once(start_worker, queues, smtp, address):
    port, received = smtp
    start_worker(SMTP_URL=f"smtp://127.0.0.1:{port}", JOB_MAX_RETRIES="5")
    queues.send(emails.send_email, to=address, template="welcome")
    dead = queues.name(emails.send_email) + ".DLQ"
    wait_for(lambda: queues.depth(dead) == 1, what="the dead letter")
    headers = queues.peek(dead)[0]["properties"]["headers"]
    assert headers["x-dl-attempts"] == 1  # never retried
    assert headers["x-dl-reason"] == "non_retryable"
    assert headers["x-dl-exception"] == "InvalidRecipient"
    assert received == []


def test_refused_connection_is_retried(start_worker, queues):
    start_worker(SMTP_URL=f"smtp://127.0.0.1:{free_port()}", JOB_MAX_RETRIES="2", JOB_MIN_BACKOFF_MS="100")
    queues.send(emails.send_email, to="ana@example.com", template="welcome")
    dead = queues.name(emails.send_email) + ".DLQ"
    wait_for(lambda: queues.depth(dead) == 1, what="the dead letter")
    dead_letter = queues.peek(dead)[0]
    headers = dead_letter["properties"]["headers"]
    assert headers["x-dl-attempts"] == 3 and headers["x-dl-reason"] == "retries_exhausted"
    assert "ConnectionRefusedError" in headers["x-dl-traceback"]
    assert json.loads(dead_letter["payload"])["options"]["retries"] == 3


def test_campaign_fans_out_one_mail_per_recipient(start_worker, queues, smtp):
    port, received = smtp
    worker = start_worker(SMTP_URL=f"smtp://127.0.0.1:{port}", threads=8)
    recipients = [f"user{i}@example.com" for i in range(60)]
    queues.send(emails.send_campaign, "spring", recipients, {"headline": "Spring sale", "text": "20% off"})
    queue = queues.name(emails.send_email)
    queues.wait_totals(queue, succeeded=61)  # the campaign and its 60 mails, each mailed once done
    assert queues.left_after_stop([worker], queue) == 0
    assert sorted(m["To"] for m in received) == sorted(recipients)
    assert {m["X-Campaign"] for m in received} == {"spring"}


def test_report_is_written_then_mailed(start_worker, queues, smtp, tmp_path):
    port, received = smtp
    start_worker(SMTP_URL=f"smtp://127.0.0.1:{port}")
    queues.send(reports.generate_report, "sales", email_to="boss@example.com", day="2026-11-02")
    wait_for(lambda: received, what="the report mail")
    files = list(Path(tmp_path / "reports").glob("sales-2026-11-02-*.csv"))
    assert len(files) == 1
    rows = list(csv.DictReader(files[0].open()))
    assert len(rows) == 50 and rows[0]["date"] == "2026-11-02"
    mail = received[0]
    assert mail["Subject"] == "Your sales report"
    attachment = next(p for p in mail.walk() if p.get_filename())
    assert attachment.get_filename() == files[0].name
    assert attachment.get_payload(decode=True) == files[0].read_bytes()


def test_a_campaign_sent_twice_mails_nobody_twice(start_worker, queues, smtp, prefix, state_url):
    from tests.senders import sender_broker

    port, received = smtp
    worker = start_worker(SMTP_URL=f"smtp://127.0.0.1:{port}", STATE_URL=state_url)
    keyed = queues.using(sender_broker(prefix, state_url))
    recipients = [f"fan{i}@example.com" for i in range(20)]
    keyed.send(emails.send_campaign, "autumn", recipients, {"headline": "Autumn"})
    queue = keyed.name(emails.send_email)
    keyed.wait_totals(queue, succeeded=21)  # the campaign and its 20 mails
    again = keyed.send(emails.send_campaign, "autumn", recipients, {"headline": "Autumn"})  # by mistake
    (record,) = keyed.wait_finished([again]).values()
    assert record.state == "succeeded"  # the second fan-out is done
    # Whatever it published has run or is still waiting: with the worker stopped, nothing is left.
    assert keyed.left_after_stop([worker], queue) == 0
    assert sorted(m["To"] for m in received) == sorted(recipients)


def test_each_dead_lettered_report_tells_its_user(start_worker, queues, smtp):
    port, received = smtp
    start_worker(SMTP_URL=f"smtp://127.0.0.1:{port}", JOB_MAX_RETRIES="5")
    bad_rows = [{"region": "north"}, {"unexpected": "column"}]  # a row with a column the first lacks
    sent = [
        queues.send(reports.generate_report, kind, rows=bad_rows, email_to="boss@example.com")
        for kind in ("sales", "stock")
    ]
    assert {record.state for record in queues.wait_finished(sent).values()} == {"dead"}
    wait_for(lambda: len(received) == 2, what="both failure mails")  # one user, two failed reports
    assert sorted(mail["Subject"] for mail in received) == [
        "Your sales report could not be made",
        "Your stock report could not be made",
    ]
    bodies = "".join(mail.get_payload(decode=True).decode() for mail in received)
    assert all(message.message_id in bodies for message in sent)
    dead = queues.peek(queues.name(reports.generate_report) + ".DLQ")
    assert len(dead) == 2
    for dead_letter in dead:  # bad rows fail at once: a retry would meet the same rows
        headers = dead_letter["properties"]["headers"]
        assert (headers["x-dl-reason"], headers["x-dl-attempts"]) == ("non_retryable", 1)
        assert headers["x-dl-exception"] == "InvalidReport"


def test_campaign_ends_with_one_summary_mail_to_its_owner(start_worker, queues, smtp):
    port, received = smtp
    worker = start_worker(SMTP_URL=f"smtp://127.0.0.1:{port}", threads=8, JOB_MAX_RETRIES="5")
    recipients = [f"user{i}@example.com" for i in range(48)] + ["not-an-address", "bounce@example.com"]
    queues.send(
        emails.send_campaign, "autumn", recipients, {"headline": "Autumn", "text": "hi"}, "boss@example.com"
    )

    def summaries() -> list[Any]:
        return [m for m in received if m["To"] == "boss@example.com"]

    wait_for(summaries, timeout=90, what="the summary mail")
    queue = queues.name(emails.send_email)
    # The campaign, 48 mails and the summary (its job and the mail it sends) succeeded; 2 are dead.
    queues.wait_totals(queue, succeeded=51, dead=2)
    assert queues.left_after_stop([worker], queue) == 0
    (summary,) = summaries()
    assert summary["Subject"] == "Campaign autumn: 48 sent, 2 failed"
    assert "48 sent, 2 failed" in summary.get_payload()
    assert sorted(m["To"] for m in received if m["To"] != "boss@example.com") == sorted(recipients[:48])
