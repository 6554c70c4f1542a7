"""Corpus BLEU and chrF with sacreBLEU, on detokenized output against raw references.

BLEU (Papineni et al., 2002) with sacreBLEU's defaults: cased, 13a tokenization, exponential
smoothing; chrF (Popovic, 2015) with character 6-grams, beta 2. The signatures that make the
numbers reproducible (Post, 2018) come with the scores.

:func:`tokenized_bleu` is BLEU the way word-level tutorials compute it (e.g. torchtext's
``bleu_score``): on the model's own word tokens against references tokenized the same way,
uniform 4-gram weights, brevity penalty, no smoothing. Its numbers are not comparable with
sacreBLEU's detokenized ones (Post, 2018, section 2); it exists to compare with published
figures of such setups.

Library: sacrebleu.
"""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF

from attnmt.errors import OptionError


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
        raise OptionError(f"{len(hypotheses)} hypotheses but {len(references)} references")
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


def tokenized_bleu(hypotheses: list[list[str]], references: list[list[str]]) -> dict:
    """BLEU on token lists (already tokenized and, if so trained, lowercased), sacreBLEU with
    ``tokenize='none'`` and no smoothing: the corpus BLEU of Papineni et al. (2002) over the
    given tokens.

    Returns:
        {'bleu': float, 'bleu_signature': str, 'bleu_detail': str}
    Raises:
        ValueError: different numbers of hypotheses and references.
    """
    if len(hypotheses) != len(references):
        raise OptionError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = BLEU(tokenize="none", smooth_method="none", force=True)
    b = bleu.corpus_score([" ".join(h) for h in hypotheses], [[" ".join(r) for r in references]])
    return {"bleu": b.score, "bleu_signature": str(bleu.get_signature()), "bleu_detail": str(b)}
