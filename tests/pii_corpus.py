"""Personal data and secrets of every kind the scrubber must remove.

Values found by pattern appear in free text; values found only by their key (a name, an address,
a password) appear only under a key naming them: no pattern can tell "Ana Lopez" from other words.
National identity numbers are generated: a stem of our own, completed with the check digits
``python-stdnum`` computes (or accepts), so each is valid and belongs to nobody we know of.
"""

from __future__ import annotations

import json
import random
import re
from types import ModuleType
from typing import Any

from stdnum.au import tfn
from stdnum.br import cpf
from stdnum.cn import ric
from stdnum.de import idnr
from stdnum.es import dni, nie
from stdnum.fr import nir
from stdnum.gb import nhs
from stdnum.in_ import aadhaar
from stdnum.it import codicefiscale
from stdnum.nl import bsn
from stdnum.pl import pesel
from stdnum.se import personnummer
from stdnum.za import idnr as za_idnr


def _complete(module: ModuleType, stem: str, alphabet: str = "0123456789X") -> str:
    """``stem`` and the check character ``module`` accepts."""
    for char in alphabet:
        if module.is_valid(stem + char):
            return stem + char
    raise ValueError(f"no check character makes {stem} valid for {module.__name__}")


def _german_idnr() -> str:
    """A valid IdNr: its first ten digits follow digit-repetition rules, so search a seeded stream."""
    rng = random.Random(13)
    while True:
        stem = str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(9))
        try:
            return _complete(idnr, stem, "0123456789")
        except ValueError:
            continue


def _spaced(value: str, *sizes: int, sep: str = " ") -> str:
    out, at = [], 0
    for size in sizes:
        out.append(value[at : at + size])
        at += size
    return sep.join(out)


_IDNR = _german_idnr()


_NIR = "2870275123456" + nir.calc_check_digits("2870275123456")


_CPF = "528916374" + cpf._calc_check_digits("528916374")


_PESEL = "9107251234" + pesel.calc_check_digit("9107251234")


_RIC = _complete(ric, "11010519850307293")


_RIC_X = next(r for r in (_complete(ric, f"44030419870615{i:03d}") for i in range(100)) if r.endswith("X"))


#: (label, value) of national identity and tax numbers, each written as people write it.
NATIONAL_IDS: list[tuple[str, str]] = [
    ("id_number", "AB 12 34 56 C"),  # UK NINO (format rules only: it has no check digit)
    ("id_number", "jg103759a"),  # UK NINO, lower case, no spaces
    ("id_number", _spaced(_IDNR, 2, 3, 3, 3)),  # German IdNr
    ("id_number", _IDNR),
    ("id_number", _spaced(_NIR, 1, 2, 2, 2, 3, 3, 2)),  # French NIR
    ("id_number", "48263917" + dni.calc_check_digit("48263917")),  # Spanish DNI
    ("id_number", "Y-4829173-" + nie.calc_check_digit("Y4829173")),  # Spanish NIE
    ("id_number", "BNCGLI90A41H501" + codicefiscale.calc_check_digit("BNCGLI90A41H501")),  # Italian CF
    ("id_number", _complete(bsn, "27318495")),  # Dutch BSN
    ("id_number", _spaced(_complete(personnummer, "900612239"), 6, 4, sep="-")),  # Swedish
    ("id_number", _PESEL),  # Polish PESEL
    ("id_number", f"{_CPF[:3]}.{_CPF[3:6]}.{_CPF[6:9]}-{_CPF[9:]}"),  # Brazilian CPF
    ("id_number", _CPF),
    ("id_number", _spaced(_complete(aadhaar, "49186273051"), 4, 4, 4)),  # Indian Aadhaar
    ("id_number", _RIC),  # Chinese resident id
    ("id_number", _RIC_X),  # Chinese resident id ending in X
    ("id_number", _complete(za_idnr, "860415512308")),  # South African id
    ("id_number", _spaced(_complete(tfn, "46581327"), 3, 3, 3)),  # Australian TFN
    ("id_number", _spaced(_complete(nhs, "485777345"), 3, 3, 4)),  # UK NHS number
]


