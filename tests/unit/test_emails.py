"""``send_email`` in-process against a scripted SMTP server: which failures fail at once (the actor's
``throws``) and which are retried, attachments confined to ``REPORTS_DIR``, a mail the server
accepted counted as sent, and a time limit that leaves every SMTP round trip its timeout."""

from __future__ import annotations

import ssl

import pytest

from actors import emails
from jobsystem.settings import load_settings
from tests.servers import scripted_smtp, self_signed_certificate, server_tls

#: The SMTP round trips of one mail: connect, greeting, EHLO, STARTTLS, TLS handshake (2), EHLO,
#: AUTH (up to 3), MAIL, RCPT, DATA, the mail's end, QUIT.
ROUND_TRIPS = 15


def fails_at_once(exc: BaseException) -> bool:
    """Whether ``exc`` is one of ``send_email``'s ``throws``: dead-lettered without a retry."""
    return isinstance(exc, emails.send_email.options["throws"])


def send() -> str:
    return emails.send_email("ana@example.com", "welcome", {"name": "Ana"})


@pytest.mark.parametrize(
    ("replies", "permanent"),
    [
        ({"RCPT": "550 5.1.1 <ana@example.com>: no such user"}, True),
        ({"RCPT": "552 5.2.2 mailbox full"}, True),
        ({"RCPT": "550 no such user here"}, True),  # no enhanced code: 550 and 553 are the address's
        ({"RCPT": "553 mailbox name not allowed"}, True),
        ({"RCPT": "554 5.7.1 <ana@example.com>: Relay access denied"}, False),  # the relay's configuration
        ({"RCPT": "550 5.7.1 client not authorized"}, False),
        ({"RCPT": "450 4.2.1 try again later"}, False),
        ({"DATA": "552 5.3.4 message too big"}, True),
        ({"DATA": "554 transaction failed"}, True),
        ({"DATA": "550 5.1.1 no such user"}, True),
        ({"DATA": "554 5.7.1 rejected by policy"}, False),
        ({"DATA": "451 4.3.0 try again later"}, False),
        ({"MAIL": "553 5.1.8 sender domain unknown"}, False),  # MAIL_FROM: configuration
    ],
)
def test_a_refusal_fails_at_once_only_when_a_retry_cannot_help(actor_settings, replies, permanent):
    with scripted_smtp(replies) as (port, received):
        actor_settings(smtp_url=f"smtp://127.0.0.1:{port}")
        with pytest.raises(Exception) as caught:
            send()
    assert fails_at_once(caught.value) is permanent, repr(caught.value)
    assert received == []
    if permanent:
        assert "ana@example.com" not in str(caught.value)


def test_an_untrusted_relay_certificate_is_retried_not_taken_for_a_bad_mail(actor_settings, tmp_path):
    # ssl.SSLCertVerificationError is a ValueError: an expired certificate is the relay's to fix.
    cert, key = self_signed_certificate(tmp_path)
    with scripted_smtp(tls=server_tls(cert, key)) as (port, received):
        actor_settings(smtp_url=f"smtps://127.0.0.1:{port}")
        with pytest.raises(ssl.SSLCertVerificationError) as caught:
            send()
    assert not fails_at_once(caught.value)
    assert received == []


@pytest.mark.parametrize("quit_reply", ["554 5.0.0 not now", "hang"])
def test_a_mail_the_server_accepted_is_sent_whatever_happens_at_quit(actor_settings, quit_reply):
    # A failed job would be retried, and the retry would send the mail a second time.
    with scripted_smtp({"QUIT": quit_reply}) as (port, received):
        actor_settings(smtp_url=f"smtp://127.0.0.1:{port}", smtp_timeout=0.5)
        assert send() == "<local@jobs>"
    assert len(received) == 1


def test_an_attachment_outside_reports_dir_is_refused_unread(actor_settings, tmp_path):
    secret = tmp_path / "secret-environ"
    secret.write_text("API_KEY=hunter2\n")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "link.csv").symlink_to(secret)
    with scripted_smtp() as (port, received):
        actor_settings(smtp_url=f"smtp://127.0.0.1:{port}")
        for attachment in (str(secret), "../secret-environ", "link.csv", "/proc/self/environ", "a\x00b"):
            with pytest.raises(Exception) as caught:
                emails.send_email("ana@example.com", "report", {"kind": "sales"}, attachment=attachment)
            assert fails_at_once(caught.value), repr(caught.value)
            assert "REPORTS_DIR" in str(caught.value)
            assert "secret" not in str(caught.value) and "environ" not in str(caught.value)
    assert received == []


