"""Personal data and secrets recognised by their shape in free text (numbers: :mod:`scrub_numbers`;
values after a key that names them: :mod:`scrub_pairs`).

Each finder takes the text and ``replace(label, value)`` and returns the text with what it found
replaced; each runs only when a cheap test on the text passes (``"@" in text``...), so ordinary
lines pay a few substring checks.

- Credentials: a URL's password (``scheme://user:password@host``), and a bare ``user:password@host``
  (what ``urlsplit()`` leaves in ``netloc``, as a Sentry frame shows a ``SplitResult``); bearer and
  basic credentials, JWTs, API keys with a known prefix, long random-looking tokens.
- Email addresses, with non-ASCII local parts and domains (``maría@exämple.es``), also escaped as
  JSON writes them (``\\u00ed``, and ``\\\\u00ed`` in JSON text inside a JSON string) or as the
  repr of ``bytes`` does (``\\xc3\\xad``: smtplib's replies in an exception's text), and
  URL-encoded (``ana%40example.com`` in a query string).
- Public IPv6 addresses (IPv4: :mod:`scrub_numbers`).
"""

from __future__ import annotations

import base64
import ipaddress
import re
import unicodedata
from collections.abc import Callable, Iterable
from itertools import pairwise
from urllib.parse import unquote

__all__ = [
    "ESCAPE_SLASHES",
    "JSON_DEPTH",
    "KEY_REPLACEMENT",
    "QUOTE_SLASHES",
    "REPLACEMENT",
    "Replace",
    "already_removed",
    "credentials",
    "emails",
    "encoded_emails",
    "ipv6",
    "known_secrets",
    "secrets",
    "unescaped",
]

#: ``replace(label, value)``: the text that takes a found value's place.
Replace = Callable[[str, str], str]

#: What a replaced value looks like: scrubbing its own output changes nothing.
REPLACEMENT = re.compile(r"\[[a-z_]+\]|[a-z_]+:[0-9a-f]{12}")
#: A replacement standing alone in a key, as in a key we scrubbed (``[card]``, ``('[email]',)``), not
#: a form field's part after a name or index (``params[password]``, ``items[0][email]``): it names its value.
KEY_REPLACEMENT = re.compile(r"(?<![\w\]])(?:\[[a-z_]+\]|[a-z_]+:[0-9a-f]{12})(?![\w\[])")