#: (label, value) in the shapes that used to slip past the patterns.
SHAPES: list[tuple[str, str]] = [
    ("email", "maría.garcía@example.es"),
    ("email", "Søren.Ødegård@eksempel.dk"),
    ("card", "4111.1111.1111.1111"),
    ("card", "5555/5555/5555/4444"),
    ("iban", "de89-3704-0044-0532-0130-00"),
    ("iban", "gb82 west 1234 5698 7654 32"),
    ("phone", "+4915112345678"),
    ("phone", "07400123456"),
    ("phone", "0033612345678"),
    ("ip", "81.2.69.142"),
    ("ip", "2a00:1450:4001:82b::200e"),
]


#: Email addresses URL-encoded inside a URL: (URL, the encoded address, the address).
ENCODED_EMAILS: list[tuple[str, str, str]] = [
    (
        "https://shop.example/unsubscribe?u=ana.lopez%40example.com&list=7",
        "ana.lopez%40example.com",
        "ana.lopez@example.com",
    ),
    (
        "/api/customers/mar%C3%ADa.garc%C3%ADa%40example.es/orders",
        "mar%C3%ADa.garc%C3%ADa%40example.es",
        "maría.garcía@example.es",
    ),
]


#: (label, value) found by pattern anywhere, in several formats each.
BY_PATTERN: list[tuple[str, str]] = [
    ("email", "ana.lopez@example.com"),
    ("email", "J.Smith+orders@mail.example.co.uk"),
    ("email", "noreply_42@sub.example-shop.de"),
    ("phone", "+44 20 7946 0958"),
    ("phone", "+1 (415) 555-0134"),
    ("phone", "+33 1 23 45 67 89"),
    ("phone", "+49 30 12345678"),
    ("phone", "+4915112345678"),
    ("phone", "0044 20 7946 0958"),
    ("phone", "(415) 555-0199"),
    ("phone", "415-555-0176"),
    ("phone", "415.555.0123"),
    ("phone", "1-800-555-0111"),
    ("phone", "020 7946 0321"),
    ("phone", "07700 900123"),
    ("phone", "06 12 34 56 78"),
    ("phone", "030-12345678"),
    ("phone", "70123 45678"),  # an Indian mobile, as India writes it: no trunk 0
    ("card", "4111 1111 1111 1111"),
    ("card", "4012-8888-8888-1881"),
    ("card", "5555555555554444"),
    ("card", "3782 822463 10005"),
    ("card", "6011 1111 1111 1117"),
    ("card", "2223 0031 2200 3222"),
    ("ssn", "512-34-5678"),
    ("ssn", "123-45-6789"),
    ("ssn", "536 22 8726"),
    ("iban", "DE89 3704 0044 0532 0130 00"),
    ("iban", "GB82WEST12345698765432"),
    ("iban", "FR14 2004 1010 0505 0001 3M02 606"),
    ("iban", "NL91ABNA0417164300"),
]


