"""Review of the keyed-value extents (``scrub_extents``, ``scrub_names``, ``scrub_pairs``): faults
found on ``main``, each marked ``xfail(strict=True)`` until fixed (``pytest --runxfail`` shows them).

- Over-redaction, a regression of 85bcdec: a count, a duration, a port or epoch seconds after a
  keyed number went with it, where the value as one word was replaced and the rest kept. Two
  causes: a number that confirms in a plan of variable length (Germany's, Italy's) confirms again
  with the next group (``+49 30 1234567 12`` is valid too), and a value that no check confirms
  takes every group that follows it.
- Leaks left by the extents: a surname after a particle the list lacks (``den``, ``los``, ``el``),
  the words after the first of a name in a script without case, a number grouped by no-break
  spaces, a 12-digit phone after ``phone:`` read as the scrubber's own hash, and the repr of
  JSON text with JSON in a string.
"""

from __future__ import annotations

import json

import pytest

from jobsystem.privacy.scrub import Scrubber

scrub = Scrubber()

LEAK = pytest.mark.xfail(strict=True, reason="review: a keyed value left in part")


@LEAK
@pytest.mark.parametrize(
    ("text", "left"),
    [
        # repr() of JSON text with JSON in a string (Dramatiq's DecodeError quotes a body so):
        # each quote after two backslashes, which scrub_pairs does not read (one or three only).
        (repr(json.dumps({"payload": json.dumps({"name": "Ana Lopez"})}).encode()), "Lopez"),
    ],
)
def test_a_keyed_value_is_not_left_in_part(text, left):
    assert left not in scrub.text(text)
