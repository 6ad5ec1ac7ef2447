"""The shapes that end a free-form value after its key in free text: a date of birth, a postcode,
a machine's address.

An address or a date of birth after its key runs on to the end of its value
(:mod:`scrub_freeform`), but some of them have a shape that says where they end, and the
ordinary words after it stay:

- a date of birth: a date in digits (``1980-03-12``, ``12/03/1980``, with spaces too: ``1980 12
  03``, ``03 12 1980``; a day and a month without the year: ``12/03``, ``12.03.``), a year, or a
  day, a month named in English, French, German, Spanish, Italian, Portuguese or Dutch and a
  year or not, in either order (``12 March 1980``, ``March 12, 1980``, ``12. März 1980``, ``12 de
  marzo de 1980``, ``1er mars``, ``March 12th``, ``March 1980``), the year
  first too (``1980 March 12``, ``1980, 12 March``, ``1980 March``): a year alone ends the value
  only when no month follows it;
- a postcode (a key naming one, :func:`~jobsystem.privacy.scrub_keys.is_postcode_key`): the
  shapes written in two parts (``SW1A 1AA``, ``K1A 0B1``, ``1012 AB``, ``D02 X285``,
  ``114 55``, ``110 001``), or any first word with a digit (``75002``, ``94105-1234``);
- under any other address key, a machine's or a mailbox's address as its first word
  (``81.2.69.142:5672``, ``smtp.example.com:25``, ``00:1a:2b:3c:4d:5e``, ``ana@example.com``,
  ``tcp://host``): the words after it are no part of a street's; under a key naming a machine's
  address (:func:`~jobsystem.privacy.scrub_keys.is_machine_address_key`: ``server_address``,
  ``bind_addr``), a bare host name too (``rabbit-1``, ``db.internal``, ``localhost``).

A value in none of these shapes is free-form: it runs on to its end, as a value without a shape
does (remove when in doubt).
"""

from __future__ import annotations

import re

from jobsystem.privacy.scrub_spaces import SPACE

__all__ = ["ONE_DIGIT_DAY", "birth_date_end", "network_end", "postcode_end"]

#: Months, in full and abbreviated, in the languages the project's regions write (English,
#: French, German, Spanish, Italian, Portuguese, Dutch); an abbreviation's ``.`` before the year
#: is taken (``Mar. 1980``), a sentence's is not (``12 March.``).
_MONTHS = (
    "january|february|march|april|may|june|july|august|september|october|november|december|jan|feb|"
    "mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|janvier|février|fevrier|mars|avril|mai|juin|juillet|"
    "août|aout|septembre|octobre|novembre|décembre|decembre|janv|févr|fevr|avr|juil|déc|januar|"
    "februar|märz|maerz|juni|juli|oktober|dezember|jän|mrz|okt|dez|enero|febrero|marzo|abril|mayo|"
    "junio|julio|agosto|septiembre|setiembre|octubre|noviembre|diciembre|gennaio|febbraio|aprile|"
    "maggio|giugno|luglio|settembre|ottobre|dicembre|janeiro|fevereiro|março|marco|maio|junho|"
    "julho|setembro|outubro|novembro|dezembro|januari|februari|maart|mei|augustus"
)
_MONTH = rf"(?:{_MONTHS})(?:\.(?={SPACE}*\d))?"
_DAY = r"[0-3]?\d(?:st|nd|rd|th|er|º|°|\.)?(?!\d)"
#: A day that ends a date: a ``.`` after it ends a sentence (``1980 March 12. Next``).
_LAST_DAY = r"[0-3]?\d(?:st|nd|rd|th|er|º|°)?(?!\d)"
_YEAR4 = r"(?:1[89]|20)\d\d"
_YEAR = rf"{_YEAR4}|'?\d\d"
#: Between a date's parts: spaces of any kind (:mod:`scrub_spaces`) or a URL's ``+``, after a comma
#: or not, or ``-/.``.
_SEP = rf"(?:,?(?:{SPACE}+|\+)|[\-/.])"
#: Where a shape may end: not inside a word, a number, a decimal or a time (``1980.5``, ``10:20``).
_END = r"(?![\w\-/:]|[.,]\d)"

#: A date in digits with spaces (or a URL's ``+``) between its parts, the year first or last
#: (``1980 12 03``, ``03 12 1980``): a day and a month of one or two digits, a year of four.
_SPACED_DIGITS = rf"{_YEAR4}{_SEP}[0-3]?\d{_SEP}[0-3]?\d(?!\d)|[0-3]?\d{_SEP}[0-3]?\d{_SEP}{_YEAR4}"

