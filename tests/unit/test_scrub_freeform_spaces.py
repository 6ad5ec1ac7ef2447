"""Spaces of any kind in and around a free-form value after its key (review 5).

:mod:`~jobsystem.privacy.scrub_spaces` reads a no-break space (U+00A0), a narrow one (U+202F) and a
tab as a space in keys and numbers, but the shapes of a postcode and the stops of a free-form
value read ASCII's (and tabs) only: ``postcode: SW1A\\u00a01AA`` kept ``1AA`` (the shape did not
match, so the first word alone was taken), a quote after a no-break space inside an address
opened nothing and the quote closing it ended the value (the rest was kept), and a log's own
field written the French way (``error\\u00a0: timeout``) did not end an address, which took it.
A person's name after its key read its next words after ASCII spaces only too
(:mod:`~jobsystem.privacy.scrub_names`).
"""

from __future__ import annotations

import pytest

from jobsystem.privacy.scrub import Scrubber
from tests.pii_corpus import KEYED_SHAPED

scrub = Scrubber()
hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")

#: The spaces of :mod:`scrub_spaces` other than ASCII's.
SPACES = ["\u00a0", "\u202f", "\t"]
#: (key, value) of postcodes written in two parts.
POSTCODES = [(key, value) for key, label, value in KEYED_SHAPED if label == "address" and " " in value]


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize(("key", "value"), POSTCODES)
def test_a_postcode_in_two_parts_is_taken_whole_whatever_the_space_between(key, value, space):
    written = value.replace(" ", space)
    assert scrub.text(f"{key}: {written} status=ok") == f"{key}: [address] status=ok"
    assert scrub.text(f"{key}={written}, sent to Paris") == f"{key}=[address], sent to Paris"


@pytest.mark.parametrize("space", SPACES)
def test_a_quoted_name_after_any_space_inside_an_address_is_part_of_it(space):
    line = f'note="address: 5 rue de la Paix,{space}"Le Clos" Paris" sent'
    assert scrub.text(line) == 'note="address: [address]" sent'


@pytest.mark.parametrize("space", SPACES)
def test_the_next_pair_after_any_space_ends_an_address_and_the_space_stays(space):
    assert scrub.text(f"address: 5 Rue X{space}status=ok") == f"address: [address]{space}status=ok"
    line = f"address: 5 Rue X, Paris error{space}: timeout"
    assert scrub.text(line) == f"address: [address] error{space}: timeout"


@pytest.mark.parametrize("space", SPACES)
def test_a_name_whose_words_are_apart_by_any_space_is_taken_whole(space):
    """``name=José\\u00a0Pérez`` kept ``Pérez``: a name's next word was looked for after ASCII spaces."""
    name = f"José{space}María{space}Pérez"
    assert scrub.text(f"name={name} status=ok") == "name=[name] status=ok"
    assert scrub.text(f"name=山田{space}太郎 ok") == "name=[name] ok"
    assert hashing.text(f"name={name} ok") == f"name={hashing({'name': name})['name']} ok"