def test_an_attachment_inside_reports_dir_is_mailed(actor_settings, tmp_path):
    report = tmp_path / "reports" / "sales-2026-11-02-local.csv"
    report.parent.mkdir()
    report.write_text("region\nnorth\n")
    with scripted_smtp() as (port, received):
        actor_settings(smtp_url=f"smtp://127.0.0.1:{port}")
        emails.send_email("ana@example.com", "report", {"kind": "sales"}, attachment=report.name)
    (mail,) = received
    assert b'filename="sales-2026-11-02-local.csv"' in mail


@pytest.mark.parametrize(("template", "context"), [("nope", {}), ("welcome", {"name": "Ana\nBcc: x@y.z"})])
def test_a_mail_that_cannot_be_built_fails_at_once(actor_settings, template, context):
    actor_settings()
    with pytest.raises(Exception) as caught:
        emails.send_email("ana@example.com", template, context)
    assert fails_at_once(caught.value) and "x@y.z" not in str(caught.value)


def test_the_time_limit_leaves_every_smtp_round_trip_its_timeout():
    # A relay slower than this is interrupted by the time limit, maybe after it accepted the mail.
    settings = emails.settings
    limit = emails.send_email.options["time_limit"]
    assert ROUND_TRIPS * settings.smtp_timeout * 1000 < limit < settings.rabbitmq_consumer_timeout_ms
    short = load_settings({"RABBITMQ_CONSUMER_TIMEOUT_MS": "60000", "JOB_TIME_LIMIT_MS": "50000"})
    assert short.smtp_time_limit_ms < 60_000  # and the timeout of each round trip shrinks to fit
    assert ROUND_TRIPS * short.smtp_operation_timeout * 1000 < short.smtp_time_limit_ms


def test_the_time_limit_and_the_wait_for_a_token_fit_in_the_consumer_timeout_together():
    # The limit starts once the mail's smtp token came, which may take RATE_LIMIT_WAIT_MS.
    waits = load_settings(
        {
            "RABBITMQ_CONSUMER_TIMEOUT_MS": "120000",
            "JOB_TIME_LIMIT_MS": "50000",
            "RATE_LIMIT_WAIT_MS": "30000",
        }
    )
    assert waits.smtp_time_limit_ms + waits.rate_limit_wait_ms < waits.rabbitmq_consumer_timeout_ms
    assert waits.longest_time_limit_ms + waits.rate_limit_wait_ms < waits.rabbitmq_consumer_timeout_ms


def test_a_retried_refusal_naming_a_non_ascii_address_leaves_no_part_of_it_in_the_dead_letter(actor_settings):
    """A relay that speaks SMTPUTF8 echoes the recipient in its reply, as UTF-8 bytes; smtplib keeps
    them as ``bytes``, whose repr in the exception's text writes each non-ASCII letter as ``\\xNN``.
    The error is retried, so that text is what the dead-letter headers, the logs and Sentry get."""
    import dramatiq

    from jobsystem.privacy.scrub import Scrubber, exception_text
    from middleware.dead_letters import DeadLetters
    from tests.unit.stub import RecordingBroker, delivery

    address = "zoë.garcía@example.com"
    replies = {"EHLO": "250-scripted\r\n250 SMTPUTF8", "RCPT": f"450 4.2.1 <{address}>: mailbox busy"}
    with scripted_smtp(replies) as (port, _):
        actor_settings(smtp_url=f"smtp://127.0.0.1:{port}")
        with pytest.raises(Exception) as caught:
            emails.send_email(address, "welcome", {"name": "Zoë"})
    assert not fails_at_once(caught.value)
    scrubber = Scrubber()
    message = delivery(dramatiq.Message("emails", "send_email", (), {}, {}))
    record = DeadLetters(scrub=scrubber.text).record(RecordingBroker(middleware=[]), message, caught.value)
    logged = scrubber.text(exception_text(caught.value))  # what logs and Sentry's exception value get
    for shown in (record["x-dl-error"], record["x-dl-traceback"], logged):
        assert "[email]" in shown
        for fragment in ("zo\\x", "garc", "\\xc3"):
            assert fragment not in shown, shown
