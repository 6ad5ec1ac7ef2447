"""Message ids (UUIDs) inside scrubbed text stay whole: ``jobctl dlq list`` printed
``[phone]-fae8-426d-...`` for an id whose first group is all digits (about one id in 400), so
the operator could not name it to ``show`` or ``retry``, and a test comparing ids failed at random."""

from __future__ import annotations

import io
import json
import random
import uuid

import pytest

from jobsystem.privacy.scrub import Scrubber

scrub = Scrubber()

#: Ids the number finder took for a phone number or a national id number.
TAKEN_FOR_NUMBERS = [
    "03097281-fae8-426d-8feb-54614a75c72e",  # a national phone number with its trunk 0
    "03613668-47b5-4419-866b-08b18658403b",
    "47492830-5492-47f2-a625-c01e76943493",  # twelve digits over two groups: an Aadhaar number
    "29464814-5424-4E5B-9235-F76354884B89",  # upper case
]


@pytest.mark.parametrize("message_id", TAKEN_FOR_NUMBERS)
def test_an_id_in_a_json_line_or_a_log_message_stays_whole(message_id):
    line = json.dumps({"message_id": message_id, "queue": "t-workload", "reason": "unknown_actor"})
    assert scrub.text(line) == line
    logged = f"Retrying message '{message_id}' in 148 milliseconds."
    assert scrub.text(logged) == logged


def test_three_thousand_random_ids_in_jobctl_lines_stay_whole():
    rng = random.Random(20261205)
    ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(3_000)]
    lines = [json.dumps({"message_id": message_id, "actor": "send_email"}) for message_id in ids]
    assert [line for line in lines if scrub.text(line) != line] == []


def test_the_jobctl_stream_prints_an_id_as_it_is_and_a_phone_beside_it_scrubbed():
    from jobctl.output import ScrubbedStream

    out = io.StringIO()
    ScrubbedStream(out, scrub.text).write(f"call 0161 496 0000 about {TAKEN_FOR_NUMBERS[0]}\n")
    assert out.getvalue() == f"call [phone] about {TAKEN_FOR_NUMBERS[0]}\n"
