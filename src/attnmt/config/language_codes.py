"""Language codes as a configuration reads them: the pattern a code matches and its one spelling.

A code is letters, digits and '_' (``en``, ``fra``, ``pt_BR``); a '-' separates the two sides of
a pair (``de-en``). The configuration keeps each code as :func:`canonical_language` spells it.

Library: pydantic (the ``LanguageCode`` field type).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

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


# a language code as read from a configuration: checked against LANGUAGE, written canonically
LanguageCode = Annotated[str, Field(pattern=LANGUAGE), AfterValidator(canonical_language)]
