"""How far a person's name runs after its key in free text (``name=José Pérez status=ok``).

A quoted value ends at its quote; an unquoted one was taken up to the first space, so
``name=José Pérez`` lost ``José`` and logged ``Pérez``. A name whose first word is capitalised (a
person's) runs on over the words that follow it while they are capitalised, up to eight in all
(``Ana Lucia Lopez``, ``João Pedro Gonçalves Pereira Santos``), with the particles between them
in any case, which do not count (``María de la Cruz``, ``Maria De La Cruz Lopez``); a word in
lower case (``status``), a word that is a key (``Status=ok``), a separator (``,`` ``;`` ``.``
after a word) or the line's end stops it. A first word in lower case is a thing's name
(``name=default Processing``, ``name=report OK``): the value is that word alone.
"""

from __future__ import annotations

import re

__all__ = ["NAME_LABELS", "name_end"]

#: Labels of the keys whose values are people's names.
NAME_LABELS = frozenset({"name", "recipient", "contact"})
#: The next word of a name (``-`` and ``'`` inside, an initial's ``.``), unless it is a key
#: (``status=``). A word before ``:`` is taken: ``Pérez:`` and ``Failed:`` look alike, and a
#: heading lost is better than a surname kept.
_NAME_WORD = re.compile(r"[ \t]+([^\W\d_][\w'\u2019\-]*(?:(?<=\s\w)\.)?)(?![\w'\u2019\-]|\s*=)")
#: Small words between the parts of a name (``María de la Cruz``, ``Ludwig van Beethoven``).
_PARTICLES = frozenset(
    {"al", "bin", "da", "das", "de", "del", "della", "der", "di", "do", "dos", "du", "ibn", "la", "le"}
    | {"van", "von", "y"}
)
#: Words a name has at most, the first included, particles not counted: four (two given names
#: and two surnames) is common, five or six in Portuguese and Spanish names.
_MAX_WORDS = 8
#: Words looked at, at most, particles included (a line of ``de de de...`` costs no more).
_MAX_LOOKED = 16


def name_end(text: str, begin: int, end: int) -> int:
    """Where an unquoted name whose first word is ``text[begin:end]`` ends (see the module)."""
    if not text[begin].isupper():
        return end
    words, looked, pos = 1, 1, end
    while words < _MAX_WORDS and looked < _MAX_LOOKED and (match := _NAME_WORD.match(text, pos)):
        word, pos, looked = match[1], match.end(), looked + 1
        particle = word.lower() in _PARTICLES
        if word[0].isupper():
            words, end = words + (not particle), pos
        elif not particle:
            break
    return end
