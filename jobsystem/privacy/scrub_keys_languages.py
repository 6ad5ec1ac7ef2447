"""Key names of personal data in the other languages of the product's regions, and in words.

The product serves customers in Germany, France, Spain, Italy and the Netherlands: a log line or a
form's field may name a passport, an identity card, a tax or social security number or a date of
birth in their language (``Personalausweisnummer: …``, ``numéro de sécurité sociale: …``,
``pasaporte: …``). Accents are folded before keys are compared (``numéro`` is ``numero``:
:func:`~jobsystem.privacy.scrub_keys.tokens`), so a name is listed here without them.

Some names are left out on purpose: ``INSEE`` alone (a ``code INSEE`` is a commune's code, not a
person's number; ``numéro INSEE`` is listed), ``Nummer`` or ``numéro`` alone.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["LANGUAGE_KEYS", "LANGUAGE_TAIL_KEYS", "NUMBER_WORDS"]

#: Names matched anywhere in a key, as :data:`~jobsystem.privacy.scrub_keys.DEFAULT_KEYS` are.
LANGUAGE_KEYS: Mapping[str, str] = {
    # German
    "personalausweis": "id_number",
    "personalausweisnummer": "id_number",
    "ausweis": "id_number",
    "ausweisnummer": "id_number",
    "reisepass": "id_number",
    "reisepassnummer": "id_number",
    "steuer_id": "id_number",
    "steueridentifikationsnummer": "id_number",
    "steuernummer": "id_number",
    "sozialversicherungsnummer": "id_number",
    "geburtsdatum": "birth_date",
    "geboren_am": "birth_date",
    # French
    "securite_sociale": "id_number",
    "numero_insee": "id_number",
    "passeport": "id_number",
    "carte_d_identite": "id_number",
    "date_de_naissance": "birth_date",
    # Spanish
    "pasaporte": "id_number",
    "fecha_de_nacimiento": "birth_date",
    # Italian
    "passaporto": "id_number",
    "carta_d_identita": "id_number",
    "data_di_nascita": "birth_date",
    # Dutch
    "paspoort": "id_number",
    "paspoortnummer": "id_number",
    "burgerservicenummer": "id_number",
    "geboortedatum": "birth_date",
    # English, in words: an identity card's number is an id number, not a payment card's.
    "id_card": "id_number",
    "id_card_number": "id_number",
    "identity_card": "id_number",
    "identity_card_number": "id_number",
    "born_on": "birth_date",
}

#: Names matched as a key's last word only, as
#: :data:`~jobsystem.privacy.scrub_keys.DEFAULT_TAIL_KEYS` are (``born``: ``user_born``, not ``born_count``).
LANGUAGE_TAIL_KEYS: Mapping[str, str] = {
    "born": "birth_date",
    "geboren": "birth_date",
}

#: Words after a number's name in a key written in words, beyond English's (``Reisepass Nr``,
#: ``Ausweis Nummer``, ``pasaporte núm``).
NUMBER_WORDS = frozenset({"nummer", "numero", "num"})
