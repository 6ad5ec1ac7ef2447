"""Review of free-form values after a key (``address=221B Baker Street``: run on to the value's end).

Found by review, each fixed: a run of backslashes after such a value was scanned again from each
of its backslashes; a bare host name, or the prose word ``address`` before a colon (``email
address:``), took the rest of the line with it; a label inside an address (``Floor: 2``) ended
it, and the street, town and postcode after it stayed; a date of birth written year first ended
after its year."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobsystem.privacy.scrub import Scrubber

scrub = Scrubber()


_ROOT = Path(__file__).resolve().parents[2]

#: A line the scan read once per backslash (200,000 of them, no quote after): some 450 s here
#: before the fix, milliseconds after it. Cut at 64 KiB by default, such a line took some 50 s.
_BACKSLASHES = """
from jobsystem.privacy.scrub import Scrubber
line = "address=x " + "\\\\" * 200_000 + " status=ok"
print(Scrubber(max_length=300_000).text(line))
"""


def test_a_run_of_backslashes_after_a_free_form_value_is_scanned_once() -> None:
    """The scrub runs in a child process (the regex engine holds the GIL, a thread could not be
    given up on); it must end well within the wait: a hang guard, not a measure of speed."""
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _BACKSLASHES], cwd=_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "address=[address] status=ok\n"


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        # A machine's name without a port was no shape network_end knew: the rest of the line went.
        ("server_address=rabbit-1 is down, retrying in 5 s", "=[address] is down, retrying in 5 s"),
        ("listen_address=localhost port 8080 ready", "=[address] port 8080 ready"),
        ("peer_address=db.internal closed the connection", "=[address] closed the connection"),
        ("bindAddress: redis-2.cache.internal timed out after 5 s", ": [address] timed out after 5 s"),
        ("host-address=web01, retrying", "=[address], retrying"),
    ],
)
def test_a_bare_host_name_under_a_key_naming_a_machines_address_is_one_word(line: str, kept: str) -> None:
    out = scrub.text(line)
    assert out.endswith(kept), out


@pytest.mark.parametrize(
    "line",
    [
        "server_address=221B Baker Street",  # no host name: a street, whatever its key says
        "server_address=Flat 3, 12 Rue Lepic",
        "server_address=rue de la Paix",  # one lower-case word without digit or hyphen: in doubt, a street's
        "address=rabbit-1 Baker Street",  # a plain address key: its first word is no host's
    ],
)
def test_a_street_under_a_machine_address_key_is_still_taken_whole(line: str) -> None:
    out = scrub.text(line)
    assert out.endswith("=[address]"), out


#: pydantic's EmailStr errors (email-validator's reasons): the reason went, and a '[' with it.
_PYDANTIC = [
    "value is not a valid email address: An email address must have an @-sign. [type=value_error]",
    "value is not a valid email address: The part after the @-sign is not valid. It should have a period.",
    "value is not a valid email address: The email address contains invalid characters before the "
    "@-sign: ' '.",
]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        *((line, line) for line in _PYDANTIC),
        (
            "server address: rabbit-1 refused the connection",
            "server address: [address] refused the connection",
        ),
        ("bind address: localhost already in use", "bind address: [address] already in use"),
    ],
)
def test_the_word_address_after_a_lower_case_word_that_qualifies_it_keeps_a_text_that_is_no_address(
    line: str, expected: str
) -> None:
    """``email address:`` is read as an email key (the text after it has no ``@``: it stays),
    ``server address:`` as a machine's address key (a host name is one word)."""
    assert scrub.text(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("address: 221B Baker Street", "address: [address]"),
        ("Address: 221B Baker Street, London", "Address: [address]"),
        ("Email address: 221B Baker Street", "Email address: [address]"),  # a label, not prose
        ("billing address: 5 Main St, Springfield", "billing address: [address]"),
        ("customer moved to new address: 5 Main St", "customer moved to new address: [address]"),
        ("email address: ana@example.com sent", "email address: [email] sent"),
        ("address: 5 Main St [type=value_error]", "address: [address] [type=value_error]"),
    ],
)
def test_a_postal_address_after_the_word_address_is_still_taken_whole(line: str, expected: str) -> None:
    assert scrub.text(line) == expected


