"""The configuration's sections about text: ``data`` (the corpora, validation sets and filters)
and ``tokenizer`` (how text becomes token ids), the keys ``attnmt prepare`` reads. Every number
key has a range on both sides (its ``Field``'s bounds, or a shared :mod:`attnmt.ranges` range);
the rules between the keys of ``data`` are :func:`attnmt.config.rules.data_section_rules`.

Library: pydantic.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from attnmt import ranges
from attnmt.config.language_codes import (LANGUAGE, LanguageCode, canonical_language, canonical_name, canonical_pair,
                                          one_spelling_each)
from attnmt.config.rules import data_section_rules
from attnmt.config.section import Section
from attnmt.ranges import C_INT_MAX


class CorpusEntry(Section):
    """One training corpus of ``data.train``: two line-aligned files, its weight and, for a
    multilingual model, its languages."""

    src: str = Field(description="source-side file (plain or gzip), line-aligned with tgt; ~ and $VARIABLES are "
                     "expanded ($ATTNMT_DATA/multi30k/train.cs.gz)")
    tgt: str = Field(description="target-side file (plain or gzip)")
    weight: float = Field(1.0, **ranges.CORPUS_WEIGHT.bounds(), description="how many times an epoch samples each pair "
                          "of this corpus: 1 once, 2 twice, 0.5 a random half drawn anew every epoch (fractions "
                          "sampled without replacement, seeded by train.seed and the epoch)")
    src_lang: LanguageCode | None = Field(None, description="language code of the source side (default "
                                          "from data.pair)")
    tgt_lang: LanguageCode | None = Field(None, description="language code of the target side (default "
                                 "from data.pair); corpora with different ones make a multilingual model, whose "
                                 "sources start with a tag of the target language (attnmt.languages)")
    max_pairs: int | None = Field(None, gt=0, le=C_INT_MAX, strict=True, description="read only the first N pairs of "
                                  "the files (None: all), e.g. to train a low-resource direction on a subset")


class ValidEntry(Section):
    """One validation set of ``data.valid``: a direction of a multilingual model."""

    src: str = Field(description="validation source file (plain or gzip), line-aligned with tgt")
    tgt: str = Field(description="validation target file")
    src_lang: LanguageCode = Field(description="language code of the source side")
    tgt_lang: LanguageCode = Field(description="language code of the target side")


class FilterConfig(Section):
    """Filters applied when a corpus is prepared (``attnmt.data.prepare``); pairs with an empty
    side and pairs longer than ``data.max_len`` subwords are always dropped. Each drop is counted
    in the prepared directory's manifest."""

    max_length_ratio: float | None = Field(
        None, gt=1.0, le=1000.0, description="drop a pair unless longer side / shorter side (subwords) is below this "
        "(opusfilter's LengthRatioFilter, counted in subwords); None: off, as in fairseq and Marian")
    dedup: bool = Field(False, description="drop a pair whose exact (source, target) text was seen before "
                        "(64-bit hash of the pair); off by default")
    copies: bool = Field(False, description="drop a pair whose source text equals its target text; off by default")


class DataConfig(Section):
    """Where the parallel corpus comes from.

    Either a registered ``dataset`` (``multi30k``) with a language ``pair`` (``de-en``), read from
    ``data_dir`` (or the ``ATTNMT_DATA`` environment variable, or downloaded), or explicit
    line-aligned files ``train_src``/``train_tgt`` (and optionally ``valid_src``/``valid_tgt``),
    or several weighted corpora ``train: [{src, tgt, weight}, ...]``, or a directory made by
    ``attnmt prepare`` (``prepared``), from which training reads no text.
    """

    dataset: str | None = Field(None, description="a registered dataset (multi30k), with data.pair or data.pairs")
    pair: str | None = Field(None, description="language pair of the dataset, e.g. de-en")
    pairs: list[str] | None = Field(
        None, description="several language pairs of the dataset in one multilingual model, e.g. [de-en, en-de, "
        "fr-en, en-fr]: one training corpus and one validation set per pair (instead of data.pair)")
    max_pairs: dict[str, Annotated[int, Field(gt=0, le=C_INT_MAX, strict=True)]] | None = Field(
        None, description="with data.dataset: read only the first N pairs of a direction's training split, by "
        "direction, e.g. {cs-en: 3000} to train a low-resource direction on a subset; the directions not named "
        "are read whole, and validation sets are not cut (data.valid_max_sentences does that)")
    data_dir: str | None = Field(None, description="local directory holding the dataset (default $ATTNMT_DATA)")
    train_split: str = Field("train", description="the dataset's training split")
    valid_split: str = Field("val", description="the dataset's validation split")
    test_split: str | None = Field("test_2016_flickr", description="the dataset's test split")
    train_src: str | None = Field(None, description="training source file (plain or gzip)")
    train_tgt: str | None = Field(None, description="training target file, line-aligned with train_src")
    train: list[CorpusEntry] | None = Field(
        None, description="several training corpora with weights, instead of train_src/train_tgt")
    prepared: str | None = Field(
        None, description="a directory written by 'attnmt prepare' (token shards, tokenizers, "
        "validation set); training then reads no text. Text keys beside it (the configuration it was prepared "
        "with) must name the files, filters and weights it was prepared from, or training stops")
    valid_src: str | None = Field(None, description="validation source file")
    valid_tgt: str | None = Field(None, description="validation target file")
    valid: list[ValidEntry] | None = Field(
        None, description="several validation sets, one per direction of a multilingual model "
        "(instead of valid_src/valid_tgt): [{src, tgt, src_lang, tgt_lang}, ...]")
    sampling_temperature: float = Field(1.0, gt=0, le=100.0, description="temperature T of the sampling of several "
                                        "corpora (Arivazhagan et al., 2019): corpus c is drawn in proportion to (its "
                                        "pairs x weight) ** (1/T); 1 keeps their sizes' proportions, larger T flattens "
                                        "them towards uniform (they used 5)")
    max_len: int = Field(100, gt=0, le=ranges.POSITIONS.high, description="drop training and validation pairs longer "
                         "than this (subword tokens)")
    valid_max_sentences: int | None = Field(None, gt=0, le=C_INT_MAX, description="use only the first N validation "
                                            "pairs")
    filter: FilterConfig = Field(default_factory=FilterConfig, description="optional corpus filters (off by "
                                 "default)")

    @field_validator("pair")
    @classmethod
    def _pair_spelling(cls, pair: str | None) -> str | None:
        return canonical_pair(pair)

    @field_validator("dataset", "train_split", "valid_split", "test_split")
    @classmethod
    def _name_spelling(cls, name: str | None) -> str | None:
        return None if name is None else canonical_name(name)

    @field_validator("pairs")
    @classmethod
    def _pairs_spelling(cls, pairs: list[str] | None) -> list[str] | None:
        if pairs is None:
            return None
        return [canonical_pair(p) for p in one_spelling_each(pairs, "", canonical_pair)]

    @field_validator("max_pairs")
    @classmethod
    def _max_pairs_spelling(cls, max_pairs: dict[str, int] | None) -> dict[str, int] | None:
        if max_pairs is None:
            return None
        one_spelling_each(max_pairs, "", canonical_pair)
        return {canonical_pair(pair): n for pair, n in max_pairs.items()}

    _rules = model_validator(mode="after")(data_section_rules)


