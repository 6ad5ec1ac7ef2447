"""How far an unquoted value after a key runs in free text (``phone: 0161 496 0000 retried``).

An unquoted value was one word: ``mobile: 70123 45678`` logged ``[phone] 45678``, ``phone=+44 7700
900123`` kept ``7700 900123``. Three kinds of value run on past their first word:

- a free-form value (an address, a date of birth, a postcode, a configured key's value:
  :data:`FREEFORM_LABELS`): to the end of its shape if it has one (``dob: 12 March 1980``,
  ``postcode: SW1A 1AA``: :mod:`scrub_value_shapes`), else to the end of the value, before the
  line's next ``key=value`` pair (``address=221B Baker Street status=ok``): :mod:`scrub_freeform`;
  a mailbox's or a machine's address as its first word is a shape, unless a ``,`` or ``;`` after
  it starts the next part of the value: after a mailbox's (``address=ana@example.com, 221B Baker
  Street``), or after any under a key naming a place's address (``home_address=81.2.69.142, Flat
  3``); under a plain ``address`` key an IP or a ``host:port`` is a machine's, and the words after
  its ``,`` stay (``address=10.0.0.1, retrying in 5 s``);
- a person's name (``name=José Pérez``): see :mod:`scrub_names`;
- a number of a personal kind (:data:`NUMBER_LABELS`: a phone, a card, an IBAN, a national or
  account number; and a name key's value that starts as a phone number does,
  ``recipient=+44 7700 900123``) whose first word has a digit: it runs on over the groups that
  follow it one space, tab or no-break space apart, groups of digits (``(0)``, ``98765-4321``
  too), or an IBAN's groups of up to four letters or digits; which of them are the number's,
  :mod:`scrub_groups` says (as far as it is written in its kind's groups and passes its checks,
  ``0161 496 0000 3 times`` keeping ``3 times``). A word (``retried``), a time (``10:20:33``), a
  decimal or a version (``3.11.7``), a separator or the line's end stops the groups. A national
  number with letters is taken in its known shape (``nino: QQ 12 34 56 C``, ``nie: X 1234567 L``).
"""

from __future__ import annotations

import re

from jobsystem.privacy.scrub_freeform import FREEFORM_LABELS, freeform_end
from jobsystem.privacy.scrub_groups import run_end
from jobsystem.privacy.scrub_keys import (
    NUMBER_LABELS,
    is_machine_address_key,
    is_place_address_key,
    is_postcode_key,
)
from jobsystem.privacy.scrub_names import NAME_LABELS, name_end
from jobsystem.privacy.scrub_numbers import LETTER_ID_SHAPES, NumberFinder
from jobsystem.privacy.scrub_spaces import as_spaces
from jobsystem.privacy.scrub_value_shapes import birth_date_end, network_end, postcode_end

__all__ = ["GROUP_END", "value_end"]

#: What may follow a group: a space, a separator, the end, a full stop that ends a sentence.
GROUP_END = r"(?=[\s,;!?'\"\]})>]|\.?$|\.\s)"
#: The next group of digits of a number, joined by the punctuation numbers are written with
#: (``(0)20``, ``98765-4321``), not by a ``.`` (``3.11``: a decimal or a version).
_DIGIT_GROUP = re.compile(r"[ \t]+([(+]?\d+(?:[()\-/]{1,2}\d+)*\)?)" + GROUP_END)
#: The next group of an IBAN printed in groups of four.
_IBAN_GROUP = re.compile(r"[ \t]+([A-Za-z0-9]{1,4})" + GROUP_END)
#: Groups looked at, at most (an IBAN has up to nine).
_MAX_GROUPS = 10
#: What follows a part of a free-form value written in parts (``ana@example.com, 221B Baker St``).
_LIST_SEPARATORS = frozenset(",;")


def value_end(numbers: NumberFinder, label: str, key: str, text: str, begin: int, stop: int) -> int:
    """Where an unquoted value after ``key``, labelled ``label``, whose first word is
    ``text[begin:stop]``, ends (see the module); ``numbers`` confirms numbers."""
    if label in FREEFORM_LABELS:
        return _freeform_end(label, key, text, begin, stop)
    if label in NAME_LABELS:
        if text[begin] not in "+0123456789":
            return name_end(text, begin, stop)
        label = "phone"
    elif label not in NUMBER_LABELS:
        return stop
    text, end = as_spaces(text), stop  # numbers are grouped by no-break spaces too (French: U+202F)
    if label in ("id_number", "ssn") and (shaped := LETTER_ID_SHAPES.match(text, begin)):
        end = max(end, shaped.end())
    if any(c.isdigit() for c in text[begin:stop]):
        end = max(end, _groups_end(numbers, label, text, begin, stop))
    return end


def _freeform_end(label: str, key: str, text: str, begin: int, stop: int) -> int:
    """The end of a value of a free-form kind: its shape's if it has one, else the value's. A
    machine's or a mailbox's address is one word, but a ``,`` or ``;`` after it may make it the
    first part of a value in parts (:func:`_first_of_parts`): the rest is the value's too, as far
    as a free-form value runs."""
    if label == "birth_date":
        shaped = birth_date_end(text, begin)
    elif label == "address" and is_postcode_key(key):
        shaped = postcode_end(text, begin, stop)
    elif label == "address":
        machine = is_machine_address_key(key)
        shaped = network_end(text, begin, stop, host_names=machine)
        if shaped is not None and not machine and _first_of_parts(key, text, begin, stop):
            shaped = None  # ``address=ana@example.com, 221B Baker Street``: a part, then the rest
    else:
        shaped = None
    return max(shaped, stop) if shaped is not None else freeform_end(text, begin, stop)


def _first_of_parts(key: str, text: str, begin: int, stop: int) -> bool:
    """Whether the address ``text[begin:stop]``, a machine's or a mailbox's, after ``key`` (no
    machine's address key) is the first part of an address in parts: a ``,`` or ``;`` follows it,
    and it is a mailbox's (``ana@example.com, 221B Baker Street``) or ``key`` names a place's
    address (``home_address=81.2.69.142, Flat 3``). An IP or a ``host:port`` under a plain
    ``address`` key is a machine's: ``address=10.0.0.1, retrying in 5 s`` lost ``retrying in 5 s``."""
    if text[stop : stop + 1] not in _LIST_SEPARATORS:
        return False
    word = text[begin:stop]
    return ("@" in word and "://" not in word) or is_place_address_key(key)


def _groups_end(numbers: NumberFinder, label: str, text: str, begin: int, stop: int) -> int:
    """The end of the groups after ``text[begin:stop]`` that are the ``label``'s (:mod:`scrub_groups`)."""
    iban = label == "iban"
    group = _IBAN_GROUP if iban else _DIGIT_GROUP
    ends = [stop]
    while len(ends) <= _MAX_GROUPS and (match := group.match(text, ends[-1])):
        ends.append(match.end())
        if iban and len(match[1]) < 4:
            break  # an IBAN's last group: the rest is text
    while len(ends) > 1 and not any(c.isdigit() for c in text[ends[-2] : ends[-1]]):
        ends.pop()  # a word after an IBAN (``sent``), not a group of it
    return stop if len(ends) == 1 else run_end(numbers, label, text, begin, ends)
