"""Review 5 (a new user's failed ``send_email``): the reference actor refuses a malformed recipient
with ``InvalidRecipient("recipient address is not valid")``, a message with no personal data in
it. The worker's log line shows it whole (``error='recipient address is not valid'``), but every
place that scrubs the exception as ``Type: message`` text reads the class name as a ``key:
value`` pair whose key names personal data (``...Recipient``, ``...Address``) and removes the
value: the stored traceback, the dashboard's and ``jobctl status``'s ``error`` line then read
``InvalidRecipient: [recipient] address is not valid``, and ``AddressError: street is missing``
loses its whole message. A Python exception's ``Type: message`` line is no ``key: value``."""

from __future__ import annotations

import pytest

from jobsystem.privacy.scrub import Scrubber


@pytest.mark.parametrize(
    "line",
    [
        # The last line of send_email's stored traceback (dashboard, jobctl status --json).
        "actors.emails.InvalidRecipient: recipient address is not valid",
        # jobctl status's error line, as printed (type, then the message).
        "error      InvalidRecipient: recipient address is not valid",
        "billing.errors.AddressError: street is missing",
        "  caused by AddressError: street is missing",
        "NameError: name 'recipient' is not defined",
    ],
)
def test_an_exceptions_type_and_message_line_keeps_a_message_without_personal_data(line: str) -> None:
    assert Scrubber().text(line) == line


class InvalidRecipient(ValueError):
    """As the reference actor's."""


class AddressError(Exception):
    """A class named like an address key."""


def test_an_exception_and_its_chain_keep_messages_without_personal_data() -> None:
    try:
        try:
            raise AddressError("street is missing")
        except AddressError as cause:
            raise InvalidRecipient("recipient address is not valid") from cause
    except InvalidRecipient as caught:
        error = caught
    assert Scrubber()(error) == (
        "InvalidRecipient: recipient address is not valid\n  caused by AddressError: street is missing"
    )


@pytest.mark.parametrize(
    ("line", "scrubbed"),
    [
        # The message is still scrubbed as text: what it names goes, the rest stays.
        (
            "actors.emails.InvalidRecipient: recipient ada@example.com is not valid",
            "actors.emails.InvalidRecipient: [recipient] [email] is not valid",
        ),
        (
            "AddressError: street is missing, address: Baker Street, London",
            "AddressError: street is missing, address: [address]",
        ),
        ("InvalidRecipient: recipient name: Ada Lovelace", "InvalidRecipient: recipient name: [name]"),
        # A message that opens as a value, or holds a digit, is read as the class name's value, as before.
        ("AddressError: 221B Baker Street, London NW1 6XE", "AddressError: [address]"),
        ("AddressError: cannot deliver to street 221B Baker Street", "AddressError: [address]"),
        (
            "AddressError: street is missing in address=221B Baker Street",
            "AddressError: [address] address=[address]",
        ),
        ("InvalidRecipientName: Ada Lovelace", "InvalidRecipientName: [name]"),
        ("InvalidRecipient: ada@example.com is not valid", "InvalidRecipient: [recipient] is not valid"),
        # A secret's key stays one, and so does a key that names no fault (a field's label).
        ("InvalidToken: expired abc", "InvalidToken: [token] abc"),
        ("BillingAddress: baker street", "BillingAddress: [address]"),
        ("FullName: ada", "FullName: [name]"),
        ('"AddressError": "street is missing"', '"AddressError": "[address]"'),
    ],
)
def test_personal_data_in_or_after_a_class_name_still_goes(line: str, scrubbed: str) -> None:
    assert Scrubber().text(line) == scrubbed