@pytest.mark.parametrize(
    ("line", "leaked"),
    [
        ("address=Flat 3, Floor: 2, 10 Downing Street, London SW1A 2AA", ["Downing", "SW1A"]),
        ("shipping_address: 5 Main St, Apt: 4B, Springfield IL 62704", ["Springfield", "62704"]),
        ("address: c/o Ana Lopez, Attn: Billing, 4 Privet Drive, Little Whinging", ["Privet", "Whinging"]),
        ("address: 5 Main St, Unit: 7, State: IL, Zip: 62704", ["IL", "62704"]),
        ("address=5 Rue X, floor: 2, 75002 Paris", ["75002", "Paris"]),  # an address's part, any case
    ],
)
def test_a_label_inside_an_address_does_not_end_it(line: str, leaked: list[str]) -> None:
    """A free-form value ended at the line's next ``word:`` pair; addresses hold labels."""
    out = scrub.text(line)
    assert out.endswith("[address]") and [word for word in leaked if word in out] == [], out


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("address=221B Baker Street status=failed", "address=[address] status=failed"),
        ("address: 5 Rue X error: timeout", "address: [address] error: timeout"),
        ("address: 5 Rue X Error: timeout", "address: [address] Error: timeout"),
        ("address: 5 Rue X, Status: sent", "address: [address], Status: sent"),
        ("address: 5 Rue X ValueError: bad input", "address: [address] ValueError: bad input"),
        ('address: 5 Rue X, "Floor": 2', 'address: [address], "Floor": 2'),  # quoted: a program's field
        ("address=5 Rue X Floor=2", "address=[address] Floor=2"),  # '=': a program's field
    ],
)
def test_a_programs_field_or_a_logs_own_label_after_an_address_still_ends_it(
    line: str, expected: str
) -> None:
    assert scrub.text(line) == expected


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("dob=1980 March 12 retried", "retried"),
        ("date_of_birth: 1980, 12 March status=ok", "status=ok"),
        ("birthday=1980 Mar. 12th sent", "sent"),
        ("dob: 1980 March", ""),
    ],
)
def test_a_date_of_birth_written_year_first_is_taken_whole(line: str, kept: str) -> None:
    """A year was a whole date of birth: ``dob=1980 March 12`` kept ``March 12``."""
    out = scrub.text(line)
    assert "March" not in out and "Mar" not in out and "12" not in out and out.endswith(kept), out


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("dob=1980 12 03", "dob=[birth_date]"),
        ("dob=1980 12 03 retried 3 times", "dob=[birth_date] retried 3 times"),
        ("date_of_birth: 03 12 1980, sent to Paris", "date_of_birth: [birth_date], sent to Paris"),
        ("/orders?dob=1980+12+03&n=2", "/orders?dob=[birth_date]&n=2"),
    ],
)
def test_a_date_of_birth_in_digits_with_spaces_is_taken_whole(line: str, expected: str) -> None:
    """A year first was a whole date of birth (``dob=1980 12 03`` kept ``12 03``); the day first,
    the date was no shape and the words after it went with it."""
    assert scrub.text(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("date of birth: 12 March 1980", "date of birth: [birth_date]"),
        ("Date of Birth: 12 March 1980, sent to Paris", "Date of Birth: [birth_date], sent to Paris"),
        ("customer's birth date: 1980-03-12 status=ok", "customer's birth date: [birth_date] status=ok"),
        ('{"date of birth": "12 March 1980", "n": 1}', '{"date of birth": "[birth_date]", "n": 1}'),
        ("birthdate: 12 March 1980 ok", "birthdate: [birth_date] ok"),  # a sibling, a key already
        ("zip code: SW1A 1AA retried", "zip code: [address] retried"),  # any name of several words
        ("api key: k-987-zyx-plain sent", "api key: [secret] sent"),
    ],
)
def test_a_key_of_several_words_written_in_words_is_a_key(line: str, expected: str) -> None:
    """``date of birth:`` was the word ``birth`` before a colon, which names nothing: the date passed."""
    assert scrub.text(line) == expected


def test_a_date_of_birth_after_its_key_in_words_hashes_as_under_the_key() -> None:
    hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")
    value = hashing({"date_of_birth": "12 March 1980"})["date_of_birth"]
    assert hashing.text("Date of Birth: 12 March 1980 ok") == f"Date of Birth: {value} ok"


