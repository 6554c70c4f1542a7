"""Forced decoding: the log-probability of given translations under the model (``attnmt score``).

:func:`score_pairs` is ``Translator.score``: sources are tokenised as :meth:`Translator.translate`
tokenises them (cut to the model's positions with a warning, a multilingual model's language tag
in front); targets by the target tokenizer, EOS appended, a target longer than the model's
positions refused for every engine alike before any engine runs; then the engine's
``forced_log_probs`` (capability 'score': native and CTranslate2) in batches, in input order.
The translator's other forced pass, the attention weights of a given output, is the engine's
``attention`` (``Translator.attention``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnmt.data.tokenizers import EOS_ID
from attnmt.decode.engine import check_positions, require
from attnmt.decode.results import ScoredHypothesis, scored_hypothesis
from attnmt.search.hypothesis import Hypothesis

if TYPE_CHECKING:
    from attnmt.decode.translator import Translator


def score_pairs(translator: Translator, sources: list[str], targets: list[str], batch_size: int | None = None,
                tgt_lang: str | None = None) -> list[ScoredHypothesis]:
    """``Translator.score``: one :class:`ScoredHypothesis` per (source, target) pair, whose
    ``token_ids`` are the target ids + EOS, ``token_log_probs`` their natural-log probabilities
    and ``log_prob`` = ``score`` their sum.

    Args:
        sources, targets: raw sentences, as many of each (``Translator.score`` checks).
        batch_size: sentences per forward pass; default from the decode config.
        tgt_lang: the targets' language (a multilingual model's tag).
    Raises:
        UnsupportedOption: an engine without the 'score' capability (ONNX Runtime).
        LanguageError: ``tgt_lang`` missing for a multilingual model, or unknown.
        PositionError: a target longer than the model's max_positions - 1 subwords.
    """
    require(translator.engine, "score", "forced decoding (attnmt score)")
    engine = translator.engine
    batch_size = batch_size or translator.config.decode.batch_size
    src_ids = translator.encode_sources(sources, tgt_lang)
    tgt_ids = [t + [EOS_ID] for t in translator.tgt_tokenizer.encode_batch(targets)]
    check_positions(tgt_ids, translator.config.model.max_positions, "target")
    results: list[ScoredHypothesis] = []
    for start in range(0, len(sources), batch_size):
        idx = range(start, min(start + batch_size, len(sources)))
        lps = engine.forced_log_probs([src_ids[i] for i in idx], [tgt_ids[i] for i in idx])
        results += [scored_hypothesis(Hypothesis(tgt_ids[i], lp, sum(lp), sum(lp)), translator.tgt_tokenizer)
                    for i, lp in zip(idx, lps)]
    return results
