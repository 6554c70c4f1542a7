"""Codes and names as a configuration reads them: a language code's field type, checked against
:data:`attnmt.names.LANGUAGE` and written as :func:`attnmt.names.canonical_language` spells it;
the spellings themselves are :mod:`attnmt.names`', re-exported here for the configuration's users
(a key taking one of several names is spelled by ``attnmt.config.section.Section``).

Library: pydantic (the ``LanguageCode`` field type).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from attnmt.names import (LANGUAGE, canonical_language, canonical_name, canonical_pair, known_as,  # noqa: F401
                          one_spelling_each)

# a language code as read from a configuration: checked against LANGUAGE, written canonically
LanguageCode = Annotated[str, Field(pattern=LANGUAGE), AfterValidator(canonical_language)]

