"""The JSON bodies of ``/v1/translate`` and ``/v1/translate/stream``: what a request may ask
for and what the answer holds (pydantic models; FastAPI validates requests against them and
publishes them as the OpenAPI schema at ``/docs``).

A request's unknown fields and wrong types are a 422 (``extra="forbid"``, strict types); the
limits a request is checked against are the server's (``attnmt.serve.settings``). A hypothesis'
fields are those of ``attnmt.decode.output.hypothesis_record``.

With ``input_format`` or ``split_sentences`` each text is a document (``attnmt.documents``):
cut into sentences, translated, and answered whole as the translation's ``text`` (a docx file
travels as base64 both ways), without hypotheses.

Library: pydantic.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from attnmt import ranges
from attnmt.documents import INPUT_FORMATS
from attnmt.names import canonical_name


class TranslateRequest(BaseModel):
    """The body of ``POST /v1/translate``."""

    # strict: a boolean is no number (and no string); allow_inf_nan: JSON's NaN and Infinity are refused
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    text: str | list[str] = Field(description="one sentence, or a list of sentences translated independently")
    tgt_lang: str | None = Field(None, description="the language to translate into: required by a multilingual model "
                                 "(one of /v1/models' target_languages); a bilingual model's own target or none")
    beam_size: int | None = Field(None, **ranges.BEAM_SIZE.bounds(), description="beam size K (1 = greedy, at most "
                                  "the server's max_beam_size); default from the model")
    nbest: int = Field(1, **ranges.BEAM_SIZE.bounds(), description="hypotheses per sentence, best first (<= beam size)")
    early_stopping: bool | None = Field(
        None, description="beam search's stopping rule: true stops a sentence once beam_size x patience hypotheses "
        "have finished (CTranslate2's rule), false once no open hypothesis can win (exact); default from the server")
    patience: float | None = Field(None, **ranges.PATIENCE.bounds(), description="with early_stopping: wait for "
                                   "round(beam_size x patience) finished hypotheses; default from the server (1 "
                                   "without early stopping)")
    return_scores: bool = Field(False, description="add each hypothesis' subword tokens and their probabilities")
    return_attention: bool = Field(False, description="add the best hypothesis' source attention")
    constraints: list[str] | list[list[str]] | None = Field(
        None, description="terms the translation must contain (lexically constrained beam search): a list of "
        "phrases for a single text, or one list of phrases per text")
    alignments: bool = Field(False, description="add the best hypothesis' word alignment (Moses 'i-j' pairs)")
    input_format: Literal[INPUT_FORMATS] | None = Field(  # type: ignore[valid-type]  (the tuple's names)
        None, description="translate each text as a document of this format, its markup and whitespace kept: "
        "'text' (paragraphs cut into sentences), 'lines' (one sentence per line; with split_sentences, each line "
        "cut into sentences), 'html', 'markdown', 'srt', 'vtt', or 'docx' (the file in base64, answered in "
        "base64); default: each text is one sentence (no document)")
    split_sentences: bool | None = Field(None, description="cut each line of a 'lines' document into sentences "
                                         "(the other formats always are); given without input_format, the texts "
                                         "are 'lines' documents")

    @field_validator("input_format", mode="before")
    @classmethod
    def _format_in_one_spelling(cls, value: Any) -> Any:
        """'HTML' names what 'html' names (``attnmt.names.canonical_name``)."""
        return canonical_name(value) if isinstance(value, str) else value


class TranslateStreamRequest(TranslateRequest):
    """The body of ``POST /v1/translate/stream``: one sentence."""

    text: str = Field(description="one sentence")


class HypothesisOut(BaseModel):
    text: str
    score: float = Field(description="log-probability / GNMT length penalty (beam search), or log-probability")
    log_prob: float = Field(description="natural-log probability of the output, EOS included")
    tokens: list[str] | None = Field(None, description="output subwords, '</s>' last (with return_scores)")
    token_probs: list[float] | None = Field(None, description="probability of each token (with return_scores)")
    mean_log_prob: float = Field(description="confidence: the mean natural-log probability per token, EOS included")
    words: list[str] = Field(description="the words of text (split at whitespace)")
    word_probs: list[float] = Field(description="confidence of each word: the product of its subwords' probabilities")


class AttentionOut(BaseModel):
    layer: int = Field(description="the decoder layer (1-based); weights are the average of its heads")
    src_tokens: list[str] = Field(description="source subwords, '</s>' last (S of them)")
    tgt_tokens: list[str] = Field(description="output subwords of the best hypothesis (T of them)")
    weights: list[list[float]] = Field(description="T rows of S weights; row t sums to 1")


class TranslationOut(BaseModel):
    text: str = Field(description="the best translation; a translated document (base64 for docx)")
    hypotheses: list[HypothesisOut] = Field(default_factory=list, description="nbest hypotheses, best first "
                                            "(none for a document: input_format)")
    attention: AttentionOut | None = None
    alignment: str | None = Field(None, description="with alignments: source-target word pairs of the best "
                                  "hypothesis, 0-based, e.g. '0-0 1-2 2-1'")
    warnings: list[str] | None = Field(None, description="e.g. constraints left out because they cannot fit")


class TranslateResponse(BaseModel):
    translations: list[TranslationOut] = Field(description="one per input sentence, in input order")
