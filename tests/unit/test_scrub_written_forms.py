"""Personal data however it is written: escaped in JSON or bytes, decomposed (NFD) Unicode, national
numbers as their region writes them, identity codes of every century."""

from __future__ import annotations

import pytest

from jobsystem.privacy.scrub import Scrubber

scrub = Scrubber()


hashing = Scrubber(hash_key="a-test-key-of-32-characters-long")


@pytest.mark.parametrize(
    ("written", "address"),
    [
        # json.dumps (ensure_ascii): what a CLI's --json output or a JSON payload in a message holds
        (r"zo\u00eb.garc\u00eda@ex\u00e4mple.com", "zoë.garcía@exämple.com"),
        (r"ana@ex\u00e4mple.com", "ana@exämple.com"),  # an internationalised domain alone
        # the repr of bytes: smtplib's replies in an exception's text
        (r"zo\xc3\xab.garc\xc3\xada@ex\xc3\xa4mple.com", "zoë.garcía@exämple.com"),
    ],
)
def test_email_addresses_with_escaped_non_ascii_letters_are_replaced_whole(written, address):
    assert scrub.text(f"<{written}>: mailbox busy") == "<[email]>: mailbox busy"
    assert hashing.text(written) == hashing.text(address)  # one person, one hash: escaped or not


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("write to ", r"\u2014thanks"),  # json.dumps of an em dash after the address
        ("", r"\u2019s inbox is full"),  # a right single quote: the address's owner
        (r"\u00ab", r"\u00bb ok"),  # French quotes around it
        ("reply: ", r"\u3002ok"),  # a CJK full stop
        ("b'to ", r"\xe2\x80\x94thanks'"),  # the repr of bytes: an em dash in UTF-8
    ],
)
def test_an_escaped_character_next_to_an_address_that_is_no_letter_stays_text(before, after):
    """Escapes stand for letters of an address, but also for the punctuation around one: that and
    the word after it are the text's, and the address hashes as it does everywhere else."""
    assert scrub.text(f"{before}ana@example.com{after}") == f"{before}[email]{after}"
    hashed = hashing.text("ana@example.com")
    assert hashing.text(f"{before}ana@example.com{after}") == f"{before}{hashed}{after}"


@pytest.mark.parametrize(
    "written",
    [
        r"jose\u0301@example.com",
        r"ana@ex\u0301ample.com",
        r"ana@exa\u00admple.com",
        r"jos\xc3\xa9@example.com",
    ],
)
def test_an_escaped_mark_or_invisible_character_inside_an_address_is_part_of_it(written):
    """A decomposed letter (``e`` and a combining accent) or a soft hyphen is no letter by
    ``isalnum``, but no separator either: the address is replaced whole, as before."""
    assert scrub.text(f"to {written} ok") == "to [email] ok"


@pytest.mark.parametrize(
    ("written", "international"),
    [
        ("(11) 98765-4321", "+55 11 98765-4321"),  # Brazil: area code in parentheses, no trunk 0
        ("(11) 3456-7890", "+55 11 3456-7890"),
        ("21 99876-5432", "+55 21 99876-5432"),
        ("138 0013 8000", "+86 138 0013 8000"),  # a Chinese mobile: never written with the 0
    ],
)
def test_a_national_number_its_region_writes_without_the_trunk_zero_is_replaced(written, international):
    """Brazil and China (regions covered) have a trunk 0, but write these numbers without it; the
    UK or Germany never do, so ``20 7946 0958`` stays a number there (tested above)."""
    assert scrub.text(f"ligar para {written} hoje") == "ligar para [phone] hoje"
    assert hashing.text(written) == hashing.text(international)  # one person, one hash


@pytest.mark.parametrize(
    "written",
    ["183 778 3533", "4 579 102 298", "129 9456 4982", "42 957 693 704", "950 136 3476", "1 404 611 086"],
)
def test_a_number_grouped_otherwise_than_its_region_writes_it_stays(written):
    """Read without the trunk 0, these are valid Brazilian, Chinese or Indian numbers, but each
    region writes them in other groups (``(45) 7910-2298``): written so, they are amounts and
    references, which were kept before numbers without the 0 were read at all."""
    assert scrub.text(f"total {written} ok") == f"total {written} ok"


def _finnish_id(birth: str, sign: str) -> str:
    """A valid Finnish personal identity code (henkilötunnus) of ``birth`` (ddmmyy) and century sign."""
    from stdnum.fi import hetu

    for serial in range(2, 900):
        for check in "0123456789ABCDEFHJKLMNPRSTUVWXY":
            code = f"{birth}{sign}{serial:03d}{check}"
            if hetu.is_valid(code):
                return code
    raise AssertionError("no valid code")


