"""What the document layer needs from a translator, and the error it raises.

The document layer knows nothing of ``attnmt.decode.translator.Translator``: it takes a
:class:`Backend`, plain values that ``Translator.translate_document`` fills from itself (its
``translate`` with word alignments, its source tokenizer's length, its model's
``max_positions``, its learned sentence splitter if it has one). So any translator of
sentences, a test's fake one included, can translate documents, and the layer sits below
``attnmt.decode`` in the import layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnmt.errors import AttnmtError

# One translated sentence: its text and its word alignment, (source word, target word) pairs of
# 0-based indices of whitespace-separated words (``attnmt.decode.alignment``), or None where the
# engine gives none (then inline markup is placed by position: ``attnmt.documents.placement``).
Aligned = tuple[str, "list[tuple[int, int]] | None"]


class DocumentError(AttnmtError, ValueError):
    """A document that is not of its format: the message names the place (line, cue, element)
    and the problem, e.g. "line 7: broken subtitle timing '00:00:01,000 -> 00:00:02,000'"."""


@dataclass(frozen=True)
class Backend:
    """A translator of sentences as the document layer uses it.

    translate: (sentences, alignments) -> one :data:`Aligned` per sentence, in order; called
        once per document with all its sentences (raw text, none empty), which it batches by
        length itself; ``alignments`` False when the document has no inline markup to place
        (the alignment may then be None: no attention is computed).
    length: a sentence's number of source subwords (without EOS or a language tag).
    max_subwords: the most subwords a sentence may have (the model's ``max_positions`` less EOS
        and any language tag); longer sentences are cut (``attnmt.documents.sentences``).
    sentence_starts: the model's learned sentence splitter: texts -> per text, its sentence
        starts as character offsets (``attnmt.data.sentence_model.starts_of``); called once per
        document with the text of all its segments. None: split by rules alone.
    """

    translate: Callable[[list[str], bool], list[Aligned]]
    length: Callable[[str], int]
    max_subwords: int
    sentence_starts: Callable[[list[str]], list[list[int]]] | None = None
