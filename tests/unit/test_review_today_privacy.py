"""Review of today's merges, privacy: ordinary text over-redacted by the keys in words followed by
`` is `` (``phone number is``) merged with fix/privacy, and such a key's value missed in a text that
begins with `` is ``. (After a colon, any number is a key's value, as ``card: 3`` was before today:
``card no: 3`` is that policy, not this fault.)

Both were strict xfails; the rule that fixed them is :mod:`jobsystem.privacy.scrub_is_value`'s.
"""

from __future__ import annotations

import pytest

from jobsystem.privacy.scrub import Scrubber

scrub = Scrubber()

#: Validation messages that name a number's kind and its length or position: no
#: personal number is in them, and the release before today left them as they are.
ORDINARY = [
    "the card number is 16 digits long",
    "phone number is 10 digits, got 9",
    "the passport number is 10 characters at most",
    "api key is 32 characters",
]


@pytest.mark.parametrize("line", ORDINARY)
def test_a_length_after_a_numbers_name_and_is_stays(line: str) -> None:
    assert scrub.text(line) == line


def test_a_number_after_its_key_in_words_and_is_goes_in_a_text_that_begins_with_is() -> None:
    """A fragment (a field, a message built as ``f"{name} is due"`` with an empty name) may begin
    with `` is ``: the passport number after it is removed as it is without that beginning."""
    assert scrub.text("passport number is X1234567") == "passport number is [id_number]"
    assert scrub.text(" is due; passport number is X1234567") == " is due; passport number is [id_number]"