@pytest.mark.parametrize("sign", ["-", "+", "A"])  # born in the 1900s, the 1800s, the 2000s
def test_a_finnish_identity_code_is_replaced_whatever_its_century_sign(sign):
    """The sign between birth date and serial is part of the code: ``131052-308T`` is someone born
    in 1952, the most common case, and without its ``-`` it is no valid code at all."""
    code = _finnish_id("131052", sign)
    assert scrub.text(f"henkilötunnus {code} tarkistettu") == "henkilötunnus [id_number] tarkistettu"


def _nfd(text: str) -> str:
    import unicodedata

    return unicodedata.normalize("NFD", text)


@pytest.mark.parametrize(
    "address", ["josé@example.com", "ana@exámple.com", "josé.garcía@correo.es", "zoë@exämple.com"]
)
def test_an_address_written_decomposed_is_replaced_whole_and_hashed_as_composed(address):
    """NFD (macOS file names, some form inputs) writes ``é`` as ``e`` and U+0301, a mark that
    neither ``isalnum`` nor ``\\w`` takes for a letter: judged as NFC, the address is one."""
    decomposed = _nfd(address)
    assert decomposed != address
    assert scrub.text(f"write to {decomposed} now") == "write to [email] now"
    expected = hashing.text(address)
    assert hashing.text(f"write to {decomposed} now") == f"write to {expected} now"
    assert hashing({"email": decomposed}) == {"email": expected}  # under a key: one person, one hash


@pytest.mark.parametrize("address", ["josé@example.com", "ana@exámple.com"])
def test_an_address_json_escaped_decomposed_hashes_as_composed(address):
    """``json.dumps`` writes the decomposed ``é`` as ``e\\u0301``, the composed one as ``\\u00e9``."""
    import json

    escaped = json.dumps(_nfd(address))
    assert "\\u0301" in escaped
    assert scrub.text(escaped) == '"[email]"'
    assert hashing.text(escaped) == f'"{hashing.text(address)}"'
    assert hashing.text(json.dumps(address)) == f'"{hashing.text(address)}"'


@pytest.mark.parametrize(
    ("key", "name"), [("full_name", "José Pérez"), ("customer_name", "Renée Müller"), ("name", "Zoë")]
)
def test_a_keyed_name_written_decomposed_hashes_as_composed(key, name):
    import json

    expected = hashing({key: name})[key]
    assert expected.startswith("name:")
    assert hashing({key: _nfd(name)}) == {key: expected}
    assert hashing.text(json.dumps({key: _nfd(name)})) == json.dumps({key: expected})
    assert hashing.text(json.dumps({key: name})) == json.dumps({key: expected})  # escaped or not
    first = name.split()[0]
    assert hashing.text(f"{key}={_nfd(first)} ok") == f"{key}={hashing({key: first})[key]} ok"


@pytest.mark.parametrize(
    "address",
    [
        "अनिल@example.com",  # Devanagari: vowel signs are marks, in NFC too
        "ana@उदाहरण.भारत",
        "mi\u200cna@example.com",  # a ZWNJ, as Persian names have
        "ana@exa\u00admple.com",  # a soft hyphen
        "n\u0303\u0301o@example.com",  # a mark NFC has no composed letter for
    ],
)
def test_a_mark_or_format_character_left_after_nfc_is_part_of_an_address(address):
    """As their JSON escapes already were: no part of the address is left before ``[email]``."""
    assert scrub.text(f"to {address} ok") == "to [email] ok"


def test_a_configured_secret_is_found_in_either_form():
    secret = "pässwörd-of-the-broker"
    for configured in (secret, _nfd(secret)):
        scrubber = Scrubber(secrets=[configured])
        for written in (secret, _nfd(secret)):
            assert scrubber.text(f"login with {written} failed") == "login with [secret] failed"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Renée called +44 20 7946 0958 about order 73905561427",
            "Renée called [phone] about order 73905561427",
        ),
        ("Zoë's card 4111 1111 1111 1111, NIE Y-4829173-S", "Zoë's card [card], NIE [id_number]"),
        ("café at 81.2.69.142 on 2026-11-02", "café at [ip] on 2026-11-02"),
    ],
)
def test_numbers_in_decomposed_text_are_found_as_before_and_the_text_comes_back_composed(text, expected):
    assert scrub.text(_nfd(text)) == expected
    assert scrub.text(text) == expected


def test_ordinary_ascii_and_composed_text_is_returned_as_it_is():
    line = "job_succeeded actor=send_email queue=emails duration_ms=12.3"
    assert scrub.text(line) is line
    composed = "Renée's report for café Zoë is ready"
    assert scrub.text(composed) == composed
