"""Review of fix/privacy (values in brackets after a personal key, address runs after an email):
faults found, each reproduced as a strict xfail until it is fixed (see each test's reason).

- A value opening with a bracket is read to its closing bracket, and only that: a phone number
  written with its area code in brackets (``(555) 123-4567``) lost its area code only, the rest
  stayed in the line (before the merge the number finder removed it whole).
- Every bracket after a number key is taken for the number: a remark in brackets (``phone:
  (retry 3 of 5)``) is removed, though no phone or card number has that shape.
- A machine's address (an IP, ``host:port``) followed by ``,`` under a plain ``address`` key
  now starts a value in parts, which runs to the line's end: ``address=10.0.0.1, retrying in 5 s``
  lost ``retrying in 5 s``.
- A bracket that no bracket closes is read to the line's end, and when its key's shape refuses
  the value (an email key, no ``@``) the scan starts again at the next such key: quadratic in
  the line's length (a 64 KiB line of ``email=(`` took some 40 s here, on the logging path).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobsystem.privacy.scrub import Scrubber

scrub = Scrubber()

_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.xfail(
    strict=True,
    reason="scrub_pairs.key_values -> _bracketed: '(555)' is the whole value, the rest of the number stays",
)
@pytest.mark.parametrize(
    ("line", "rest"),
    [
        ("phone=(555) 123-4567 status=ok", "123-4567"),
        ("mobile: (020) 7946 0958, retrying", "7946 0958"),
        ("tel=(555)123-4567 ok", "123-4567"),
    ],
)
def test_a_phone_number_with_its_area_code_in_brackets_is_removed_whole(line: str, rest: str) -> None:
    out = scrub.text(line)
    assert rest not in out, out
    assert "[phone]" in out


@pytest.mark.xfail(
    strict=True,
    reason="scrub_pairs._bracketed: a number label's shape test is 'any digit', met by a remark",
)
@pytest.mark.parametrize(
    "line",
    ["sms to phone: (retry 3 of 5) provider timed out", "card: (attempt 2 of 3) declined by the issuer"],
)
def test_a_remark_in_brackets_after_a_number_key_is_kept(line: str) -> None:
    assert scrub.text(line) == line


@pytest.mark.xfail(
    strict=True,
    reason="scrub_extents._freeform_end: any network shape then ',' runs on as a value in parts",
)
@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("address=10.0.0.1, retrying in 5 s", ", retrying in 5 s"),
        ("address=rabbit-1:5672, connection refused (retry 3 of 5)", ", connection refused (retry 3 of 5)"),
    ],
)
def test_what_follows_a_machines_address_and_a_comma_is_kept(line: str, kept: str) -> None:
    out = scrub.text(line)
    assert out == "address=[address]" + kept, out


#: A line (under the default 64 KiB cut) of email keys whose bracket no bracket closes.
_UNCLOSED = """
from jobsystem.privacy.scrub import Scrubber
line = "email=(" * 9300
assert len(line) < Scrubber().max_length
print(len(Scrubber().text(line)))
"""


@pytest.mark.xfail(
    strict=True,
    reason="scrub_freeform.bracketed_end via scrub_pairs._bracketed: a refused value rescans to the line end",
)
def test_unclosed_brackets_after_email_keys_are_scanned_in_linear_time() -> None:
    """In a child process (the regex engine and the scan hold the GIL): linear, it takes
    milliseconds; the wait is a hang guard, not a measure of speed."""
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _UNCLOSED], cwd=_ROOT, env=env, capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a 65 KB line of unclosed brackets took over 15 s to scrub")
    assert done.returncode == 0, done.stderr[-2000:]