#: (replacement, secret) found by pattern: the secret part must go, the scheme may stay.
SECRETS: list[tuple[str, str, str]] = [
    ("Bearer [token]", "Bearer mF_9.B5f-4.1JqM7tLz8Xw2", "mF_9.B5f-4.1JqM7tLz8Xw2"),
    ("Basic [token]", "Basic YWxhZGRpbjpvcGVuc2VzYW1l", "YWxhZGRpbjpvcGVuc2VzYW1l"),
    (
        "[token]",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ),
    ("[secret]", "sk_live_51HxYzAbCdEfGhIjKlMn0pQr", "sk_live_51HxYzAbCdEfGhIjKlMn0pQr"),
    ("[secret]", "AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("[secret]", "ghp_16C7e42F292c6912E7710c838347Ae178B4a", "ghp_16C7e42F292c6912E7710c838347Ae178B4a"),
    ("[secret]", "xoxb-263594206564-2343594206574-FGqddMF8t08v8N7Oq4i57vs1", "FGqddMF8t08v8N7Oq4i57vs1"),
    ("[secret]", "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0LzMn", "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0LzMn"),
    (
        "postgres://app:[password]@db.internal:5432/shop",
        "postgres://app:S3cr3t-Pa55word@db.internal:5432/shop",
        "S3cr3t-Pa55word",
    ),
    (
        "https://ops:[password]@api.example.com/v1",
        "https://ops:hunter2hunter2@api.example.com/v1",
        "hunter2hunter2",
    ),
]


#: (key, label, value) found only by the key naming them.
BY_KEY: list[tuple[str, str, Any]] = [
    ("full_name", "name", "Ana Lucia Lopez"),
    ("first_name", "name", "Jean-Luc"),
    ("lastName", "name", "Picard-Okafor"),
    ("name", "name", "Marta Kowalska"),
    ("address", "address", "221B Baker Street, London NW1 6XE"),
    ("shipping_address", "address", "99 Rue de Rivoli, 75001 Paris"),
    ("password", "password", "correct-horse-battery-staple"),
    ("client_secret", "secret", "s3cr3t-of-the-client"),
    ("api_key", "secret", "k-987-zyx-plain"),
    ("Authorization", "authorization", "Digest username-hidden"),
    ("cookie", "cookie", "sessionid=abc123def456"),
    ("card_cvv", "card", "737"),
    ("date_of_birth", "birth_date", "1984-07-30"),
    ("phone", "phone", 4155550134),
]


#: (key, label, value) of numbers written in groups after a key in free text (``mobile: 70123
#: 45678``): the whole value is the key's, not only its first group.
KEYED_IN_GROUPS: list[tuple[str, str, str]] = [
    ("mobile", "phone", "70123 45678"),  # an Indian mobile, as India writes it
    ("phone", "phone", "+44 7700 900123"),
    ("tel", "phone", "0161 496 0000"),
    ("telephone", "phone", "+33 1 23 45 67 89"),
    ("fax", "phone", "+49 (0)30 1234 5678"),
    ("msisdn", "phone", "+91 98765 43210"),
    ("cell", "phone", "020 7946 0958"),
    ("customerPhone", "phone", "415 555 0134"),
    ("recipient", "recipient", "+44 7700 900123"),  # an SMS's recipient
    ("ssn", "ssn", "123 45 6789"),
    ("nino", "id_number", "QQ 12 34 56 C"),
    ("nie", "id_number", "X 4829173 L"),
    ("tax_id", "id_number", _spaced(_IDNR, 2, 3, 3, 3)),
    ("national_id", "id_number", _spaced(_NIR, 1, 2, 2, 2, 3, 3, 2)),
    ("iban", "iban", "DE89 3704 0044 0532 0130 00"),
    ("iban", "iban", "GB82 WEST 1234 5698 7654 32"),
    ("iban", "iban", "BE71 0961 2345 6769"),
    ("card_number", "card", "4111 1111 1111 1111"),
    ("card", "card", "3782 822463 10005"),
    ("account_number", "account", "12 3456 7890"),
    ("phone", "phone", "06 12 34 56 78"),  # French, which Germany's plan reads too
    ("phone", "phone", "+39 06 1234 5678"),  # Italy's and Germany's plans have numbers of many lengths
    ("phone", "phone", "+49 30 1234567"),
    ("phone", "phone", "030 1234 567"),  # ``030 1234`` is valid too: the number is taken whole
    # Grouped by no-break spaces (U+00A0; U+202F, as French typography groups digits).
    ("phone", "phone", "06\u00a012\u00a034\u00a056\u00a078"),
    ("tel", "phone", "+33\u202f1\u202f23\u202f45\u202f67\u202f89"),
    ("iban", "iban", "DE89\u00a03704\u00a00044\u00a00532\u00a00130\u00a000"),
    ("nino", "id_number", "QQ\u00a012\u00a034\u00a056\u00a0C"),
]


#: (key, label, value) of numbers written as one word after a key; ``card_id=42`` passes no check.
KEYED_WORDS: list[tuple[str, str, str]] = [
    ("phone", "phone", "0612345678"),
    ("phone", "phone", "0301234567"),
    ("phone", "phone", "+447700900123"),
    ("ssn", "ssn", "078-05-1121"),
    ("account_number", "account", "12345678"),
    ("card_id", "card", "42"),
]


#: Ordinary text right after a keyed number: counts, status codes, durations, epoch seconds. The
#: number ends before it (``phone: 0612345678 3 attempts``).
AFTER_A_KEYED_NUMBER: list[str] = [
    "3 attempts",
    "7 rows",
    "404",
    "12 ms",
    "200 300",
    "1714557633",
    "2026-11-02 10:20:33",
]


#: (key, label, value) of free-form values after a key in free text (``address=221B Baker Street``):
#: an unquoted one runs on to the line's next ``key=value`` pair, a closing bracket or quote, or its end.
KEYED_FREE_FORM: list[tuple[str, str, str]] = [
    ("address", "address", "221B Baker Street"),
    ("address", "address", "5 rue de la Paix, 75002 Paris"),
    ("shipping_address", "address", "Flat 3, 12 Rue Lepic, 75018 Paris, France"),
    ("billingAddress", "address", "1600 Amphitheatre Pkwy, Mountain View, CA 94043"),
    ("street", "address", "Calle de Alcalá 42, 3º izq"),
    ("homeAddress", "address", "c/o Ana Lopez, 4 Privet Drive, Little Whinging"),
    ("address", "address", "Flat 3, Floor: 2, 10 Downing Street, London SW1A 2AA"),  # a label inside
    ("shipping_address", "address", "5 Main St, Apt: 4B, Springfield IL 62704"),
    ("dob", "birth_date", "early spring of eighty"),  # a date of birth in no shape: all of it
]


#: (key, label, value) of dates of birth and postcodes of several words: taken whole by their shape.
KEYED_SHAPED: list[tuple[str, str, str]] = [
    ("dob", "birth_date", "12 March 1980"),
    ("date_of_birth", "birth_date", "March 12, 1980"),
    ("birthday", "birth_date", "12th of March"),
    ("birth_date", "birth_date", "12. März 1980"),
    ("dob", "birth_date", "12 de marzo de 1980"),
    ("birthDate", "birth_date", "1er mars 1980"),
    ("dob", "birth_date", "1980 March 12"),  # the year first
    ("date_of_birth", "birth_date", "1980, 12 March"),
    ("dob", "birth_date", "1980 12 03"),  # in digits, with spaces
    ("birth_date", "birth_date", "03 12 1980"),
    ("postcode", "address", "SW1A 1AA"),
    ("postal_code", "address", "K1A 0B1"),
    ("zip_code", "address", "1012 AB"),
    ("postalCode", "address", "D02 X285"),
    ("zipcode", "address", "114 55"),
    ("postCode", "address", "EC1A 1BB"),  # ``postCode``: a postcode key of two words
]

#: (key written in words, label, value) of personal numbers in no shape the finders take (a
#: passport with letters, an ID or a tax number in another country's format): only the key gives
#: them away, after ``:``, ``=`` or `` is ``, in any case.
KEYED_IN_WORDS: list[tuple[str, str, str]] = [
    ("passport number", "id_number", "X1234567"),
    ("Passport No", "id_number", "C03005988"),
    ("phone number", "phone", "555 0134"),  # a local number without its area code
    ("customer phone number", "phone", "2079460"),
    ("social security number", "ssn", "219 09 9999"),  # in groups no SSN check confirms
    ("credit card number", "card", "4111 1111 1111 1112"),  # a digit mistyped: fails Luhn
    ("bank account number", "account", "31926819"),
    ("tax id", "id_number", "912-70-1234"),  # a US ITIN
    ("tax number", "id_number", "12/345/67890"),  # a German Steuernummer
    ("driver's licence number", "id_number", "MORGA753116SM9IJ"),  # a UK driving licence
    ("driver license number", "id_number", "D1234567"),  # a Californian one
    ("national insurance number", "id_number", "1234567FA"),  # an Irish PPS number
    ("phone number", "phone", "06 12 34 56 78"),  # a French mobile: two digits, then groups
    ("passport no", "id_number", "AB12CDEFG"),  # letters and two digits: the fewest taken after is
]

#: Keys named in ways the scrubber did not recognise before, each with a value only the key gives away.
NEW_KEYS: list[tuple[str, str, str]] = [
    ("mail", "email", "Ana at the office"),
    ("Tel", "phone", "home line via reception"),
    ("cell", "phone", "ring-twice-after-six"),
    ("fname", "name", "Marta-Beatriz"),
    ("recipient", "recipient", "Marta Kowalska"),
    ("emergency-contact", "contact", "Jean-Luc Picard"),
    ("ip", "ip", "client-behind-the-proxy"),
    ("REMOTE_ADDR", "ip", "edge-node-sofia"),
    ("dni", "id_number", "kept-at-front-desk"),
    ("nino", "id_number", "awaiting-hmrc-letter"),
    ("pass", "password", "open sesame mellon"),
    ("db_pw", "password", "mellon-friend-99"),
]


def all_pattern_values() -> list[tuple[str, str]]:
    """(label, value) of everything found by its shape, old kinds and new."""
    return BY_PATTERN + NATIONAL_IDS + SHAPES


def free_text() -> str:
    """One paragraph holding every value found by pattern, and every secret."""
    values = [value for _, value in all_pattern_values()] + [text for _, text, _ in SECRETS]
    values += [url for url, _, _ in ENCODED_EMAILS]
    return "Customer wrote: " + "; then ".join(values) + "."


def keyed() -> dict[str, Any]:
    """A customer record: every value found by key, plus pattern values under neutral keys."""
    record: dict[str, Any] = {key: value for key, _, value in BY_KEY + NEW_KEYS}
    record["email"] = "ana.lopez@example.com"
    record["channels"] = [{"kind": "mobile", "value": "+44 20 7946 0958"}, ("card", "4111 1111 1111 1111")]
    record["documents"] = [value for _, value in NATIONAL_IDS[:6]]
    return record


def _values() -> list[str]:
    """Every personal value and secret of the corpus, as written."""
    raw = [value for _, value in all_pattern_values()] + [secret for _, _, secret in SECRETS]
    raw += [str(value) for _, _, value in BY_KEY + NEW_KEYS if len(str(value)) > 4]
    raw += [form for _, encoded, address in ENCODED_EMAILS for form in (encoded, address)]
    raw += [value for _, _, value in KEYED_IN_GROUPS + KEYED_FREE_FORM + KEYED_SHAPED + KEYED_IN_WORDS]
    return [*raw, "4111111111111111", "4155550134"]


def needles() -> list[str]:
    """Strings whose presence anywhere in an output is a leak (raw and JSON-escaped)."""
    return sorted({form for value in _values() for form in (value, json.dumps(value)[1:-1])})


_SEPARATORS = re.compile(r"(?<=[0-9a-z])[\s.\-/()+]{1,3}(?=[0-9a-z])")


def _joined(text: str) -> str:
    """``text`` folded to lower case with separators between letters and digits removed."""
    return _SEPARATORS.sub("", text.casefold())


def leaks(output: str) -> list[str]:
    """The corpus values found in ``output``: as written, JSON-escaped, in any case, and for numbers
    and identifiers in any separator variant (``4111 1111…``, ``4111-1111…``, ``41111111…``)."""
    found = {needle for needle in needles() if needle in output}
    folded, joined = output.casefold(), _joined(output)
    for value in _values():
        if value.casefold() in folded or value.casefold().replace("@", "%40") in folded:
            found.add(value)
        compact = re.sub(r"[^0-9a-z]", "", value.casefold())
        if sum(c.isdigit() for c in compact) >= 6 and compact in joined:
            found.add(value)
    return sorted(found)
