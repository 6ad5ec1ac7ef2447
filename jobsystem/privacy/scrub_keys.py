"""Which key names hold personal data or secrets, and with what label.

A key is split into lower-case tokens (``customerEmail``, ``customer-email`` and ``CUSTOMER_EMAIL``
all become ``customer email``). Three kinds of name match:

- :data:`DEFAULT_KEYS`: unambiguous names, wherever their tokens appear in the key, in order
  (``billing_email``, ``email_address``), as one word (``firstname``) or plural (``emails``);
- :data:`DEFAULT_TAIL_KEYS`: short or common words that name personal data only as the key's last
  word, its head noun (``client_ip``, ``db_pass``, ``customer_mail``), not as a qualifier
  (``ip_whitelist``, ``pass_rate``, ``mail_server``);
- :data:`DEFAULT_EXACT_KEYS`: names that match only as the whole key (``name`` alone is a
  person's name far more often than not, ``queue_name`` or ``template_name`` are not).

A name of several words is a key written in words too, in free text (``date of birth:``, ``Birth
Date:``, ``zip code:``): :meth:`KeyMatcher.label_of_words`. So is a name of a personal number
followed by ``number`` or ``no`` (``phone number:``, ``passport number:``, ``social security
number:``, ``driver's licence number:``, ``Reisepass Nummer:``), but no other word before it:
``order number:``, ``retry number:`` and ``port number:`` name an operation's numbers, not a person's.

Names in the other languages of the product's regions (``Personalausweisnummer``, ``numéro de
sécurité sociale``, ``pasaporte``, ``paspoortnummer``): :mod:`scrub_keys_languages`; accents are
folded before names are compared (``numéro`` is ``numero``).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence

from jobsystem.privacy.scrub_keys_languages import LANGUAGE_KEYS, LANGUAGE_TAIL_KEYS, NUMBER_WORDS

__all__ = [
    "DEFAULT_EXACT_KEYS",
    "DEFAULT_KEYS",
    "DEFAULT_TAIL_KEYS",
    "EXTRA_LABEL",
    "NUMBER_LABELS",
    "SECRET_LABELS",
    "KeyMatcher",
    "is_machine_address_key",
    "is_place_address_key",
    "is_postcode_key",
    "tokens",
]

#: Labels of secrets: always ``[label]``, never a hash (a hash of a password is still a secret).
SECRET_LABELS = frozenset({"password", "secret", "token", "authorization", "cookie", "redacted"})

#: Label of keys added by configuration (``extra_keys``).
EXTRA_LABEL = "redacted"

#: Labels of the keys whose values are numbers (often written in groups): a phone, a card, an
#: IBAN, a social security, national, tax or account number.
NUMBER_LABELS = frozenset({"phone", "card", "iban", "ssn", "id_number", "account"})

#: Words after a number's name in a key written in words (``phone number``, ``passport no``,
#: ``Reisepass Nummer``).
_NUMBER_WORDS = frozenset({"number", "no", "nr", "num"}) | NUMBER_WORDS

DEFAULT_KEYS: Mapping[str, str] = {
    # Secrets: replaced, never hashed.
    "password": "password",
    "passwd": "password",
    "pwd": "password",
    "passphrase": "password",
    "passcode": "password",
    "secret": "secret",
    "credential": "secret",
    "api_key": "secret",
    "access_key": "secret",
    "private_key": "secret",
    "signing_key": "secret",
    "token": "token",
    "authorization": "authorization",
    "auth": "authorization",
    "cookie": "cookie",
    "session_id": "cookie",
    "cvv": "card",
    "cvc": "card",
    # Personal data: replaced, or hashed with a hash key.
    "email": "email",
    "e_mail": "email",
    "phone": "phone",
    "mobile": "phone",
    "telephone": "phone",
    "fax": "phone",
    "msisdn": "phone",
    "ssn": "ssn",
    "social_security": "ssn",
    "tax_id": "id_number",
    "tax_number": "id_number",
    "national_id": "id_number",
    "national_insurance": "id_number",
    "id_number": "id_number",
    "passport": "id_number",
    "driver_license": "id_number",
    "drivers_license": "id_number",
    "driver_licence": "id_number",
    "drivers_licence": "id_number",
    "driving_licence": "id_number",
    "driving_license": "id_number",
    "personnummer": "id_number",
    "codice_fiscale": "id_number",
    "aadhaar": "id_number",
    "pesel": "id_number",
    "nhs_number": "id_number",
    "card": "card",
    "card_number": "card",
    "cardholder": "name",
    "iban": "iban",
    "account_number": "account",
    "account_no": "account",
    "address": "address",
    "street": "address",
    "postcode": "address",
    "post_code": "address",
    "postal_code": "address",
    "zip_code": "address",
    "zipcode": "address",
    "ip_address": "ip",
    "remote_addr": "ip",
    "x_forwarded_for": "ip",
    "first_name": "name",
    "last_name": "name",
    "full_name": "name",
    "middle_name": "name",
    "given_name": "name",
    "family_name": "name",
    "maiden_name": "name",
    "display_name": "name",
    "customer_name": "name",
    "recipient_name": "name",
    "contact_name": "name",
    "holder_name": "name",
    "surname": "name",
    "username": "name",
    "user_name": "name",
    "birth_date": "birth_date",
    "birthdate": "birth_date",
    "date_of_birth": "birth_date",
    "birthday": "birth_date",
    "dob": "birth_date",
    **LANGUAGE_KEYS,
}

DEFAULT_TAIL_KEYS: Mapping[str, str] = {
    "pass": "password",
    "pw": "password",
    "mail": "email",
    "tel": "phone",
    "cell": "phone",
    "fname": "name",
    "lname": "name",
    "recipient": "recipient",
    "contact": "contact",
    "ip": "ip",
    "dni": "id_number",
    "nie": "id_number",
    "nif": "id_number",
    "nino": "id_number",
    "cpf": "id_number",
    "bsn": "id_number",
    "nir": "id_number",
    "tfn": "id_number",
    "curp": "id_number",
    **LANGUAGE_TAIL_KEYS,
}

DEFAULT_EXACT_KEYS: Mapping[str, str] = {"name": "name"}

#: Key names, their words joined, whose values are postcodes: addresses with a shape of their own.
_POSTCODE_NAMES = ("postcode", "postalcode", "zipcode")
#: The word (and its short forms) of an address key, and the qualifiers before it that name a
#: machine's address, not a place's (``server_address``, ``bindAddr``, ``peer-address``).
_ADDRESS_WORDS = ("addresses", "address", "addr")
_MACHINE_QUALIFIERS = frozenset(
    {"server", "bind", "remote", "local", "listen", "host", "peer", "ip", "mac", "broker", "node", "socket"}
    | {"proxy", "gateway", "upstream", "backend", "hardware", "network"}
)
#: Qualifiers before an address word that name a place's address, a person's or a business's
#: (``home_address``, ``billingAddress``); ``new_``, ``primary_`` and the like name either.
_PLACE_QUALIFIERS = frozenset(
    {"home", "billing", "shipping", "delivery", "postal", "mailing", "street", "residential", "residence"}
    | {"physical", "correspondence", "registered", "business", "office", "work", "permanent", "customer"}
    | {"contact", "invoice", "return", "pickup", "forwarding", "legal"}
)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPLIT = re.compile(r"[^a-z0-9]+")


def tokens(key: str) -> tuple[str, ...]:
    """The lower-case words of a key name: ``customerEmail`` -> ``("customer", "email")``; its
    letters without their accents (``numéroDePasseport`` -> ``("numero", "de", "passeport")``), a
    degree sign as the ``º`` it is typed for (``N°`` -> ``("no",)``, as ``Nº``)."""
    if not key.isascii():
        key = "".join(
            c for c in unicodedata.normalize("NFKD", key.replace("°", "º")) if not unicodedata.combining(c)
        )
    return tuple(t for t in _SPLIT.split(_CAMEL.sub("_", key).lower()) if t)


def is_postcode_key(key: str) -> bool:
    """Whether ``key`` names a postcode (``postcode``, ``shipping_zip_code``, ``postalCode``)."""
    joined = "".join(tokens(key))
    return any(name in joined for name in _POSTCODE_NAMES)


def is_machine_address_key(key: str) -> bool:
    """Whether ``key`` names a machine's address: its last word is an address, qualified by a word
    of :data:`_MACHINE_QUALIFIERS` (``server_address``, ``listenAddr``, ``bindaddress``)."""
    return _address_qualifier(key) in _MACHINE_QUALIFIERS


def is_place_address_key(key: str) -> bool:
    """Whether ``key`` names a place's address: its last word is an address, qualified by a word
    of :data:`_PLACE_QUALIFIERS` (``home_address``, ``shippingAddr``, ``billing address``)."""
    return _address_qualifier(key) in _PLACE_QUALIFIERS


def _address_qualifier(key: str) -> str | None:
    """The word qualifying the address word that ends ``key`` (``server`` of ``server_address``
    and of ``serveraddress``), empty if none does (``address``); None if no address word ends it."""
    words = tokens(key)
    if not words:
        return None
    last = words[-1]
    word = next((w for w in _ADDRESS_WORDS if last.endswith(w)), None)
    if word is None:
        return None
    return last.removesuffix(word) or (words[-2] if len(words) > 1 else "")


def _singular(word: str) -> tuple[str, ...]:
    return (word, word.removesuffix("s"), word.removesuffix("es"))


class KeyMatcher:
    """The label of a key name, or None; see the module's docstring.

    Parameters:
      keys: names matched anywhere in a key, by label.
      tail_keys: names matched as the key's last word(s), by label.
      exact_keys: names matched as the whole key, by label.
      extra_keys: more names matched anywhere, labelled :data:`EXTRA_LABEL`.
    """

    def __init__(
        self,
        keys: Mapping[str, str] = DEFAULT_KEYS,
        tail_keys: Mapping[str, str] = DEFAULT_TAIL_KEYS,
        exact_keys: Mapping[str, str] = DEFAULT_EXACT_KEYS,
        extra_keys: Iterable[str] = (),
    ) -> None:
        specs = {tokens(k): label for k, label in keys.items()}
        specs.update({tokens(k): EXTRA_LABEL for k in extra_keys if tokens(k)})
        self._specs = specs
        self._joined = {"".join(t): label for t, label in specs.items()}
        self._widths = sorted({len(t) for t in specs}, reverse=True)
        self._tails = {tokens(k): label for k, label in tail_keys.items()}
        self._tail_widths = sorted({len(t) for t in self._tails}, reverse=True)
        self._exact = {"_".join(tokens(k)): label for k, label in exact_keys.items()}
        self._cache: dict[str, str | None] = {}
        phrases = [t for t in specs if len(t) > 1]
        #: The last words of the names of several words, and the words after a number's name:
        #: only a word of these may end a key written in words (a cheap test before looking at the
        #: words before it).
        self.phrase_ends = frozenset(t[-1] for t in phrases) | _NUMBER_WORDS
        #: Words before the last that a key written in words has, at most.
        #: A number's name before ``number`` (``social security``) counts whole.
        widest_number = max((len(t) for t, label in specs.items() if label in NUMBER_LABELS), default=0)
        self.phrase_words = max([len(t) - 1 for t in phrases] + [widest_number])
        self._phrase_widths = sorted({len(t) for t in phrases}, reverse=True)
        births = {
            max(t, key=len) for t, label in (*specs.items(), *self._tails.items()) if label == "birth_date"
        }
        #: The longest word of each key naming a date of birth (``birth`` of ``date_of_birth``,
        #: ``born``, ``dob``), but one holding another (``birthday``): a text without one has no
        #: date of birth after its key. Looked for as substrings of the text in lower case
        #: (:meth:`has_birth_word`): a regular expression in any case tries every word at every
        #: place (5 us a line of 50 characters), and one of the lower-case text costs more than these.
        self._birth_words = tuple(sorted(w for w in births if not any(o != w and o in w for o in births)))

    def has_birth_word(self, text: str) -> bool:
        """Whether ``text`` has, in any case, a word of a key naming a date of birth."""
        lower = text.lower()
        for word in self._birth_words:  # noqa: SIM110 - a generator in any() costs a line 1.5k instructions more
            if word in lower:
                return True
        return False

    def label(self, key: str) -> str | None:
        """The label of ``key`` if it names personal data or a secret, else None (memoised)."""
        try:
            return self._cache[key]
        except KeyError:
            pass
        label = self._label(key)
        if len(self._cache) < 8192:  # key names come from code: a bounded set in practice
            self._cache[key] = label
        return label

    def ends_phrase(self, word: str) -> bool:
        """Whether ``word`` (any case, accents or not: ``Núm``) may end a key written in words."""
        if word.isascii():
            return word.lower() in self.phrase_ends
        folded = tokens(word)
        return len(folded) == 1 and folded[0] in self.phrase_ends

    def label_of_words(self, words: Sequence[str]) -> tuple[int, str] | None:
        """A key written in words (``date of birth:``, ``Birth Date:``, ``zip code:``): how many of
        ``words`` (each a word of letters, the last nearest to the separator), counted from the
        last, name a key of several words (``date_of_birth``, ``birth_date``, ``zip_code``,
        ``api_key``) in any case, and its label; None if they end none. Only a name that the last
        word ends counts: ``email sent:`` names nothing (``email`` names a value as a key's last
        word, not as a word before it), and neither does a word alone (that is :meth:`label`'s).
        A name of a number's kind (:data:`NUMBER_LABELS`) and ``number`` after it is one too
        (``phone number``, ``social security no``); ``order number`` is not."""
        if len(words) < 2 or not self.ends_phrase(words[-1]):
            return None
        written = tokens(" ".join(words))
        if len(written) != len(words):  # each word one token (``birthDate`` is two)
            return None
        found = self._ending(written, self._phrase_widths)
        if found is None and written[-1] in _NUMBER_WORDS:
            named = self._ending(written[:-1], self._widths)
            if named is not None and named[1] in NUMBER_LABELS:
                return named[0] + 1, named[1]
        return found

    def _ending(self, words: tuple[str, ...], widths: Sequence[int]) -> tuple[int, str] | None:
        """The widest name of :attr:`_specs`, of one of ``widths``, that ``words`` end with."""
        for width in widths:
            label = self._specs.get(words[-width:]) if width <= len(words) else None
            if label is not None:
                return width, label
        return None

    def _label(self, key: str) -> str | None:
        words = tokens(key)
        if not words:
            return None
        exact = self._exact.get("_".join(words))
        if exact:
            return exact
        for width in self._tail_widths:
            if len(words) >= width:
                *head, last = words[-width:]
                for form in _singular(last):
                    label = self._tails.get((*head, form))
                    if label:
                        return label
        return self._anywhere(words)

    def _anywhere(self, words: tuple[str, ...]) -> str | None:
        for width in self._widths:
            for start in range(len(words) - width + 1):
                window = words[start : start + width]
                label = self._specs.get(window)
                if label is None and width == 1:
                    word = window[0]
                    label = self._joined.get(word) or next(
                        (self._specs[(w,)] for w in _singular(word)[1:] if (w,) in self._specs), None
                    )
                if label:
                    return label
        return None
