"""Numbers that identify a person, found in free text and confirmed by libraries made for it.

Candidates are cheap to find; only a candidate that a check confirms is removed, so an order
number, an amount or a timestamp stays:

- national identity and tax numbers of the countries in :data:`NATIONAL_IDS` (UK NHS and NINO,
  German IdNr, French NIR, Spanish DNI/NIE, Italian codice fiscale, Dutch BSN, Swedish
  personnummer, Polish PESEL, Brazilian CPF, Indian Aadhaar, Chinese resident id, South African
  id, Australian TFN and more), validated by ``python-stdnum``'s check digits and date rules;
- payment cards (issuer prefix and length, then ``stdnum.luhn``) and IBANs of every country
  (``stdnum.iban``: country length and mod 97);
- phone numbers, parsed and validated against the numbering plans of ``phonenumbers`` (Google's
  libphonenumber): any number with ``+`` or ``00`` (with ``+``, a possible one too:
  :mod:`scrub_phone_checks`); a national number in a region of ``regions`` when it starts with
  its trunk ``0`` or is written in groups (without the ``0`` of a region that has one only where
  the region writes the number so: Brazil, China's mobiles); a bare run of
  digits without ``+`` or ``0`` is never taken for a phone (order numbers look just like that);
- public IPv4 addresses (the standard library's ``ipaddress``); loopback, private, link-local and
  documentation addresses name machines, not people, and stay.

A run of digits may hold several values or a value next to ordinary numbers: windows of whole
digit groups are tried, longest first. Dates, times, decimal amounts and UUIDs (message ids,
whose first group is all digits about one time in 40) are never candidates.
UK National Insurance numbers have no check digit and ``python-stdnum`` has no module for them:
their format rules (HMRC's prefixes) are checked here.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from importlib import import_module
from types import ModuleType

import phonenumbers
from stdnum import iban as stdnum_iban
from stdnum import luhn
from stdnum.us import ssn as us_ssn
from stdnum.util import get_cc_module

from jobsystem.privacy.scrub_mobiles_in import INDIAN_MOBILE, after_a_plural
from jobsystem.privacy.scrub_phone_checks import as_written, possible_length

__all__ = ["DEFAULT_PHONE_REGIONS", "LETTER_ID_SHAPES", "NATIONAL_IDS", "NumberFinder", "Replace"]

#: ``replace(label, value)``: the text that takes a found value's place.
Replace = Callable[[str, str], str]

#: (country, ``stdnum`` module, lengths in digits, written bare too) of the national numbers that
#: are looked for in runs of digits. A single mod-11 or mod-10 digit (NHS, BSN, Aadhaar, TFN, SIN)
#: passes about one random number in eleven of its length: these are listed because people's
#: numbers matter more than an order number's readability, but weaker checks still (a birth date
#: alone: Danish CPR, Czech and Austrian numbers) are not, and the Canadian SIN only when written
#: in groups. ``tests/unit/test_scrub.py`` measures the resulting rate per length.
NATIONAL_IDS: tuple[tuple[str, str, tuple[int, ...], bool], ...] = (
    ("gb", "nhs", (10,), True),
    ("de", "idnr", (11,), True),
    ("fr", "nir", (15,), True),
    ("nl", "bsn", (9,), True),
    ("se", "personnummer", (10, 12), True),
    ("pl", "pesel", (11,), True),
    ("br", "cpf", (11,), True),
    ("in", "aadhaar", (12,), True),
    ("cn", "ric", (18,), True),
    ("za", "idnr", (13,), True),
    ("au", "tfn", (9,), True),
    ("be", "nn", (11,), True),
    ("no", "fodselsnummer", (11,), True),
    ("ee", "ik", (11,), True),
    ("lt", "asmens", (11,), True),
    ("tr", "tckimlik", (11,), True),
    ("ro", "cnp", (13,), True),
    ("si", "emso", (13,), True),
    ("ch", "ssn", (13,), True),
    ("kr", "rrn", (13,), True),
    ("bg", "egn", (10,), True),
    ("is", "kennitala", (10,), True),
    ("ca", "sin", (9,), False),
)

#: Identifiers with letters, by the shape they are written in (any case, optional separators),
#: and the ``stdnum`` module that confirms them (None: NINO, checked here).
_LETTER_IDS: tuple[tuple[str, str, str | None], ...] = (
    ("nino", r"[A-Za-z]{2}(?:[ \-]?\d\d){3}[ \-]?[A-Da-d]", None),
    ("dni", r"\d{8}[ \-]?[A-Za-z]", "es.dni"),
    ("nie", r"[XYZxyz][ \-]?\d{7}[ \-]?[A-Za-z]", "es.nie"),
    (
        "cf",
        r"[A-Za-z]{6}[\dLMNP-Vlmnp-v]{2}[A-Za-z][\dLMNP-Vlmnp-v]{2}[A-Za-z][\dLMNP-Vlmnp-v]{3}[A-Za-z]",
        "it.codicefiscale",
    ),
    ("ric", r"\d{6}[ ]?\d{8}[ ]?\d{3}[Xx]", "cn.ric"),
    ("nir", r"[12][ ]?\d\d[ ]?\d\d[ ]?2[ABab][ ]?\d{3}[ ]?\d{3}[ ]?\d\d", "fr.nir"),
    ("hetu", r"\d{6}[\-+A-FU-Ya-fu-y]\d{3}[0-9A-Ya-y]", "fi.hetu"),
    ("curp", r"[A-Za-z]{4}\d{6}[HMhm][A-Za-z]{5}[A-Za-z0-9]\d", "mx.curp"),
    ("cc", r"\d{8}[ ]?\d[ ]?[A-Za-z]{2}\d", "pt.cc"),
)
#: Any of those shapes, unchecked (a value after a key that names it needs no check).
LETTER_ID_SHAPES = re.compile(
    r"(?<![\w\-])(?:" + "|".join(f"(?P<{name}>{shape})" for name, shape, _ in _LETTER_IDS) + r")(?![\w\-])"
)
#: IBANs compact or printed in groups of four (any case, spaces or dashes).
_IBAN = re.compile(
    r"(?<![\w\-])[A-Za-z]{2}\d\d(?:[A-Za-z0-9]{11,30}|(?:[ \-][A-Za-z0-9]{4}){2,7}(?:[ \-][A-Za-z0-9]{1,3})?)"
    r"(?![\w\-])"
)
_HAS_IBAN = re.compile(r"[A-Za-z]{2}\d\d")

#: Regions whose national phone numbers are looked for (numbers with ``+``/``00`` in any region).
DEFAULT_PHONE_REGIONS = ("GB", "DE", "FR", "ES", "IT", "NL", "SE", "PL", "BR", "IN", "CN", "ZA", "AU", "US")

_DATE = (
    r"(?:\d{4}[./\-][01]?\d[./\-][0-3]?\d|[0-3]?\d[./\-][0-3]?\d[./\-](?:\d{4}|\d\d))"
    r"(?:[ T]\d\d?:\d\d(?::\d\d(?:[.,]\d+)?)?)?(?![\d])"
)
#: A UUID starting with a digit (one starting with a letter starts no run of digits).
_UUID = r"\d[0-9A-Fa-f]{7}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}"
#: One scan finds UUIDs and dates (left alone), IPv4 addresses and runs of digit groups.
_NUMBERS = re.compile(
    rf"(?P<uuid>(?<![\w\-]){_UUID})"
    r"|(?P<ipv4>(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}(?![\d.]|\.\d))"
    rf"|(?P<date>(?<![\d.])(?<![\d][\-/]){_DATE})"
    r"|(?P<run>(?<![\w.+\-/@%])(?:\+|\(\+?)?\d+(?:(?:[ .\-/]|\) ?| ?\(|[.\-]\()\d+)*)(?![\w@%])"
)
_GROUP = re.compile(r"\d+")
_DECIMAL = re.compile(r"\d+\.\d+")
_MOBILE = phonenumbers.PhoneNumberType.MOBILE
_SSN_FORMAT = re.compile(r"\d{3}([ \-])\d\d\1\d{4}")
_NINO_BAD_PREFIX = frozenset({"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"})

#: Card number prefixes (issuer identification) and the lengths their cards have.
_CARD_BRANDS = (
    (re.compile(r"4"), (13, 16, 19)),  # Visa
    (re.compile(r"5[1-5]|2(?:2[2-9]|[3-6]|7[01]|720)"), (16,)),  # Mastercard
    (re.compile(r"3[47]"), (15,)),  # American Express
    (re.compile(r"3(?:0[0-5]|[68])"), (14, 16)),  # Diners Club
    (re.compile(r"6(?:011|5|4[4-9])|35|62"), (16, 17, 18, 19)),  # Discover, JCB, UnionPay
)


def _is_card(digits: str) -> bool:
    return any(p.match(digits) and len(digits) in lengths for p, lengths in _CARD_BRANDS) and bool(
        luhn.is_valid(digits)
    )


def _is_nino(compact: str) -> bool:
    """HMRC's format rules: no D, F, I, Q, U or V in the prefix, no O second, no reserved pairs."""
    first, second = compact[0], compact[1]
    return (
        first not in "DFIQUV"
        and second not in "DFIOQUV"
        and compact[:2] not in _NINO_BAD_PREFIX
        and compact[-1] in "ABCD"
    )


