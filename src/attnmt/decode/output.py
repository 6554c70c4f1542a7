"""The output of a translation, built once for the command line and the HTTP API: the
hypothesis record (JSON) and the text, Moses n-best and JSON lines of ``attnmt translate``.

:func:`hypothesis_record` is the JSON record of one hypothesis, the same in ``attnmt translate
--format jsonl`` and in the answers of ``attnmt serve`` (``/v1/translate``, the stream's
``done`` event): ``text``, ``score`` (ranking score: log-probability over the length penalty),
``log_prob`` (natural log, EOS included), ``tokens`` (output subwords, '</s>' last) and
``token_probs`` (the probability of each), the confidence ``mean_log_prob``, ``words`` and
``word_probs`` (``attnmt.decode.confidence``), and ``alignment`` (Moses ``i-j`` word pairs,
``attnmt.decode.alignment``), each part where asked for.

:func:`format_translations` writes the lines of ``attnmt translate``: plain text (one
translation a line), Moses-style n-best lines (``ID ||| TRANSLATION ||| SCORE ||| LOG_PROB``)
and JSON lines (one record per input line). Every output line is one line for every reader
(``attnmt.oneline``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from attnmt.decode.alignment import format_alignment
from attnmt.oneline import json_line, one_line

if TYPE_CHECKING:
    from attnmt.decode.translator import ScoredHypothesis, Translation

# A hypothesis' words and the confidence of each (``Translator.confidence``).
Confidence = Callable[["ScoredHypothesis"], tuple[list[str], list[float]]]


def hypothesis_record(hypothesis: ScoredHypothesis, confidence: Confidence | None = None, tokens: bool = True,
                      alignment: bool = True) -> dict:
    """The JSON record of one hypothesis (module docstring), its keys in this order.

    Args:
        hypothesis: a translation candidate (``attnmt.decode.translator.ScoredHypothesis``).
        confidence: gives its words and their probabilities (``Translator.confidence``); None
            leaves out ``mean_log_prob``, ``words`` and ``word_probs``.
        tokens: add ``tokens`` and ``token_probs`` (probabilities, not log-probabilities).
        alignment: add ``alignment`` (a Moses ``i-j`` string) when the hypothesis has one.
    """
    record = {"text": hypothesis.text, "score": hypothesis.score, "log_prob": hypothesis.log_prob}
    if tokens:
        record["tokens"] = hypothesis.pieces
        record["token_probs"] = [math.exp(lp) for lp in hypothesis.token_log_probs]
    if confidence is not None:
        words, word_probs = confidence(hypothesis)
        record.update(mean_log_prob=hypothesis.mean_log_prob, words=words, word_probs=word_probs)
    if alignment and hypothesis.alignment is not None:
        record["alignment"] = format_alignment(hypothesis.alignment)
    return record


def jsonl_line(index: int, translation: Translation, confidence: Confidence | None = None) -> str:
    """One input line's JSON line: ``{"id": index, "hypotheses": [...]}`` (best first, each a
    :func:`hypothesis_record`), with the best hypothesis' ``alignment`` again at the top when it
    has one, and ``warnings`` when a constraint was left out."""
    hypotheses = [hypothesis_record(h, confidence) for h in translation.hypotheses]
    record = {"id": index, "hypotheses": hypotheses}
    if translation.alignment is not None:
        record["alignment"] = hypotheses[0]["alignment"]
    if translation.warnings:
        record["warnings"] = translation.warnings
    return json_line(record)


def _alignment_field(pairs: Sequence[tuple[int, int]] | None) -> str:
    """`` ||| ALIGNMENT``, the last field of a text line, where there is an alignment."""
    if pairs is None:
        return ""
    return f" ||| {format_alignment(pairs)}"


def text_line(translation: Translation) -> str:
    """One input line's best translation, with its alignment field (``--alignments``)."""
    return one_line(translation.text) + _alignment_field(translation.alignment)


def moses_line(index: int, hypothesis: ScoredHypothesis, scores: bool) -> str:
    """A Moses n-best line: ``ID ||| TRANSLATION ||| SCORE ||| LOG_PROB`` (ID the 0-based input
    line; SCORE length-penalised; LOG_PROB the sum of the token log-probabilities, six decimals),
    with ``scores`` a fifth field ``piece=prob piece=prob ...`` (each output subword, '</s>' last),
    and the alignment field."""
    line = f"{index} ||| {one_line(hypothesis.text)} ||| {hypothesis.score:.6f} ||| {hypothesis.log_prob:.6f}"
    if scores:
        pieces = zip(hypothesis.pieces, hypothesis.token_log_probs)
        line += " ||| " + " ".join(f"{one_line(p)}={math.exp(lp):.6f}" for p, lp in pieces)
    return line + _alignment_field(hypothesis.alignment)


def format_translations(results: Sequence[Translation], fmt: str, scores: bool, nbest: int,
                        confidence: Confidence | None = None) -> list[str]:
    """The output lines of ``attnmt translate``.

    ``fmt`` 'text': without ``scores`` and with ``nbest`` 1 one translation a line
    (:func:`text_line`), else one :func:`moses_line` per hypothesis. 'jsonl': one
    :func:`jsonl_line` per input line, the confidence fields from ``confidence`` (e.g.
    ``Translator.confidence``); strict JSON (a score that is not finite is null). Every input
    line gets its lines: one, or one per hypothesis (``nbest`` of them, see
    ``Translator.translate``).
    """
    if fmt == "jsonl":
        return [jsonl_line(i, r, confidence) for i, r in enumerate(results)]
    if not scores and nbest == 1:
        return [text_line(r) for r in results]
    return [moses_line(i, h, scores) for i, r in enumerate(results) for h in r.hypotheses]
