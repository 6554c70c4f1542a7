"""Codes and names as attnmt compares them: the pattern of a language code, and the one spelling
of each code and name, written once for every layer (the configuration, the data registry, the
engines, the server).

A code is letters, digits and '_' (``en``, ``fra``, ``pt_BR``); a '-' separates the two sides of
a pair (``de-en``); :func:`canonical_language` and :func:`canonical_pair` give their spelling. The
names of datasets, their splits (test sets), engines, precisions, compute types and export formats
are compared lowercase (:func:`canonical_name`), so that ``--engine CTranslate2``, ``--precision
BF16``, ``MULTI30K`` and ``--pairs DE-EN`` name what their lowercase spellings name. A value is
put in its canonical form where it enters (an option's ``type``, a key's validator, a request's
field, a library function's first line), and looked up among the known ones by :func:`known_as`
(a model's own codes, which keep the model's spelling, by ``attnmt.languages.spelling``); one
thing given twice in two spellings (``[en, EN]``) is refused by :func:`one_spelling_each` rather
than collapsed into one.

Written here rather than taken from a library: BCP-47 libraries (langcodes) normalise more than
attnmt's codes need (``pt_br`` -> ``pt-BR``, with a '-' that attnmt uses between a pair's sides).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from attnmt.errors import OptionError

# a language code: 'en', 'fra', 'pt_BR' (no '-', which separates the two sides of a pair)
LANGUAGE = r"^[A-Za-z][A-Za-z0-9_]{0,15}$"


def canonical_language(code: str) -> str:
    """The one spelling of a language code that attnmt writes: BCP-47's letter cases with '_'
    between the parts (a '-' separates the two sides of a pair): the language lowercase, a
    four-letter script in title case, a two-letter region uppercase, other parts as given.
    'EN' -> 'en', 'pt_br' -> 'pt_BR', 'ZH_hant_tw' -> 'zh_Hant_TW', 'es_419' -> 'es_419'.

    Codes are compared ignoring case everywhere they are read (``attnmt.languages.spelling``);
    a model's recorded codes (``tokenizer.target_languages``, e.g. an imported OPUS-MT model's
    ``pt_br``) keep the model's spelling, which its tags are written with.
    """
    first, *rest = code.split("_")
    parts = [first.lower()]
    for part in rest:
        if len(part) == 4 and part.isalpha():
            parts.append(part.title())
        elif len(part) == 2 and part.isalpha():
            parts.append(part.upper())
        else:
            parts.append(part)
    return "_".join(parts)


def canonical_pair(pair: str | None) -> str | None:
    """A pair 'DE-en' as 'de-en' (:func:`canonical_language` of each side); anything that is not
    two codes unchanged, for the pair's own check to refuse."""
    if pair is None:
        return None
    langs = pair.split("-")
    if len(langs) != 2 or not all(re.fullmatch(LANGUAGE, lang) for lang in langs):
        return pair
    return "-".join(canonical_language(lang) for lang in langs)


def canonical_name(name: str) -> str:
    """The one spelling of a name: a dataset ('multi30k'), a split or test set
    ('test_2016_flickr'), an engine ('ctranslate2'), a precision or compute type ('bf16',
    'int8_float32'), an export format: lowercase. 'CTranslate2' -> 'ctranslate2'."""
    return name.lower()


def known_as(value: str, known: Iterable[str], canonical: Callable[[str], str | None] = canonical_name) -> str | None:
    """The entry of ``known`` that ``value`` names, both compared in ``canonical`` form
    (:func:`canonical_name`, :func:`canonical_language`, :func:`canonical_pair`); None where none does."""
    wanted = canonical(value)
    return next((k for k in known if canonical(k) == wanted), None)


def one_spelling_each(values: Iterable[str], what: str,
                      canonical: Callable[[str], str | None] = canonical_name) -> list[str]:
    """``values`` unchanged when no two of them are one thing in two spellings.

    Raises:
        OptionError: '{what} names 'de-en' and 'DE-EN', one in two spellings: give it once'.
    """
    seen: dict[str | None, str] = {}
    values = list(values)
    for value in values:
        first = seen.setdefault(canonical(value), value)
        if first != value:
            raise OptionError(f"{what + ' ' if what else ''}names {first!r} and {value!r}, one in two spellings: "
                              "give it once")
    return values