def _valid(module: ModuleType, number: str) -> bool:
    """``module.is_valid(number)``, False if the validator itself fails (a data file's gap)."""
    try:
        return bool(module.is_valid(number))
    except Exception:
        return False


def _public_ip(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_global
    except ValueError:
        return False


class NumberFinder:
    """Find and replace the numbers of the module's docstring in a text.

    Parameters:
      regions: regions (ISO 3166 codes) whose national phone numbers are looked for.
    """

    def __init__(self, regions: Sequence[str] = DEFAULT_PHONE_REGIONS) -> None:
        self.regions = tuple(regions)
        self._by_length: dict[int, list[tuple[ModuleType, bool]]] | None = None
        self._letter_modules: dict[str, ModuleType] = {}
        self._trunk_zero: tuple[str, ...] = ()
        self._no_trunk: tuple[str, ...] = ()
        self.classify = lru_cache(maxsize=4096)(self._classify)
        self.phone = lru_cache(maxsize=4096)(self._phone)
        self.phones = lru_cache(maxsize=1024)(self._phones)

    def _load(self) -> dict[int, list[tuple[ModuleType, bool]]]:
        """Import the validators on first use, so importing this module costs nothing."""
        if self._by_length is None:
            by_length: dict[int, list[tuple[ModuleType, bool]]] = {}
            for country, name, lengths, bare in NATIONAL_IDS:
                module = get_cc_module(country, name)
                if module is None:  # pragma: no cover - a module renamed in a future release
                    continue
                for length in lengths:
                    by_length.setdefault(length, []).append((module, bare))  # type: ignore[arg-type]
            for _, _, path in _LETTER_IDS:
                if path:
                    self._letter_modules[path] = import_module(f"stdnum.{path}")
            prefixes = {r: phonenumbers.PhoneMetadata.metadata_for_region(r) for r in self.regions}
            self._trunk_zero = tuple(r for r, m in prefixes.items() if m and m.national_prefix == "0")
            self._no_trunk = tuple(r for r in self.regions if r not in self._trunk_zero)
            self._by_length = by_length
        return self._by_length

    # --- validation (memoised: one person's number recurs) ---

    def _classify(self, digits: str, formatted: str, whole: bool, possible: bool = False) -> str | None:
        """The label of a window of digits written as ``formatted``, or None. Only a window
        that starts its run (``whole``) may be a phone number: digits before it belong to
        something else (the rest of an IBAN, a reference), and phone plans accept a lot.
        ``possible``: a number with ``+`` need only be possible (see :meth:`_readings`)."""
        by_length = self._load()
        if formatted.startswith(("+", "(")) or digits.startswith("00"):
            return "phone" if whole and self.phone(formatted, possible) else None  # written as a phone number
        if 13 <= len(digits) <= 19 and _is_card(digits):
            return "card"
        if _SSN_FORMAT.fullmatch(formatted):
            return "ssn" if _valid(us_ssn, digits) else None
        grouped = formatted != digits
        for module, bare in by_length.get(len(digits), ()):
            if (bare or grouped) and _valid(module, digits):
                return "id_number"
        return "phone" if whole and self.phone(formatted) else None

    def _phone(self, formatted: str, possible: bool = False) -> str | None:
        """The number in E.164 if ``formatted`` is a valid phone number (with ``possible``, written
        with ``+``, a possible one: see :meth:`_readings`), else None."""
        number = next(self._readings(formatted, possible), None)
        if number is None:
            return None
        return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)

    def _phones(self, formatted: str) -> tuple[phonenumbers.PhoneNumber, ...]:
        """Every valid number ``formatted`` reads as, one per region that reads it so."""
        return tuple(self._readings(formatted))

    def _readings(self, formatted: str, possible: bool = False) -> Iterator[phonenumbers.PhoneNumber]:
        """The valid numbers ``formatted`` reads as, in the order of the regions tried; with
        ``possible`` and a ``+``, a possible one too (:mod:`scrub_phone_checks`): in free text only,
        where a valid window is preferred (:meth:`_window`); a keyed number's groups are judged
        by valid readings (:mod:`scrub_groups`)."""
        self._load()
        digits = "".join(c for c in formatted if c.isdigit())
        if not 7 <= len(digits) <= 17:
            return
        without_trunk: tuple[str, ...] = ()
        mobile_only = False
        plus = possible and formatted.startswith(("+", "(+"))
        if formatted.startswith(("+", "(+")) or digits.startswith("00"):
            candidates: tuple[tuple[str, str | None], ...] = (("+" + digits.removeprefix("00"), None),)
        elif digits[0] == "0":
            candidates = tuple((formatted, r) for r in self._trunk_zero + self._no_trunk)
        elif "IN" in self.regions and INDIAN_MOBILE.fullmatch(formatted):
            # India writes its mobiles ``98765 43210``, without the trunk 0 and in two groups,
            # a shape few amounts or ids take: only a valid mobile number of the plan is taken.
            candidates, mobile_only = ((formatted, "IN"),), True
        elif formatted != digits and 9 <= len(digits) <= 11 and 3 <= len(_GROUP.findall(formatted)) <= 4:
            # In groups, without a 0: a region with no trunk 0, or one with it that writes this
            # number without it (Brazil's ``(11) 98765-4321``, China's mobiles): see as_written.
            without_trunk = self._trunk_zero
            candidates = tuple((formatted, r) for r in self._no_trunk + without_trunk)
        else:
            return  # a bare run of digits: an order number as often as a phone
        for text, region in candidates:
            try:
                number = phonenumbers.parse(text, region)
                if (
                    (phonenumbers.is_valid_number(number) or (plus and possible_length(number)))
                    and (region not in without_trunk or as_written(number, text))
                    and (not mobile_only or phonenumbers.number_type(number) == _MOBILE)
                ):
                    yield number
            except Exception:  # NumberParseException, or a gap in the library's metadata
                continue

    def confirms(self, label: str, written: str) -> bool:
        """Whether ``written``, a value after a key labelled ``label``, passes the checks of its
        kind: a valid phone number (``phone``), an IBAN (``iban``), else a card or national number."""
        if label == "phone":
            return self.phone(written) is not None
        compact = re.sub(r"[^0-9A-Za-z]", "", written).upper()
        if label == "iban":
            return _valid(stdnum_iban, compact)
        return compact.isdigit() and 7 <= len(compact) <= 19 and bool(self.classify(compact, written, True))

    def letter_id(self, kind: str, compact: str) -> bool:
        """Whether ``compact`` (upper case, no separators) is a valid identifier of ``kind``."""
        self._load()
        if kind == "nino":
            return _is_nino(compact)
        path = next(p for name, _, p in _LETTER_IDS if name == kind)
        assert path is not None
        return _valid(self._letter_modules[path], compact)

    # --- scanning ---

    def sub(self, text: str, replace: Replace) -> str:
        """``text`` with every confirmed number replaced by ``replace(label, value)``."""
        if _HAS_IBAN.search(text):
            text = _IBAN.sub(lambda m: self._iban(m.group(), replace), text)
        text = _NUMBERS.sub(lambda m: self._number(m, replace), text)
        return LETTER_ID_SHAPES.sub(lambda m: self._letters(m, replace), text)

    def _number(self, match: re.Match[str], replace: Replace) -> str:
        found = match.group()
        if match.lastgroup in ("uuid", "date"):
            return found
        if match.lastgroup == "ipv4":
            return replace("ip", found) if _public_ip(found) else found
        if _DECIMAL.fullmatch(found):
            return found
        return self._run(found, replace, match.string, match.start())

    def _run(self, run: str, replace: Replace, text: str = "", at: int = 0) -> str:
        """``run`` (found at ``at`` in ``text``) with its confirmed values replaced."""
        groups = [(m.start(), m.end()) for m in _GROUP.finditer(run)]
        if sum(end - start for start, end in groups) < 7:
            return run
        before = text[max(0, at - 40) : at]
        parts: list[str] = []
        done = index = 0
        while index < len(groups):
            whole = index == 0 or done == groups[index - 1][1]
            hit = self._window(run, groups, index, done, whole=whole, before=before)
            if hit is None:
                index += 1
                continue
            begin, last, label, value = hit
            end = groups[last][1]
            parts += (run[done:begin], replace(label, value))
            done, index = end, last + 1
        return "".join(parts) + run[done:] if parts else run

    def _window(
        self, run: str, groups: list[tuple[int, int]], first: int, done: int, *, whole: bool, before: str
    ) -> tuple[int, int, str, str] | None:
        """The longest window of digit groups from ``first`` that is a confirmed value; ``whole``
        when the window starts the run or follows a replaced value; ``before``: the text before the run.
        A number with ``+`` that is possible but not valid is taken only when no window is valid:
        a plan of many lengths finds ``+39 06 1234 5678 12`` possible, and its ``12`` is a count."""
        begin = groups[first][0]
        while begin > done and run[begin - 1] in "+(":
            begin -= 1
        windows: list[tuple[int, str]] = []
        digits = ""
        plus = "+" in run[begin : groups[first][0]]
        international = plus or run.startswith("00", groups[first][0])
        for last in range(first, len(groups)):
            group = run[groups[last][0] : groups[last][1]]
            if last > first and len(group) < 2 and not international:
                break  # a list of small numbers (``1 2 3 4``), not one number in groups
            digits += group
            if len(digits) > 19:
                break
            windows.append((last, digits))
        for possible in (False, True) if plus and whole else (False,):
            for last, digits in reversed(windows):
                if len(digits) < 7:
                    break
                formatted = run[begin : groups[last][1]]
                if formatted.count("(") > formatted.count(")"):
                    formatted = formatted.lstrip("(")  # a parenthesis around the number, not its area code
                label = self.classify(digits, formatted, whole, possible)
                mobile_in = label == "phone" and INDIAN_MOBILE.fullmatch(formatted)
                if mobile_in and (last + 1 < len(groups) or after_a_plural(before)):
                    label = None  # two groups of five among more, or after a plural: a list of numbers
                if label is not None:
                    value = self.phone(formatted, possible) if label == "phone" else digits
                    return groups[last][1] - len(formatted), last, label, value or digits
        return None

    def _letters(self, match: re.Match[str], replace: Replace) -> str:
        kind = match.lastgroup or ""
        found = match.group()
        # A Finnish code's "-" is its century sign, not a separator: kept, or the code is invalid.
        compact = (found if kind == "hetu" else re.sub(r"[ \-]", "", found)).upper()
        return replace("id_number", compact) if self.letter_id(kind, compact) else found

    def _iban(self, found: str, replace: Replace) -> str:
        """An IBAN, or a prefix of whole groups that is one (the shape may run into the next words)."""
        words = re.split(r"([ \-])", found)
        for end in range(len(words), 0, -2):
            candidate = "".join(words[:end])
            compact = re.sub(r"[ \-]", "", candidate).upper()
            if len(compact) < 15:
                break
            if _valid(stdnum_iban, compact):
                return replace("iban", compact) + "".join(words[end:])
        return found
