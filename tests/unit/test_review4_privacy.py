"""Review 4 of ``fix/privacy3``: near variants of the scrubber's new forms that still pass.

The merge taught the scrubber a key joined to its value by a space (``ssn 078-05-1120``), keys
written in several words (``date of birth:``), ``X is <value>`` and birth dates in words. Each
form is read with one ASCII space only: the same line with a no-break space (U+00A0, what a
spreadsheet, a PDF or a French text puts before a colon and between words) or a tab (a TSV line,
a log aligned with tabs) keeps the personal data whole. A birth date in words is taken after a
``:`` but not after ``is`` or ``born``, which the merge added for numeric dates. These were strict
xfails; ``fix/r4privacy`` reads any of these spaces, or a run of them, as one, and a birth date in
words after ``is`` or ``born`` with the reader ``DOB:`` uses.
"""

from __future__ import annotations

import re

import pytest

from jobsystem.privacy.scrub import Scrubber

scrub = Scrubber()

SSN = "078-05-1120"
BIRTH = "12.03.1985"

#: (line, what must not be left in it): a new form with a no-break space or a tab.
WHITESPACE_VARIANTS: list[tuple[str, str]] = [
    (f"ssn\u00a0{SSN} retried", SSN),
    (f"ssn\t{SSN} retried", SSN),
    (f"ssn\u00a0is {SSN}", SSN),
    (f"ssn is\u00a0{SSN}", SSN),
    (f"ssn\tis {SSN}", SSN),
    (f"date\u00a0of birth: {BIRTH}", BIRTH),
    (f"date\tof birth: {BIRTH}", BIRTH),
    (f"date of birth\u00a0: {BIRTH}", BIRTH),
    (f"geboren\u00a0am {BIRTH}", BIRTH),
    ("passport\u00a0number: X1234567", "X1234567"),
    ("Passport\u00a0#: X1234567", "X1234567"),
    (f"ssn  {SSN} retried", SSN),
    (f"ssn\u202f{SSN} retried", SSN),
    ("password\tis hunter22", "hunter22"),
    # The older key path: a value in brackets after ``key:`` and a no-break space.
    ("address:\u00a0{'line1': '221B Baker Street'}", "Baker"),
    ("phone:\u00a0[\u00a0+44 7700 900123, +44 7700 900456]", "7700"),
]


def test_the_ascii_forms_of_these_lines_are_scrubbed() -> None:
    """The control: with ASCII spaces every line loses its value today."""
    for line, value in WHITESPACE_VARIANTS:
        plain = re.sub(r"[ \t\u00a0\u202f]+", " ", line).replace(" :", ":")
        assert value not in scrub.text(plain), plain


#: (line, what must not be left in it): a birth date in words after ``is`` or ``born``.
BIRTH_DATES_IN_WORDS: list[tuple[str, str]] = [
    ("dob is 12 March 1985", "12 March 1985"),
    ("date of birth is March 12, 1985", "March 12, 1985"),
    ("birth date is 12 March 1985", "12 March 1985"),
    ("born March 12, 1985 in Ohio", "March 12, 1985"),
    ("born 12 March 1985", "12 March 1985"),
    ("born on 12 March 1985", "12 March 1985"),
    ("born\u00a0on\u00a012\u00a0March\u00a01985", "1985"),
    ("date of birth is\t12 March 1985", "12 March 1985"),
]


def test_the_same_birth_dates_after_a_colon_are_scrubbed() -> None:
    """The control: ``DOB: 12 March 1985`` and ``date of birth: March 12, 1985`` are scrubbed."""
    assert "1985" not in scrub.text("DOB: 12 March 1985")
    assert "1985" not in scrub.text("date of birth: March 12, 1985")
    assert "1985" not in scrub.text("dob is 12.03.1985")
    assert "1985" not in scrub.text("born 12.03.1985")


@pytest.mark.parametrize(("line", "value"), [*WHITESPACE_VARIANTS, *BIRTH_DATES_IN_WORDS])
def test_personal_data_in_a_near_variant_of_a_new_form_is_scrubbed(line: str, value: str) -> None:
    assert value not in scrub.text(line)


def test_a_number_sign_written_with_a_degree_sign_names_the_number() -> None:
    """``N°`` (degree sign, the usual French/Spanish spelling) is a number word as ``Nº`` is."""
    assert "X1234567" not in scrub.text("Passport N°: X1234567")


def test_a_number_sign_written_with_an_ordinal_indicator_names_the_number() -> None:
    """The control: ``Nº`` (U+00BA) is read as the number word."""
    assert scrub.text("Passport Nº: X1234567") == "Passport Nº: [id_number]"
