"""Log events scrubbed entry by entry with kept results (jobsystem.privacy.scrub_memo): always the
scrubber's own result for the whole event, however often and in whatever order values come back."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from jobsystem.privacy.scrub import Scrubber
from jobsystem.privacy.scrub_memo import ScrubMemo
from tests.pii_corpus import free_text, keyed, leaks

SCRUBBERS = {
    "default": Scrubber(),
    "hashed": Scrubber(hash_key="a-hash-key-for-tests-of-32-chars"),
    # Keys an operator named (PII_EXTRA_KEYS): a plain number and a made-here value under them.
    "extra keys": Scrubber(extra_keys=("attempt", "timestamp", "tenant")),
}


def _events() -> list[dict[Any, Any]]:
    job = {"message_id": str(uuid.uuid4()), "actor": "send_email", "queue": "emails", "attempt": 1}
    lifecycle = {"event": "job_started", **job, "level": "info", "timestamp": "2026-12-01T14:09:15.123456Z"}
    return [
        lifecycle,
        {"duration_ms": 12.5, **lifecycle, "event": "job_succeeded"},
        {**lifecycle, "tenant": "acme", "note": free_text(), "customer": keyed(), "flag": True, "none": None},
        {**lifecycle, "note": "nothing personal", "customer": {"tier": "gold"}, 7: "a non-string key"},
        {**lifecycle, "note": free_text(), "tenant": "ana.lopez@example.com", "email": "ana@example.com"},
        lifecycle,
    ]


@pytest.mark.parametrize("name", SCRUBBERS)
def test_every_event_is_what_the_scrubber_makes_of_it_seen_once_or_again(name):
    scrubber = SCRUBBERS[name]
    memo = ScrubMemo(scrubber)
    for event in _events() * 2:
        assert memo.mapping(event) == scrubber.mapping(event)
        assert list(memo.mapping(event)) == list(scrubber.mapping(event))  # the same order
        assert leaks(repr(memo.mapping(event))) == []


def test_values_made_here_are_passed_as_they_are_unless_their_key_names_something():
    event = {"event": "job_started", "timestamp": "2026-12-01T14:09:15.123456Z", "attempt": 2}
    assert ScrubMemo(SCRUBBERS["default"]).mapping(event, made_here={"timestamp"}) == event
    named = ScrubMemo(SCRUBBERS["extra keys"]).mapping(event, made_here={"timestamp"})
    assert named == {"event": "job_started", "timestamp": "[redacted]", "attempt": "[redacted]"}


def test_a_kept_result_serves_only_the_value_it_was_made_from():
    memo = ScrubMemo(Scrubber(), max_keys=2)
    notes = ["nothing yet", "call +44 20 7946 0958", "nothing yet", "mail ana.lopez@example.com"] * 3
    events = [{"note": note, "other": str(i), "third": "x"} for i, note in enumerate(notes)]
    results = [memo.mapping(event)["note"] for event in events]
    assert results == ["nothing yet", "call [phone]", "nothing yet", "mail [email]"] * 3


def test_a_container_is_scrubbed_as_it_is_now():
    memo, customer = ScrubMemo(Scrubber()), {"tier": "gold"}
    assert memo.mapping({"customer": customer}) == {"customer": {"tier": "gold"}}
    customer["email"] = "ana.lopez@example.com"
    assert memo.mapping({"customer": customer}) == {"customer": {"tier": "gold", "email": "[email]"}}


def test_threads_keep_their_own_results():
    memo, errors = ScrubMemo(Scrubber()), []

    def run(note: str, expected: str) -> None:
        for _ in range(2000):
            if memo.mapping({"note": note})["note"] != expected:
                errors.append(note)

    threads = [
        threading.Thread(target=run, args=("mail ana.lopez@example.com", "mail [email]")),
        threading.Thread(target=run, args=("nothing personal here", "nothing personal here")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_an_entry_the_scrubber_cannot_handle_raises_for_the_caller_to_scrub_the_event_whole(monkeypatch):
    scrubber = Scrubber()

    def failing(key: Any, value: Any) -> Any:
        raise RecursionError("odd value")

    monkeypatch.setattr(scrubber, "item", failing)
    with pytest.raises(RecursionError):
        ScrubMemo(scrubber).mapping({"note": "something"})