class TokenizerConfig(Section):
    """SentencePiece subword model(s) trained on the training split (Kudo and Richardson, 2018),
    or (``kind: word``) word-level vocabularies over spaCy's rule-based tokens."""

    kind: Literal["sentencepiece", "word"] = Field(
        "sentencepiece", description="sentencepiece: subwords; word: spaCy's rule-based word tokens (spacy.blank, "
        "no model download) with a vocabulary of frequent words, the rest <unk>; output detokenized by sacremoses")
    model_type: Literal["unigram", "bpe"] = Field(
        "unigram", description="SentencePiece algorithm: unigram language model (Kudo, 2018) or BPE (Sennrich et al., "
        "2016)")
    vocab_size: int = Field(8000, gt=8, le=2**20, description="SentencePiece pieces (per model)")
    joint: bool = Field(True, description="one SentencePiece model and vocabulary for both languages (needed by "
                        "model.share_embeddings); false: one per side (kind word needs false)")
    character_coverage: float = Field(1.0, gt=0.0, le=1.0, description="share of the training characters "
                                      "SentencePiece keeps as pieces; the rarest others become <unk>")
    max_sentences: int = Field(400_000, gt=0, le=C_INT_MAX, description="SentencePiece trains on a seeded random "
                               "sample of at most this many non-empty lines (per side, then in all for a joint model; "
                               "reservoir sampling in one pass). Its memory grows with the sample's characters: about "
                               "1.6 KiB a line of 70 characters (the unigram trainer's suffix array), so the default "
                               "keeps preparation under 1 GB; a larger vocabulary may want more lines")
    sentence_splitter: Literal["learned", "rules"] = Field(
        "learned", description="how documents (attnmt translate --input-format, --split-sentences) are split into "
        "sentences: learned: sentencex's punctuation rules, and where the text has no punctuation, spaCy's "
        "sentence recognizer trained in preparation on the source sample (a few seconds; attnmt.data."
        "sentence_model; a bilingual model with spaCy installed); rules: the punctuation rules alone")
    lowercase: bool = Field(False, description="kind word: lowercase the text before tokenizing")
    min_freq: int = Field(1, gt=0, le=C_INT_MAX, description="kind word: keep words seen at least this often in "
                                                             "training")
    max_vocab: int | None = Field(None, gt=0, le=2**20, description="kind word: keep at most this many words, most "
                                                                    "frequent first")
    token_filter: Literal["none", "alpha_punct"] = Field(
        "none", description="kind word: 'alpha_punct' drops every token that is not alphabetic, '.' or ','")
    require_vectors: bool = Field(
        False, description="kind word: keep only words that have a vector in model.src_vectors / model.tgt_vectors")
    src_lang: LanguageCode | None = Field(None, description="kind word: spaCy/Moses language code of the source; "
                                          "default from data.pair")
    tgt_lang: LanguageCode | None = Field(None, description="kind word: language code of the target; default from "
                                          "data.pair")
    target_languages: list[Annotated[str, Field(pattern=LANGUAGE)]] = Field(
        default_factory=list, description="a multilingual model's target languages, each asked for by a tag token "
        "at the start of the source (Johnson et al., 2017; attnmt.languages); filled in from the training data "
        "when it reaches several target languages; empty: a bilingual model, no tag")
    language_tag: str = Field(
        "<2{}>", pattern=r"^[^{}\s]*\{\}[^{}\s]*$", description="how a target language's tag is written, {} "
        "standing for its code: attnmt's <2fr>; an imported OPUS-MT model's >>fra<<")

    @field_validator("target_languages")
    @classmethod
    def _one_spelling_each(cls, codes: list[str], info: ValidationInfo) -> list[str]:
        if info.context and info.context.get("saved"):  # a model's own list, as it was trained
            return codes
        return one_spelling_each(codes, "", canonical_language)
