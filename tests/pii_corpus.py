"""Personal data and secrets of every kind the scrubber must remove, and ordinary values it must keep.

Values found by pattern appear in free text; values found only by their key (a name, an address,
a password) appear only under a key naming them: no pattern can tell "Ana Lopez" from other words.
"""

from __future__ import annotations

import json
from typing import Any

#: (label, value) found by pattern anywhere, in several formats each.
BY_PATTERN: list[tuple[str, str]] = [
    ("email", "ana.lopez@example.com"),
    ("email", "J.Smith+orders@mail.example.co.uk"),
    ("email", "noreply_42@sub.example-shop.de"),
    ("phone", "+44 20 7946 0958"),
    ("phone", "+1 (415) 555-0134"),
    ("phone", "+33 1 23 45 67 89"),
    ("phone", "+49 30 12345678"),
    ("phone", "+4915112345678"),
    ("phone", "0044 20 7946 0958"),
    ("phone", "(415) 555-0199"),
    ("phone", "415-555-0176"),
    ("phone", "415.555.0123"),
    ("phone", "1-800-555-0111"),
    ("phone", "020 7946 0321"),
    ("phone", "07700 900123"),
    ("phone", "06 12 34 56 78"),
    ("phone", "030-12345678"),
    ("card", "4111 1111 1111 1111"),
    ("card", "4012-8888-8888-1881"),
    ("card", "5555555555554444"),
    ("card", "3782 822463 10005"),
    ("card", "6011 1111 1111 1117"),
    ("card", "2223 0031 2200 3222"),
    ("ssn", "078-05-1120"),
    ("ssn", "219-09-9999"),
    ("ssn", "536 22 8726"),
    ("iban", "DE89 3704 0044 0532 0130 00"),
    ("iban", "GB82WEST12345698765432"),
    ("iban", "FR14 2004 1010 0505 0001 3M02 606"),
    ("iban", "NL91ABNA0417164300"),
]

#: (replacement, secret) found by pattern: the secret part must go, the scheme may stay.
SECRETS: list[tuple[str, str, str]] = [
    ("Bearer [token]", "Bearer mF_9.B5f-4.1JqM7tLz8Xw2", "mF_9.B5f-4.1JqM7tLz8Xw2"),
    ("Basic [token]", "Basic YWxhZGRpbjpvcGVuc2VzYW1l", "YWxhZGRpbjpvcGVuc2VzYW1l"),
    (
        "[token]",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ),
    ("[secret]", "sk_live_51HxYzAbCdEfGhIjKlMn0pQr", "sk_live_51HxYzAbCdEfGhIjKlMn0pQr"),
    ("[secret]", "AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("[secret]", "ghp_16C7e42F292c6912E7710c838347Ae178B4a", "ghp_16C7e42F292c6912E7710c838347Ae178B4a"),
    ("[secret]", "xoxb-263594206564-2343594206574-FGqddMF8t08v8N7Oq4i57vs1", "FGqddMF8t08v8N7Oq4i57vs1"),
    ("[secret]", "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0LzMn", "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0LzMn"),
    (
        "postgres://app:[password]@db.internal:5432/shop",
        "postgres://app:S3cr3t-Pa55word@db.internal:5432/shop",
        "S3cr3t-Pa55word",
    ),
    (
        "https://ops:[password]@api.example.com/v1",
        "https://ops:hunter2hunter2@api.example.com/v1",
        "hunter2hunter2",
    ),
]

#: (key, label, value) found only by the key naming them.
BY_KEY: list[tuple[str, str, Any]] = [
    ("full_name", "name", "Ana Lucia Lopez"),
    ("first_name", "name", "Jean-Luc"),
    ("lastName", "name", "Picard-Okafor"),
    ("name", "name", "Marta Kowalska"),
    ("address", "address", "221B Baker Street, London NW1 6XE"),
    ("shipping_address", "address", "99 Rue de Rivoli, 75001 Paris"),
    ("password", "password", "correct-horse-battery-staple"),
    ("client_secret", "secret", "s3cr3t-of-the-client"),
    ("api_key", "secret", "k-987-zyx-plain"),
    ("Authorization", "authorization", "Digest username-hidden"),
    ("cookie", "cookie", "sessionid=abc123def456"),
    ("card_cvv", "card", "737"),
    ("date_of_birth", "birth_date", "1984-07-30"),
    ("phone", "phone", 4155550134),
]

#: Ordinary values of a job system: none may change.
ORDINARY: list[str] = [
    "ord-20261102-0042",
    "INV-2026-000123",
    "2026-11-02",
    "2026-11-29T19:13:00.123456Z",
    "2026-11-29T19:13:00+01:00",
    "02.11.2026 10:20",
    "1234.56",
    "EUR 12,345.67",
    "-42.5",
    "1764432000123",
    "0b9d3c1e-4f5a-11ee-8c90-0242ac120002",
    "7f3c2a9e8b1d4c6fa0e5b3d2c1f4a6e8",
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "t1a2b3c4d5-emails.XQ",
    "send_email",
    "generate_report",
    "queue_name='emails' actor_name='send_email'",
    "127.0.0.1:5672",
    "http://127.0.0.1:15672/api/queues/%2F/emails",
    "port 15672, pid 48213, 8 threads",
    "Retrying message '0b9d3c1e-4f5a-11ee-8c90-0242ac120002' in 213 milliseconds.",
    "RuntimeError: attempt 3 of f1 fails on purpose",
    'File "/srv/app/.venv/lib/python3.11/site-packages/dramatiq/worker.py", line 487, in process_message',
    "invalid token provided",
    "Basic authentication failed",
    "email_sent",
    "WorkerThread-3 took 0.25 s",
]


def free_text() -> str:
    """One paragraph holding every value found by pattern, and every secret."""
    values = [value for _, value in BY_PATTERN] + [text for _, text, _ in SECRETS]
    return "Customer wrote: " + "; then ".join(values) + "."


def keyed() -> dict[str, Any]:
    """A customer record: every value found by key, plus pattern values under neutral keys."""
    record: dict[str, Any] = {key: value for key, _, value in BY_KEY}
    record["email"] = "ana.lopez@example.com"
    record["contacts"] = [{"kind": "mobile", "value": "+44 20 7946 0958"}, ("card", "4111 1111 1111 1111")]
    return record


def needles() -> list[str]:
    """Strings whose presence anywhere in an output is a leak (raw and JSON-escaped)."""
    raw = [value for _, value in BY_PATTERN] + [secret for _, _, secret in SECRETS]
    raw += [str(value) for _, _, value in BY_KEY if len(str(value)) > 4]
    raw += ["4111111111111111", "4155550134"]
    return sorted({form for value in raw for form in (value, json.dumps(value)[1:-1])})


def leaks(output: str) -> list[str]:
    """The needles found in ``output``."""
    return [needle for needle in needles() if needle in output]
