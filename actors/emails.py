"""Email over SMTP: one message per job, and a campaign that fans out with a bulk send and ends
with a summary mail to its owner once every recipient's job finished (a workflow group).

The pattern to copy: classify failures. Only what a retry cannot change fails at once (in
``throws``), by this rule, at RCPT or at the end of DATA:

- :class:`InvalidRecipient`: a 5xx reply whose enhanced status code is 5.1.x (address) or 5.2.x
  (mailbox), or a bare 550 or 553 (no enhanced code); an address that is not one;
- :class:`RejectedMail`: any other 5xx at the end of DATA except 5.7.x (size, content, routing);
- :class:`UnsendableMail`: a mail that cannot be built (unknown template, a line break in a
  header); :class:`~actors.files.OutsideDirectory`: an attachment outside ``REPORTS_DIR``.

Everything else is retried with backoff: 4xx, 5.7.x (relay access denied, authentication: the
configuration of the relay or of ``SMTP_URL``, which an operator can fix), other 5xx at RCPT, and
connection and TLS errors, an expired or untrusted certificate included. Once the server accepted
the mail, the job succeeds whatever happens while closing: a retry would send it twice. Every mail
spends a token of the ``smtp`` rate limit (``RATE_LIMITS``), shared by all workers, so a campaign
goes out at the relay's pace without spending retries.
"""

from __future__ import annotations

import re
import smtplib
import ssl
from email.message import EmailMessage
from string import Template
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import dramatiq
from dramatiq.middleware import CurrentMessage

from actors.files import OutsideDirectory, inside
from actors.workflows import group
from jobsystem.mail_address import is_address
from jobsystem.observability.logs import get_logger
from jobsystem.rabbitmq.bulk import send_bulk
from jobsystem.system import get_system

logger = get_logger(__name__)
settings = get_system().settings

#: An enhanced status code (RFC 3463) at the start of a reply's text: class and subject.
_ENHANCED = re.compile(rb"\s*([245])\.(\d{1,3})\.\d{1,3}\b")

#: Templates by name: (subject, body), rendered with ``string.Template`` from the job's context.
TEMPLATES: dict[str, tuple[str, str]] = {
    "welcome": ("Welcome, $name", "Hello $name,\n\nyour account is ready.\n"),
    "campaign": ("$headline", "Hello,\n\n$text\n\nTo unsubscribe, reply STOP.\n"),
    "report": ("Your $kind report", "Hello,\n\nthe $kind report you asked for is attached.\n"),
    "campaign_summary": (
        "Campaign $campaign: $sent sent, $failed failed",
        "Hello,\n\nyour campaign $campaign is done: $sent sent, $failed failed.\n",
    ),
    "report_failed": (
        "Your $kind report could not be made",
        "Hello,\n\nwe could not make the $kind report you asked for (job $job). We are looking into it.\n",
    ),
}


class InvalidRecipient(Exception):
    """The address can never receive mail: retrying would not help."""


class RejectedMail(Exception):
    """The server refused this mail for good at the end of DATA (5xx, not 5.7.x)."""


class UnsendableMail(ValueError):
    """The mail cannot be built from the message: an unknown template, a line break in a header."""


def _current_message_id() -> str:
    message = CurrentMessage.get_current_message()
    return message.message_id if message is not None else "local"


