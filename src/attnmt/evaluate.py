"""Corpus BLEU and chrF with sacreBLEU, on detokenized output against raw references.

BLEU (Papineni et al., 2002) with sacreBLEU's defaults: cased, 13a tokenization, exponential
smoothing; chrF (Popovic, 2015) with character 6-grams, beta 2. The signatures that make the
numbers reproducible (Post, 2018) come with the scores.

Library: sacrebleu.
"""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
    """BLEU and chrF of detokenized hypotheses against one reference each.

    Returns:
        {'bleu': float, 'chrf': float, 'bleu_signature': str, 'chrf_signature': str,
         'bleu_detail': str (sacreBLEU's full line: n-gram precisions, BP, lengths),
         'sentences': int}
    Raises:
        ValueError: different numbers of hypotheses and references.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": b.score,
        "chrf": c.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_detail": str(b),
        "sentences": len(hypotheses),
    }
