"""The controls over a translation's output that ``Translator`` has from this mixin: terminology
constraints checked and tokenised (``attnmt.decode.terminology``), word alignments
(``attnmt.decode.alignment``) and word confidence (``attnmt.decode.confidence``).

They need only the translator's tokenizers, configuration and (for alignments of n-best
hypotheses) its forced decoding, ``source_attention``; ``Translator.translate`` calls them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from attnmt.decode import terminology
from attnmt.decode.alignment import align_translation, alignment_layer
from attnmt.decode.confidence import word_confidence
from attnmt.decode.results import ScoredHypothesis, Translation

if TYPE_CHECKING:
    from attnmt.config import Config
    from attnmt.data.tokenizers import Tokenizer
    from attnmt.search.options import SearchOptions

log = logging.getLogger("attnmt.decode.translator")  # the translator's: its warnings are a translation's


class OutputControls:
    """Constraints, alignments and confidence of :class:`attnmt.decode.translator.Translator`."""

    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    config: Config

    def check_constraints(self, constraints: list[list[str]], lines: list[int] | None = None) -> None:
        """Refuse a phrase the target tokenizer cannot spell (``attnmt.decode.terminology.check_constraints``):
        per sentence of ``constraints`` its phrases (raw text), ``lines`` each one's 1-based
        number (default 1, 2, ...).

        Raises:
            ConstraintError: the first such phrase, with its sentence.
        """
        terminology.check_constraints(self.tgt_tokenizer, constraints, lines)

    def encode_constraints(self, constraints: list[list[str]], src_ids: list[list[int]], options: SearchOptions,
                           lines: list[int]) -> tuple[list[list[list[int]]], dict[int, list[str]]]:
        """Phrases as target token ids, each sentence's left out, with a warning logged, where
        they cannot fit its output length limit (``attnmt.decode.terminology.encode_constraints``:
        its arguments and what it returns).
        """
        ids, warnings = terminology.encode_constraints(self.tgt_tokenizer, self.config.model.max_positions,
                                                       constraints, src_ids, options, lines)
        for messages in warnings.values():
            for message in messages:
                log.warning(message)
        return ids, warnings

    def _alignment_layer(self, layer: int | None) -> int:
        return alignment_layer(layer, self.config.model.num_decoder_layers)

    def align(self, src_ids: list[int], translation: Translation, layer: int, tagged: int = 0) -> None:
        """Fill each hypothesis' word alignment (``ScoredHypothesis.alignment``) from decoder
        layer ``layer`` (1-based): the best hypothesis' from ``translation.attention`` when the
        engine returned it, the others' from forced decoding (:meth:`source_attention`);
        ``attnmt.decode.alignment.align_translation``.

        Args:
            src_ids: the sentence's source ids, ending with EOS.
            tagged: how many ids in front are a language tag (not words of the source).
        Raises:
            UnsupportedOption: an engine without the 'attention' capability (only native has it).
        """
        align_translation(translation, src_ids, layer, tagged, self.src_tokenizer.decode, self.tgt_tokenizer.decode,
                          self.source_attention)

    def confidence(self, hypothesis: ScoredHypothesis) -> tuple[list[str], list[float]]:
        """The words of a hypothesis (from :meth:`translate` or :meth:`score`) and the
        probability of each: the product of its subwords' probabilities
        (``attnmt.decode.confidence``)."""
        return word_confidence(hypothesis.token_ids, hypothesis.token_log_probs, self.tgt_tokenizer.decode)