#: A day of one digit and a month's name (``1 March``, ``1st of March``, ``1. März``, ``1er mars``):
#: where a date of birth may start after its key and a space, though it has no two digits close
#: together (:mod:`scrub_is_value` looks for those).
ONE_DIGIT_DAY = rf"\d(?:st|nd|rd|th|er|º|°|\.)?{SPACE}+(?:(?:of|de){SPACE}+)?(?i:{_MONTHS})(?![^\W\d_])"

#: A day and a month in digits without a year, either first (``12/03``, ``12.03.``, ``3-25``): a
#: birthday as a form asks for it; read only after a key of a date of birth, where it is one.
_DAY_MONTH = r"[0-3]?\d[\-/.][0-3]?\d\.?"

#: A date of birth at the start of a value (see the module).
_BIRTH_DATE = re.compile(
    rf"(?:\d{{1,4}}[\-/.]\d{{1,2}}[\-/.]\d{{1,4}}(?:T[\d:.]+(?:Z|[+\-]\d\d:?\d\d)?)?|\d{{8}}|{_SPACED_DIGITS}"
    rf"|{_DAY_MONTH}"
    rf"|{_DAY}{_SEP}(?:(?:of|de|del){SPACE}+)?{_MONTH}(?:{_SEP}(?:(?:de|del){SPACE}+)?(?:{_YEAR}))?"
    rf"|{_MONTH}{_SEP}{_DAY}(?:{_SEP}(?:{_YEAR}))?|{_MONTH}{_SEP}(?:\d{{4}})"
    rf"|{_YEAR4}{_SEP}(?:{_MONTH}(?:{_SEP}{_LAST_DAY})?|{_DAY}{_SEP}{_MONTH})|{_YEAR4})" + _END,
    re.IGNORECASE,
)
#: A postcode written in two parts at the start of a value: British, Canadian, Dutch (its letters
#: in capitals), Irish (Eircode), and three digits and two or three (Sweden, Czechia, Greece, India).
_POSTCODE = re.compile(
    rf"(?:(?i:[A-Z]{{1,2}}\d[A-Z\d]?{SPACE}?\d[A-Z]{{2}})|(?i:[A-Z]\d[A-Z]{SPACE}?\d[A-Z]\d)"
    rf"|\d{{4}}{SPACE}?[A-Z]{{2}}|(?i:[A-Z]\d[\dW]){SPACE}?(?:[A-Z\d]{{4}}|(?=[a-z\d]*\d)[a-z\d]{{4}})"
    rf"|\d{{3}}{SPACE}\d{{2,3}})" + _END
)
#: A machine's or a mailbox's address as a whole first word: a URL, an IPv4 address or a host with
#: a port, hexadecimal groups joined by colons (IPv6, MAC), an email address.
_NETWORK = re.compile(
    r"[a-z][a-z0-9+.\-]*://\S+|\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?|[a-z0-9][\w.\-]*:\d{1,5}"
    r"|[0-9a-f]{0,4}(?::[0-9a-f]{0,4}){2,7}(?:%\w+)?|[^\s@]+@[\w\-]+(?:\.[\w\-]+)+",
    re.IGNORECASE,
)

#: A bare host name, in lower case as hosts are named: ``localhost``, a dotted name whose last
#: label starts with a letter (``db.internal``), or one label with a digit or a hyphen
#: (``rabbit-1``, ``web01``); a word of a street (``Flat``, ``221B``, ``rue``) is none.
_HOST = re.compile(
    r"(?:localhost|[a-z][a-z0-9\-]*(?:\.[a-z0-9][a-z0-9\-]*)*\.[a-z][a-z0-9\-]*"
    r"|[a-z](?=[a-z0-9\-]*[\d\-])[a-z0-9\-]*[a-z0-9])\.?"
)


def birth_date_end(text: str, begin: int) -> int | None:
    """The end of a date of birth at ``text[begin]``, or None if none starts there."""
    match = _BIRTH_DATE.match(text, begin)
    return match.end() if match else None


def postcode_end(text: str, begin: int, stop: int) -> int | None:
    """The end of a postcode at ``text[begin]`` (first word ``text[begin:stop]``), or None if
    none starts there."""
    match = _POSTCODE.match(text, begin)
    if match:
        return match.end()
    return stop if any(c.isdigit() for c in text[begin:stop]) else None


def network_end(text: str, begin: int, stop: int, host_names: bool = False) -> int | None:
    """``stop`` if the first word ``text[begin:stop]`` is a machine's or a mailbox's address, or
    with ``host_names`` (a key naming a machine's address) a bare host name too."""
    if _NETWORK.fullmatch(text, begin, stop) or (host_names and _HOST.fullmatch(text, begin, stop)):
        return stop
    return None
