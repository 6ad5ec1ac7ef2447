"""How far a person's name runs after its key in free text (``name=José Pérez status=ok``).

A quoted value ends at its quote; an unquoted one was taken up to the first space, so
``name=José Pérez`` lost ``José`` and logged ``Pérez``. A name whose first word is capitalised (a
person's) runs on over the words that follow it while they are capitalised, up to eight in all
(``Ana Lucia Lopez``, ``João Pedro Gonçalves Pereira Santos``), with the particles between them
in any case, which do not count (``María de la Cruz``, ``Maria De La Cruz Lopez``); a word in
lower case (``status``), a word that is a key (``Status=ok``), a separator (``,`` ``;`` ``.``
after a word) or the line's end stops it. A first word in lower case is a thing's name
(``name=default Processing``, ``name=report OK``): the value is that word alone. A name in a
script without case (``name=محمد علي``, ``name=राहुल शर्मा``, ``name=山田 太郎``) runs on over the
words of its script that follow its first word, up to eight in all. The words of a name are apart
by spaces of any kind (:mod:`scrub_spaces`): ``name=José\\u00a0Pérez`` kept ``Pérez``.
"""

from __future__ import annotations

import re
import unicodedata

from jobsystem.privacy.scrub_spaces import SPACE

__all__ = ["NAME_LABELS", "name_end"]

#: Labels of the keys whose values are people's names.
NAME_LABELS = frozenset({"name", "recipient", "contact"})
#: The next word of a name (``-`` and ``'`` inside, an initial's ``.``), unless it is a key
#: (``status=``). A word before ``:`` is taken: ``Pérez:`` and ``Failed:`` look alike, and a
#: heading lost is better than a surname kept.
_NAME_WORD = re.compile(rf"{SPACE}+([^\W\d_][\w'\u2019\-]*(?:(?<=\s\w)\.)?)(?![\w'\u2019\-]|\s*=)")
#: Small words between the parts of a name (``María de los Ángeles``, ``Jan van den Berg``,
#: ``Mohamed el Amrani``, ``Silva e Santos``, ``Miró i Ferrà``).
_PARTICLES = frozenset(
    {"af", "al", "av", "ben", "bin", "bint", "da", "das", "de", "dei", "del", "della", "den", "der"}
    | {"des", "di", "do", "dos", "du", "e", "el", "i", "ibn", "la", "las", "le", "lo", "los", "op"}
    | {"te", "ten", "ter", "van", "von", "y", "zu", "zum", "zur"}
)
#: What separates the words of a name in a script without case, and a key after a word.
_NEXT_WORD = re.compile(rf"{SPACE}+")
_KEY_AFTER = re.compile(r"\s*=")
#: Words a name has at most, the first included, particles not counted: four (two given names
#: and two surnames) is common, five or six in Portuguese and Spanish names.
_MAX_WORDS = 8
#: Words looked at, at most, particles included (a line of ``de de de...`` costs no more).
_MAX_LOOKED = 16


def name_end(text: str, begin: int, end: int) -> int:
    """Where an unquoted name whose first word is ``text[begin:end]`` ends (see the module)."""
    first = text[begin]
    if first.isalpha() and not (first.isupper() or first.islower() or first.istitle()):
        return _caseless_end(text, _script(first), end)
    if not first.isupper():
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


def _caseless_end(text: str, script: str, end: int) -> int:
    """Where a name in a ``script`` without case ends: over the words of that script that follow
    its first word, up to eight in all, unless a word is a key (``حالة=``)."""
    words = 1
    while words < _MAX_WORDS and (match := _NEXT_WORD.match(text, end)):
        stop = match.end()
        while stop < len(text) and _in_word(text[stop], script):
            stop += 1
        if stop == match.end() or (stop < len(text) and text[stop].isalnum()) or _KEY_AFTER.match(text, stop):
            break
        words, end = words + 1, stop
    return end


def _in_word(char: str, script: str) -> bool:
    """Whether ``char`` is a letter or mark of ``script`` (a joiner too: Persian names hold them)."""
    if char in "\u200c\u200d":
        return True
    return (char.isalpha() or unicodedata.category(char).startswith("M")) and _script(char) == script


def _script(char: str) -> str:
    """The script of ``char`` as its Unicode name begins (``ARABIC``, ``DEVANAGARI``, ``CJK``);
    Japanese kana count as CJK."""
    script = unicodedata.name(char, "").partition(" ")[0]
    return "CJK" if script in ("HIRAGANA", "KATAKANA") else script
