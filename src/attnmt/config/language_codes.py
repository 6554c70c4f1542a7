"""Codes and names as a configuration reads them: a language code's field type, checked against
:data:`attnmt.names.LANGUAGE` and written as :func:`attnmt.names.canonical_language` spells it,
and a name key's validator (:data:`NAME_SPELLING`). The spellings themselves are
:mod:`attnmt.names`', re-exported here for the configuration's users.

Library: pydantic (the ``LanguageCode`` field type).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from attnmt.names import (LANGUAGE, canonical_language, canonical_name, canonical_pair, known_as,  # noqa: F401
                          one_spelling_each)

# a language code as read from a configuration: checked against LANGUAGE, written canonically
LanguageCode = Annotated[str, Field(pattern=LANGUAGE), AfterValidator(canonical_language)]


# a configuration key holding a name (a precision): given in any case, read as canonical_name spells it
NAME_SPELLING = BeforeValidator(lambda value: canonical_name(value) if isinstance(value, str) else value)
