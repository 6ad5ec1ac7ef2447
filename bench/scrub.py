"""The scrubber's cost per log event, measured in-process (part of ``python -m bench``).

Events are built up front with unique message ids and timestamps, as a worker's are, so the
scrubber's cache of repeated short strings helps only where it would in production.

Measured when detection moved to python-stdnum, phonenumbers and ipaddress (issue 13; 2 cores,
median of 5 runs, µs per event, before -> after): lifecycle event 5.5 -> 5.4 (the path every job
takes: unchanged), email/name/phone 22.5 -> 30.5, the same hashed 34.3 -> 45.2, national ids/
IBAN/phones/IP 59 -> 116 (most of it was not found before), a failure with a traceback 172 -> 74
(tracebacks are now scanned line by line, repeated lines memoised).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from jobsystem.privacy.scrub import Scrubber

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/.venv/lib/python3.11/site-packages/dramatiq/worker.py", line 487, in process_message\n'
    "    res = actor(*message.args, **message.kwargs)\n"
    '  File "/srv/app/actors/billing.py", line 42, in charge\n'
    '    raise PaymentDeclined(f"card {card} of {email} declined")\n'
    "PaymentDeclined: card 4111 1111 1111 1111 of ana.lopez@example.com declined, call +44 20 7946 0958\n"
)


def _events(kind: str, count: int) -> list[dict[str, Any]]:
    start = datetime(2026, 11, 2, tzinfo=UTC)
    events = []
    for i in range(count):
        event: dict[str, Any] = {
            "event": "job_succeeded",
            "timestamp": (start + timedelta(microseconds=i * 137)).isoformat().replace("+00:00", "Z"),
            "level": "info",
            "logger": "jobs.lifecycle",
            "message_id": str(uuid.uuid4()),
            "actor": "send_email",
            "queue": "emails",
            "attempt": 1,
            "duration_ms": 12.345,
        }
        if kind == "personal":
            event.update(
                event="customer_updated",
                email=f"user{i}@example.com",
                customer={"full_name": "Ana Lopez", "phone": "+44 20 7946 0958", "tier": "gold"},
                note=f"order ord-2026-{i:06d} paid, reach me at user{i}@example.com",
            )
        elif kind == "international":
            event.update(
                event="customer_updated",
                customer={"tax_id": "52891637437", "tel": "+4915112345678", "tier": "gold"},
                note=(
                    f"order ord-2026-{i:06d}: IBAN de89-3704-0044-0532-0130-00, CPF 528.916.374-37, "
                    f"NIE Y-4829173-S, call 07400123456, from 81.2.69.142, mar\u00eda{i}@example.es"
                ),
            )
        elif kind == "failure":
            # The message varies per event, as a real failure's would (only repeated lines are memoised).
            varied = TRACEBACK.replace("declined", f"declined (order {i})")
            event.update(event="job_failed", level="error", exception=varied * 3)
        events.append(event)
    return events


def _per_event_us(process: Callable[[dict[str, Any]], Any], events: list[dict[str, Any]]) -> float:
    started = time.perf_counter()
    for event in events:
        process(event)
    return (time.perf_counter() - started) / len(events) * 1e6


def scrub_costs(count: int = 20_000) -> list[tuple[str, float]]:
    """Microseconds per event for typical kinds of log event, without and with a hash key."""
    plain = Scrubber()
    hashing = Scrubber(hash_key="bench-hash-key-of-32-characters!")
    results = []
    for kind, label in (
        ("lifecycle", "lifecycle event, 9 fields, nothing personal"),
        ("personal", "event with email, name, phone, free text"),
        ("international", "event with national ids, IBAN, phones, IP"),
        ("failure", "failure with a 1.3 kB traceback holding PII"),
    ):
        n = count if kind != "failure" else max(count // 10, 100)
        results.append((label, _per_event_us(plain.mapping, _events(kind, n))))
        if kind == "personal":
            results.append((label + ", hashed", _per_event_us(hashing.mapping, _events(kind, n))))
    return results