@pytest.mark.parametrize(
    "line",
    [
        "email sent: 3 of 5",  # ``email`` names a value as a key's last word only
        "status code: 404",
        "due date: 2026-12-01",
        "order number: 73905561427",
        "message id: 0b9d3c1e-4f5a-11ee-8c90-0242ac120002",
        "waiting for: 3 s",
        "primary key: 42",
    ],
)
def test_words_before_a_colon_that_name_no_key_stay(line: str) -> None:
    assert scrub.text(line) == line


#: Lines of some 64 KiB made to stall the patterns added for the leaks above, each built in the
#: child from an expression (``B``: a backslash, ``Q``: a double quote, ``A``: an apostrophe):
#: unclosed brackets and quotes after a key, runs of backslashes, spaces and ``+``, words before
#: colons, nested JSON quotes of every depth read and deeper, escapes at the deepest read.
_ADVERSARIAL_LINES = [
    "'address=' + '{' * 65_000",
    "'address=(' + (A + 'x, ') * 16_000",
    "'address=[' + B * 65_000",
    "'name=(' + A * 65_000",
    "'address=(x) ' * 5_000",
    "'address=' + '(' * 32_000 + ')' * 32_000",
    "'ip_address=[' + '1:' * 32_000 + ']:443'",
    "'date of birth: ' * 4_000",
    "'a ' * 32_000 + 'birth: 12 March 1980'",
    "'birth:' * 10_000",
    "'dob=1980' + ' ' * 65_000 + 'x'",
    "'dob=1980 12' + '+' * 65_000",
    "'dob=12 03 ' * 6_000",
    "B + Q + 'name' + B + Q + ': ' + B + Q + 'x' * 65_000",
    "B + Q + 'name' + B + Q + ': ' + B + Q + (B * 3 + Q) * 16_000",
    "''.join(B + Q + 'name' + B + Q + ': ' + B * k + Q + 'x ' for k in range(1, 70)) * 19",
    "B * 63 + Q + 'name' + B * 63 + Q + ': ' + B * 63 + Q + 'x' * 65_000",
    "B * 7 + Q + 'name' + B * 7 + Q + ': ' + B * 65_000",
    "'ana' + B * 65_000 + 'u00e9@example.com'",
    "(B * 64 + 'u00e9') * 900 + '@example.com'",
    "'a@' + (B * 64 + 'u00e4') * 900 + '.com'",
    # Brackets after a key whose shape refuses them (no ``@``, no digit), unclosed or closed last.
    "'email=(' * 9_300",
    "'email=(' * 8_000 + ')' * 8_000",
    "'phone=(' * 9_300",
    "('phone=(' + A) * 8_000",
    # Runs of spaces of any kind, before ``is``, a value or a date in words (review 4).
    "'ssn' + chr(0xA0) * 65_000 + 'is 078-05-1120'",
    "'born 1985' + chr(9) * 65_000 + 'March 12'",
    "'date of birth ' + ' is' * 21_700",
    "('ssn' + ' ' * 64 + 'x ') * 900 + '12345'",
    "'born ' + ' 12 March' * 8_000 + ' 1985'",
]

_TIMED = """
import sys, time
from jobsystem.privacy.scrub import Scrubber
scrub = Scrubber()
B, Q, A = chr(92), chr(34), chr(39)
for expression in sys.argv[1:]:
    line = eval(expression)
    started = time.perf_counter()
    scrub.text(line)
    print(f"{time.perf_counter() - started:.3f} {len(line)} {expression}")
"""


def test_lines_made_to_stall_the_new_patterns_are_scanned_in_linear_time() -> None:
    """In a child process (the regex engine holds the GIL), as the backslash test above: each line
    of some 64 KiB takes milliseconds; a pattern that backtracks over it, or a scan that starts
    again at each of its characters, takes minutes."""
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _TIMED, *_ADVERSARIAL_LINES],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    times = [line.split(" ", 2) for line in done.stdout.splitlines()]
    assert len(times) == len(_ADVERSARIAL_LINES)
    slow = [(seconds, expression) for seconds, size, expression in times if float(seconds) > 5]
    assert not slow and all(int(size) >= 60_000 for _, size, _ in times), done.stdout