def _smtp_client() -> smtplib.SMTP:
    """A client connected to ``SMTP_URL``, with TLS and logged in as it says; closed if a step fails."""
    url = urlsplit(settings.smtp_url)
    options = dict(parse_qsl(url.query))
    host, timeout = url.hostname or "127.0.0.1", settings.smtp_operation_timeout
    client: smtplib.SMTP
    if url.scheme == "smtps":
        client = smtplib.SMTP_SSL(
            host, url.port or 465, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        client = smtplib.SMTP(host, url.port or 25, timeout=timeout)
    try:
        if url.scheme == "smtp" and options.get("starttls", "").lower() in ("1", "true", "yes"):
            client.starttls(context=ssl.create_default_context())
        if url.username:
            client.login(unquote(url.username), unquote(url.password or ""))
    except BaseException:
        client.close()
        raise
    return client


def render(template: str, context: dict[str, Any]) -> tuple[str, str]:
    """Subject and body of ``template`` filled from ``context``; unknown placeholders stay as they are."""
    try:
        subject, body = TEMPLATES[template]
    except KeyError:
        raise UnsendableMail(f"unknown email template {template!r}") from None
    return Template(subject).safe_substitute(context), Template(body).safe_substitute(context)


def email_key(
    to: str,
    template: str,
    context: dict[str, Any] | None = None,
    campaign: str | None = None,
    attachment: str | None = None,
) -> str:
    """One mail per (recipient, template, campaign): a campaign re-sent by mistake mails nobody
    twice. Mails outside a campaign are told apart by their attachment (each report is new)."""
    return f"{to}|{template}|{campaign or ''}|{attachment or ''}"


def _refusal(code: int, text: bytes | str, *, at_data: bool) -> Exception | None:
    """The non-retried error an SMTP reply amounts to (rule in the module docstring), or None."""
    if not 500 <= code < 600:
        return None
    found = _ENHANCED.match(text if isinstance(text, bytes) else text.encode("utf-8", "replace"))
    subject = found.group(2).decode() if found and found.group(1) == b"5" else None
    shown = f"{code} 5.{subject}" if subject else str(code)
    if subject in ("1", "2") or (subject is None and code in (550, 553)):
        return InvalidRecipient(f"recipient refused with {shown}")
    if at_data and subject != "7":
        return RejectedMail(f"mail refused with {shown}")
    return None


def _build(
    to: str, template: str, context: dict[str, Any], campaign: str | None, attachment: str | None
) -> EmailMessage:
    """The mail to send. Raises :class:`UnsendableMail` or :class:`OutsideDirectory`, never naming
    the message's values."""
    subject, body = render(template, context)
    mail = EmailMessage()
    try:
        mail["From"], mail["To"], mail["Subject"] = settings.mail_from, to, subject
        mail["Message-ID"] = f"<{_current_message_id()}@jobs>"
        if campaign:
            mail["X-Campaign"] = campaign
        mail.set_content(body)
    except ValueError:  # the same on every try
        raise UnsendableMail("the mail cannot be built: a header holds a line break") from None
    if attachment:
        path = inside(settings.reports_dir, attachment, what="attachment", setting="REPORTS_DIR")
        mail.add_attachment(path.read_bytes(), maintype="text", subtype="csv", filename=path.name)
    return mail


def _deliver(mail: EmailMessage) -> None:
    """Send ``mail`` once. A refusal is classified (:func:`_refusal`); once the server accepted
    the mail, an error while closing is not an error of the job."""
    client = _smtp_client()
    try:
        client.send_message(mail)
    except BaseException as exc:
        client.close()
        if isinstance(exc, smtplib.SMTPRecipientsRefused):
            code, text = next(iter(exc.recipients.values()))  # one recipient per mail
            permanent = _refusal(code, text, at_data=False)
        elif isinstance(exc, smtplib.SMTPDataError):
            permanent = _refusal(exc.smtp_code, exc.smtp_error, at_data=True)
        else:
            raise
        if permanent is None:
            raise
        raise permanent from None  # the reply may name the address
    try:
        client.quit()
    except (smtplib.SMTPException, OSError):  # QUIT unanswered or not 221: the mail went
        client.close()


@dramatiq.actor(
    queue_name=settings.queue("emails"),
    throws=(InvalidRecipient, RejectedMail, UnsendableMail, OutsideDirectory),
    time_limit=settings.smtp_time_limit_ms,
    idempotency_key=email_key,
    rate_limit="smtp",
)
def send_email(
    to: str,
    template: str,
    context: dict[str, Any] | None = None,
    campaign: str | None = None,
    attachment: str | None = None,
) -> str:
    """Send one email rendered from ``template``; returns the Message-ID header it was sent with.

    ``attachment``, a report's path, must lie inside ``REPORTS_DIR``. The time limit leaves room
    for every SMTP round trip's timeout (``Settings.smtp_time_limit_ms``).
    """
    if not is_address(to):
        raise InvalidRecipient("recipient address is not valid")
    mail = _build(to, template, context or {}, campaign, attachment)
    _deliver(mail)
    logger.info("email_sent", template=template, campaign=campaign)
    return str(mail["Message-ID"])


def campaign_messages(
    campaign: str, recipients: list[str], context: dict[str, Any] | None = None
) -> list[dramatiq.Message[Any]]:
    """One ``send_email`` message per recipient of ``campaign`` (keyed: re-sending one is dropped)."""
    return [
        send_email.message_with_options(
            kwargs={"to": to, "template": "campaign", "context": context or {}, "campaign": campaign}
        )
        for to in recipients
    ]


@dramatiq.actor(queue_name=settings.queue("emails"))
def campaign_summary(campaign: str, owner: str, counts: dict[str, int]) -> None:
    """Mail ``owner`` how ``campaign`` went ("48 sent, 2 failed"); run once every recipient's job
    finished, with their ``counts`` (succeeded, dead, cancelled)."""
    sent = int(counts.get("succeeded", 0))
    failed = int(counts.get("dead", 0)) + int(counts.get("cancelled", 0))
    context = {"campaign": campaign, "sent": sent, "failed": failed}
    send_email.send(owner, "campaign_summary", context, campaign)
    logger.info("campaign_finished", campaign=campaign, sent=sent, failed=failed)


@dramatiq.actor(queue_name=settings.queue("emails"), time_limit=600_000)
def send_campaign(
    campaign: str, recipients: list[str], context: dict[str, Any] | None = None, owner: str | None = None
) -> int:
    """Fan a campaign out into one ``send_email`` job per recipient with one bulk send; with an
    ``owner``, as a group whose end mails the owner a summary (:func:`campaign_summary`)."""
    messages = campaign_messages(campaign, recipients, context)
    if owner is None:
        sent = send_bulk(messages)
    else:
        fan_out = group(messages)
        fan_out.on_finish(campaign_summary.message_with_options(args=(campaign, owner)))
        fan_out.run(bulk=True)
        sent = messages
    logger.info("campaign_fanned_out", campaign=campaign, recipients=len(recipients), sent=len(sent))
    return len(sent)