#: The password of a URL: up to the last ``@`` of the authority, as ``urlsplit`` reads it.
_URL_PASSWORD = re.compile(r"(?P<head>://[^\s/:@]{0,256}:)(?P<pw>[^\s/]{1,256}?)@(?=[^\s/@]*(?:[/\s]|$))")
#: ``user:password@host`` without a scheme; the user part is what a URL's userinfo allows.
_NETLOC_PASSWORD = re.compile(
    r"(?<![\w.%+\-~:/@])(?!mailto:)(?P<head>[\w.%+\-~]{1,64}:)"
    r"(?P<pw>[^\s/'\"\\\]\[,;(){}<>]{1,256}?)@(?=[\w\[][^\s/@'\"]*(?:[^\w.\-:\[\]@]|$))"
)
_JWT = re.compile(r"eyJ(?<!\weyJ)[\w\-]{4,}\.eyJ[\w\-]{4,}\.[\w\-]*")
_BEARER = re.compile(r"[Bb](?<!\w[Bb])(?:earer|EARER)\s+[\w\-.~+/]{8,}=*")
_BASIC = re.compile(r"B(?<!\wB)asic\s+(?P<credentials>[A-Za-z0-9+/]{6,}={0,2})")
_KEY_PREFIXES = (
    *("sk_", "pk_", "rk_", "sk-", "AKIA", "AIza", "ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    *("github_pat_", "xox", "glpat-", "SG."),
)
_HAS_KEY_PREFIX = re.compile("|".join(re.escape(prefix) for prefix in _KEY_PREFIXES))
_PREFIXED_KEY = re.compile(
    r"(?<![\w\-])(?:(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{10,}|sk-[A-Za-z0-9_\-]{20,}|AKIA[0-9A-Z]{16}"
    r"|AIza[\w\-]{35}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|xox[abposr]-[A-Za-z0-9\-]{10,}"
    r"|glpat-[\w\-]{20,}|SG\.[\w\-]{16,}\.[\w\-]{16,})(?![\w\-])"
)
_GENERIC_SECRET = re.compile(r"[A-Za-z0-9_\-](?<![\w\-][A-Za-z0-9_\-])[A-Za-z0-9_\-]{31,}(?![\w\-])")
_EMAIL_LOCAL_PUNCT = frozenset("._%+-!#$&*^~")
#: JSON text is read nested in JSON strings up to seven ``json.dumps`` deep (a message body kept as
#: a string in a log line, in an exported event, is three deep; more is no payload's), or in the
#: repr of text six deep. Each level doubles the backslashes before a quote, and adds one
#: (``"``, ``\\"``, ``\\\\\\"``): a quote of text seven deep has 63 of them, of the repr of text six
#: deep 62; each doubles those before an escape (``\\u00e4``, ``\\\\u00e4``): 64 at most. Past
#: that, one character of the text takes a line's hundred.
JSON_DEPTH = 7
#: Backslashes before a quote of JSON text nested in JSON strings, at most.
QUOTE_SLASHES: int = 2 ** (JSON_DEPTH - 1) - 1
#: Backslashes before an escape of a character in JSON text nested in JSON strings, at most.
ESCAPE_SLASHES: int = 2 ** (JSON_DEPTH - 1)
#: A non-ASCII character as JSON (``\\u00e4``) or the repr of ``bytes`` (``\\xc3\\xa4``) writes it;
#: in JSON text nested in JSON strings its backslash is escaped too (``\\\\u00e4``, ``\\\\\\\\u00e4``).
_ESCAPE = rf"\\{{1,{ESCAPE_SLASHES}}}(?:u[0-9a-fA-F]{{4}}|x[0-9a-fA-F]{{2}})"
_ESCAPED = re.compile(_ESCAPE)
_DOMAIN_ALNUM = rf"(?:[^\W_]|{_ESCAPE})"
_EMAIL_DOMAIN = re.compile(
    rf"(?:{_DOMAIN_ALNUM}(?:(?:[\w\-]|{_ESCAPE}){{0,61}}{_DOMAIN_ALNUM})?\.){{1,8}}"
    rf"(?:[^\W\d_]|{_ESCAPE}){{2,24}}\b"
)
_ENCODED_AT = re.compile(r"%40", re.IGNORECASE)
_IPV6 = re.compile(
    r"(?<![\w:.%])(?=[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:)[0-9A-Fa-f:]{2,39}(?:%[\w.]+)?(?![\w:])"
)


def already_removed(value: str) -> bool:
    """Already a replacement, or a masked value: nothing to remove."""
    return bool(REPLACEMENT.fullmatch(value)) or value in ("***", "*****", "[Filtered]")


def credentials(text: str) -> str:
    """Passwords in URLs and in bare ``user:password@host`` become ``[password]``."""

    def password(match: re.Match[str]) -> str:
        return match.group() if already_removed(match["pw"]) else f"{match['head']}[password]@"

    if "://" in text:
        text = _URL_PASSWORD.sub(password, text)
    return _NETLOC_PASSWORD.sub(password, text)


def known_secrets(text: str, values: Iterable[str]) -> str:
    """Every occurrence of a configured secret (a password from a URL setting) becomes ``[secret]``."""
    for value in values:
        if value in text:
            text = text.replace(value, "[secret]")
    return text


def secrets(text: str) -> str:
    """Tokens and keys: JWTs, bearer and basic credentials, prefixed API keys, random-looking strings."""
    if "eyJ" in text:
        text = _JWT.sub("[token]", text)
    if "earer" in text or "EARER" in text:
        text = _BEARER.sub(lambda m: m.group().split(None, 1)[0] + " [token]", text)
    if "Basic" in text:
        text = _BASIC.sub(_basic, text)
    if _HAS_KEY_PREFIX.search(text):
        text = _PREFIXED_KEY.sub("[secret]", text)
    if len(text) >= 32:
        text = _GENERIC_SECRET.sub(_generic_secret, text)
    return text


def _basic(match: re.Match[str]) -> str:
    try:
        encoded = match["credentials"]
        decoded = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except ValueError:
        return match.group()
    return "Basic [token]" if b":" in decoded else match.group()  # else the English word "Basic"


def _generic_secret(match: re.Match[str]) -> str:
    found = match.group()
    letters = sum(c.isalpha() for c in found)
    digits = sum(c.isdigit() for c in found)
    if found.lower() == found or found.upper() == found or digits < 2 or letters < 8:
        return found  # lower-case hex (ids, hashes), constants, words: not a secret
    return "[secret]"


def _separates(char: str) -> bool:
    """Whether an escaped character ends an address: punctuation, a space or a symbol (a dash, a
    quote, a no-break space). Letters, digits, marks (``e\\u0301``: é decomposed) and the rest
    may be part of one: when unsure, more is replaced rather than an address left in part."""
    return unicodedata.category(char)[0] in "PZS"


def _escape_code(escape: str) -> tuple[str, int]:
    """The kind (``u`` or ``x``) and the code of an escape, whatever the backslashes before it."""
    body = escape.lstrip("\\")
    return body[0], int(body[1:], 16)


def _in_local(escape: str) -> bool:
    """Whether an escape may be part of a local part: not a character that separates one, bar
    the punctuation a local part allows; any byte of a UTF-8 character (``\\u00ab``, the ``«``
    before ``«ana@…»``, is not)."""
    kind, code = _escape_code(escape)
    if kind == "x" and code >= 0x80:
        return True
    return chr(code) in _EMAIL_LOCAL_PUNCT or not _separates(chr(code))


def _local_start(text: str, at: int, floor: int) -> int:
    """Where the local part of an address whose ``@`` is at ``at`` begins (``at`` if none). Up to
    128 of its characters are looked at, an escape's backslashes not counted (``\\\\u00ed`` in
    nested JSON text is one letter, at any depth read: :data:`ESCAPE_SLASHES`)."""
    start, walked = at, 0
    while start > floor and walked < 128:
        char = text[start - 1]
        if char.isalnum() or char in _EMAIL_LOCAL_PUNCT:
            start -= 1
            walked += 1
        elif char == "\\":
            run = start - 1  # the first backslash of the escape, one per level of JSON strings
            while run > floor and text[run - 1] == "\\" and start - run < ESCAPE_SLASHES:
                run -= 1
            escape = _ESCAPED.match(text, run)
            if escape is None:
                break
            if not _in_local(escape.group()):
                start = escape.end()  # its hex digits, taken for letters, are not the address's
                break
            start = run  # ``\\u00ed``, ``\\xc3``: a non-ASCII letter as JSON or repr() escapes it
        else:
            break
    while start < at and text[start] in "._%+-":
        start += 1  # punctuation cannot start a local part (``'x.-ana@…``)
    return start


def emails(text: str, replace: Replace) -> str:
    """Addresses ``local@domain`` (any script) become ``replace("email", address)``."""
    return _addresses(text, "@", replace)


def encoded_emails(text: str, replace: Replace) -> str:
    """Addresses URL-encoded as ``local%40domain`` become ``replace("email", address)``."""
    return _addresses(_ENCODED_AT.sub("%40", text), "%40", replace)


def unescaped(address: str) -> str:
    """``address`` with its ``\\uXXXX`` and ``\\xNN`` (UTF-8 bytes) escapes decoded; as it is if
    they do not decode."""
    if "\\" not in address:
        return address
    text = _ESCAPED.sub(_unicode_escape, address)
    if "\\x" not in text:
        return text
    try:
        raw = _ESCAPED.sub(lambda m: chr(_escape_code(m.group())[1]), text)  # each byte as a code point
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return address


def _unicode_escape(match: re.Match[str]) -> str:
    """A ``\\uXXXX`` escape as its character; a ``\\xNN`` one as it is (a byte of a character)."""
    kind, code = _escape_code(match.group())
    return chr(code) if kind == "u" else match.group()


def _escaped_char(escapes: list[re.Match[str]], index: int) -> tuple[str | None, int]:
    """The character the escape at ``index`` begins (None if it begins none) and the index after
    it: one ``\\uXXXX`` or ASCII ``\\xNN``, or the ``\\xNN`` bytes of one UTF-8 character."""
    kind, code = _escape_code(escapes[index].group())
    if kind == "u" or code < 0x80:
        return chr(code), index + 1
    size = 2 if 0xC0 <= code < 0xE0 else 3 if 0xE0 <= code < 0xF0 else 4 if 0xF0 <= code < 0xF8 else 0
    run = escapes[index : index + size]
    if not size or len(run) < size or any(a.end() != b.start() for a, b in pairwise(run)):
        return None, index + 1
    try:
        return bytes(_escape_code(m.group())[1] for m in run).decode("utf-8"), index + size
    except UnicodeDecodeError:
        return None, index + 1


def _domain(text: str, pos: int) -> re.Match[str] | None:
    """The domain of an address from ``pos``, ending before an escape that separates it from the
    text: JSON writes ``ana@example.com—thanks`` as ``ana@example.com\\u2014thanks``, whose dash
    and next word are the text's, not the domain's (nor in its hash). Whole if what is before
    that escape is no domain."""
    domain = _EMAIL_DOMAIN.match(text, pos)
    if domain is None or "\\" not in domain.group():
        return domain
    escapes = list(_ESCAPED.finditer(text, pos, domain.end()))
    index = 0
    while index < len(escapes):
        char, after = _escaped_char(escapes, index)
        if char is not None and char != "-" and _separates(char):
            return _EMAIL_DOMAIN.match(text, pos, escapes[index].start()) or domain
        index = after
    return domain


#: A character that is neither ASCII nor a letter or digit: a mark, a format character, or
#: punctuation, a symbol, a space (see :func:`_mark_as_letter`).
_ODD = re.compile(r"[^\x00-\x7f\w]")


def _mark_as_letter(match: re.Match[str]) -> str:
    """A mark or an invisible format character (U+0301 left after NFC as in ``n\\u0303\\u0301``,
    Devanagari's vowel signs, the ZWNJ of Persian names, a soft hyphen) as the letter ``a``, any
    other character as it is: the escaped forms of those are part of an address already
    (:func:`_separates`), so their raw forms are too."""
    char = match.group()
    category = unicodedata.category(char)
    return "a" if category[0] == "M" or category == "Cf" else char


def _addresses(text: str, at_sign: str, replace: Replace) -> str:
    parts: list[str] = []
    done = 0
    # Found in a copy of the same length where marks are letters; cut from the text itself.
    shape = text if text.isascii() else _ODD.sub(_mark_as_letter, text)
    at = text.find(at_sign)
    while at != -1:
        start = _local_start(shape, at, done)
        domain = _domain(shape, at + len(at_sign)) if start < at else None
        if domain is not None:
            address = text[start:at] + "@" + text[at + len(at_sign) : domain.end()]
            if at_sign != "@":
                address = unquote(address)  # one person, one hash: encoded or not
            address = unescaped(address)  # one person, one hash: escaped or not
            parts += (text[done:start], replace("email", address))
            done = domain.end()
        at = text.find(at_sign, max(at + 1, done))
    if not parts:
        return text
    parts.append(text[done:])
    return "".join(parts)


def ipv6(text: str, replace: Replace) -> str:
    """Public IPv6 addresses become ``replace("ip", address)``; others (loopback, link-local,
    private, documentation) name machines, not people, and stay."""

    def found(match: re.Match[str]) -> str:
        candidate = match.group()
        try:
            address = ipaddress.IPv6Address(candidate.split("%", 1)[0])
        except ValueError:
            return candidate
        return replace("ip", candidate) if address.is_global else candidate

    return _IPV6.sub(found, text)
