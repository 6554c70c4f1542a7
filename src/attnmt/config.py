"""Typed configuration: pydantic models loaded from YAML, validated once, with dotted overrides.

A configuration file has five sections, each a model below: ``data``, ``tokenizer``, ``model``,
``train`` and ``decode``. Every section forbids unknown keys and checks types, so a typo such as
``modle.d_model`` or ``d_model: big`` is an error naming the key, never silently ignored. Every
number key has a range on both sides (its ``Field``'s bounds; those the command line and the
server share, such as ``decode.length_penalty``, from :mod:`attnmt.ranges`), no float may be
nan or inf, and a boolean is never a number (YAML's ``on`` for ``train.dropout_curriculum``).
Rules between keys are checked once the whole configuration is read (``Config._consistent``),
and a key that only matters to another key's value not in use (``train.t_mul`` under
``train.schedule: noam``: :data:`APPLIES_ONLY_TO`) is refused, naming that option. Every error
is one line naming the key and, for a file, its line (:func:`key_lines`).
Command-line overrides use dotted keys (``--set model.num_encoder_layers=4``); the value is parsed as
YAML, so ``4`` is an int, ``0.1`` a float, ``true`` a bool and ``null`` None.

Library: pydantic (validation) and PyYAML (parsing).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from attnmt import ranges
from attnmt.errors import ConfigError
from attnmt.ranges import C_INT_MAX, NoBooleanNumbers

# yaml.safe_load's loader, in C (libyaml) where PyYAML was built with it: the same documents, a
# faster start of every command that reads a configuration.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# the device names a configuration or --device may give (attnmt.device resolves them); defined
# here so that reading a configuration, and so ``attnmt prepare``, does not import PyTorch
DEVICE_NAME = r"^(auto|cpu|mps|cuda(:\d+)?)$"


class KeyRuleError(ValueError):
    """A cross-field rule broken by the configuration key ``key`` ('section.name'): the error
    message names the key (and the line that sets it, where a file does)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


class _Section(NoBooleanNumbers):
    # allow_inf_nan=False: every float must be finite (an 'lr_factor: .inf' is an error, not a NaN model).
    # Every number key has a range on both sides (Field's ge/gt and le, or a shared attnmt.ranges.Range),
    # and a boolean is never a number (NoBooleanNumbers).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# a language code: 'en', 'fra', 'pt_BR' (no '-', which separates the two sides of a pair)
LANGUAGE = r"^[A-Za-z][A-Za-z0-9_]{0,15}$"


def canonical_language(code: str) -> str:
    """The one spelling of a language code that attnmt writes: BCP-47's letter cases with '_'
    between the parts (a '-' separates the two sides of a pair): the language lowercase, a
    four-letter script in title case, a two-letter region uppercase, other parts as given.
    'EN' -> 'en', 'pt_br' -> 'pt_BR', 'ZH_hant_tw' -> 'zh_Hant_TW', 'es_419' -> 'es_419'.

    Codes are compared ignoring case everywhere they are read (``attnmt.languages.spelling``);
    a model's recorded codes (``tokenizer.target_languages``, e.g. an imported OPUS-MT model's
    ``pt_br``) keep the model's spelling, which its tags are written with.
    """
    first, *rest = code.split("_")
    parts = [first.lower()]
    for part in rest:
        if len(part) == 4 and part.isalpha():
            parts.append(part.title())
        elif len(part) == 2 and part.isalpha():
            parts.append(part.upper())
        else:
            parts.append(part)
    return "_".join(parts)


def _canonical_pair(pair: str | None) -> str | None:
    """A pair 'DE-en' as 'de-en' (:func:`canonical_language` of each side); anything that is not
    two codes unchanged, for the pair's own check to refuse."""
    if pair is None:
        return None
    langs = pair.split("-")
    if len(langs) != 2 or not all(re.fullmatch(LANGUAGE, lang) for lang in langs):
        return pair
    return "-".join(canonical_language(lang) for lang in langs)


# a language code as read from a configuration: checked against LANGUAGE, written canonically
LanguageCode = Annotated[str, Field(pattern=LANGUAGE), AfterValidator(canonical_language)]


class CorpusEntry(_Section):
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


class ValidEntry(_Section):
    """One validation set of ``data.valid``: a direction of a multilingual model."""

    src: str = Field(description="validation source file (plain or gzip), line-aligned with tgt")
    tgt: str = Field(description="validation target file")
    src_lang: LanguageCode = Field(description="language code of the source side")
    tgt_lang: LanguageCode = Field(description="language code of the target side")


class FilterConfig(_Section):
    """Filters applied when a corpus is prepared (``attnmt.data.prepare``); pairs with an empty
    side and pairs longer than ``data.max_len`` subwords are always dropped. Each drop is counted
    in the prepared directory's manifest."""

    max_length_ratio: float | None = Field(
        None, gt=1.0, le=1000.0, description="drop a pair unless longer side / shorter side (subwords) is below this "
        "(opusfilter's LengthRatioFilter, counted in subwords); None: off, as in fairseq and Marian")
    dedup: bool = Field(False, description="drop a pair whose exact (source, target) text was seen before "
                        "(64-bit hash of the pair); off by default")
    copies: bool = Field(False, description="drop a pair whose source text equals its target text; off by default")


class DataConfig(_Section):
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
        return _canonical_pair(pair)

    @field_validator("pairs")
    @classmethod
    def _pairs_spelling(cls, pairs: list[str] | None) -> list[str] | None:
        return None if pairs is None else [_canonical_pair(p) for p in pairs]

    @field_validator("max_pairs")
    @classmethod
    def _max_pairs_spelling(cls, max_pairs: dict[str, int] | None) -> dict[str, int] | None:
        return None if max_pairs is None else {_canonical_pair(pair): n for pair, n in max_pairs.items()}

    @model_validator(mode="after")
    def _one_source(self) -> "DataConfig":
        text = [self.dataset is not None, self.train_src is not None or self.train_tgt is not None,
                self.train is not None]  # beside data.prepared: the text it was prepared from (checked then)
        if sum(text) > 1 or sum(text) + (self.prepared is not None) == 0 or (
                text[1] and (self.train_src is None or self.train_tgt is None)):
            raise ValueError("give one of data.dataset (with data.pair), data.train_src and data.train_tgt, "
                             "data.train (a list of {src, tgt, weight}) or data.prepared")
        if self.train is not None and not self.train:
            raise ValueError("data.train lists no corpus")
        if self.train is not None and self.pair is None and any(e.src_lang or e.tgt_lang for e in self.train):
            for i, entry in enumerate(self.train):  # languages given per entry: every entry gives both
                for side in ("src_lang", "tgt_lang"):
                    if getattr(entry, side) is None:
                        raise KeyRuleError("data.train", f"data.train[{i}].{side} is missing: where data.train "
                                           f"entries name their languages, each needs src_lang and tgt_lang "
                                           f"(or give data.pair for the default)")
        if self.dataset is not None and (self.pair is None) == (self.pairs is None):
            raise ValueError("data.dataset needs data.pair, e.g. 'de-en', or data.pairs (a list), not both")
        if self.pairs is not None and self.dataset is None:
            raise ValueError("data.pairs names pairs of a data.dataset; give data.dataset too")
        for pair in [self.pair] * (self.pair is not None) + list(self.pairs or []):
            langs = pair.split("-")
            if len(langs) != 2 or not all(re.fullmatch(LANGUAGE, lang) for lang in langs) or langs[0] == langs[1]:
                raise ValueError(f"data.pair {pair!r}: expected two different language codes, e.g. 'de-en'")
        if self.pairs is not None and len(set(self.pairs)) != len(self.pairs):
            raise ValueError("data.pairs names a pair twice")
        if self.max_pairs is not None:
            directions = self.pairs or [self.pair] * (self.pair is not None)
            for pair in self.max_pairs:
                if pair not in directions:
                    raise KeyRuleError("data.max_pairs", f"data.max_pairs names {pair!r}, not a pair of data.pair "
                                       f"or data.pairs ({', '.join(directions) or 'none: give data.dataset'})")
        if (self.valid_src is None) != (self.valid_tgt is None):
            raise ValueError("give both data.valid_src and data.valid_tgt, or neither")
        if self.valid is not None and self.valid_src is not None:
            raise ValueError("give data.valid (a list) or data.valid_src and data.valid_tgt, not both")
        if self.valid is not None and not self.valid:
            raise ValueError("data.valid lists no validation set")
        return self


class TokenizerConfig(_Section):
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


class ModelConfig(_Section):
    """The Transformer's hyper-parameters (Vaswani et al., 2017, Table 3; base: 512/8/2048/6)."""

    d_model: int = Field(512, **ranges.WIDTH.bounds(), description="width of embeddings and of every sub-layer's "
                                                                   "output (paper: 512)")
    num_heads: int = Field(8, gt=0, le=1024, description="attention heads per multi-head attention (paper: 8)")
    d_ff: int = Field(2048, **ranges.WIDTH.bounds(), description="inner width of the position-wise feed-forward "
                                                                 "network (paper: 2048)")
    num_encoder_layers: int = Field(6, gt=0, le=1024, description="encoder layers N (paper: 6)")
    num_decoder_layers: int = Field(6, gt=0, le=1024, description="decoder layers N (paper: 6)")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="P_drop on sub-layer outputs and embeddings")
    attention_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on attention weights")
    activation_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout inside the feed-forward")
    norm_first: bool = Field(False, description="pre-norm; the paper is post-norm (False)")
    positional: Literal["sinusoidal", "learned"] = Field(
        "sinusoidal", description="positional encodings: the fixed sinusoids of section 3.5, or a learned table "
        "(one trained vector per position)")
    max_positions: int = Field(1024, **ranges.POSITIONS.bounds(), description="longest sequence the positional "
                               "encodings cover (tokens, EOS included)")
    share_embeddings: bool = Field(False, description="one embedding for source and target (joint vocab)")
    tie_output: bool = Field(True, description="output projection shares the target embedding (sec. 3.4)")
    output_bias: bool = Field(False, description="a learned bias on the logits; the paper has none")
    activation: Literal["relu", "swish", "gelu"] = Field(
        "relu", description="feed-forward activation; the paper's is relu (equation 2)")
    layer_norm_eps: float = Field(1e-5, gt=0.0, le=1.0, description="epsilon of every LayerNorm (PyTorch's default "
                                                                    "1e-5)")
    pre_post_norm: bool = Field(
        False, description="LayerNorm before each sub-layer and again after the residual, "
        "LN(x + Dropout(Sublayer(LN(x)))); excludes norm_first; the paper is post-norm")
    layer_norm_scale: bool = Field(
        True, description="a learned scale (gain) in every LayerNorm; False: shift (bias) only")
    scale_embeddings: bool = Field(True, description="multiply embeddings by sqrt(d_model) (the paper, section 3.4)")
    positional_scale: bool = Field(
        False, description="a trainable scalar per side (initialised to 1) multiplying the positional encodings")
    head_dim: int | None = Field(None, **ranges.WIDTH.bounds(), description="size of each head's projections "
                                 "(num_heads * head_dim wide); None: d_model / num_heads as in the paper")
    attention_bias: bool = Field(True, description="biases in the attention projections (False: bias-free)")
    ffn_output_activation: bool = Field(
        False, description="apply the activation after the feed-forward's second layer too; the paper does not")
    time_shared_dropout: bool = Field(
        False, description="dropout on embeddings and sub-layer outputs draws one mask per sentence and feature, "
        "shared across time steps (noise shape [B, 1, D]); the paper draws per element")
    src_vectors: str | None = Field(
        None, description="fastText .vec text file whose vectors initialise the source embeddings (dimension must "
        "equal d_model); read at training start only")
    tgt_vectors: str | None = Field(None, description="the same for the target embeddings")
    freeze_embeddings: bool = Field(
        False, description="keep the token embeddings fixed in training (with src_vectors/tgt_vectors)")
    init: Literal["default", "xavier_uniform"] = Field(
        "default", description="default: Xavier-uniform matrices, embeddings N(0, 1/d_model); xavier_uniform: "
        "Xavier-uniform for every matrix, embeddings and output layer included (the PyTorch tutorial)")
    positional_layout: Literal["interleaved", "halves"] = Field(
        "interleaved", description="sinusoid layout: sin and cos interleaved on even and odd dimensions "
        "(the paper, section 3.5), or all sines in the first half and all cosines in the second (tensor2tensor, "
        "MarianMT, CTranslate2)")
    decoder_start_id: int = Field(2, ge=0, le=C_INT_MAX, description="the id fed to the decoder first: BOS (2) in "
                                                                     "attnmt's vocabularies; an imported MarianMT "
                                                                     "model starts from its pad token (0)")
    forbidden_ids: list[Annotated[int, Field(ge=0, le=C_INT_MAX)]] = Field(
        default_factory=list, description="ids search never outputs: their log-probability is set to -inf after "
        "the log-softmax (the others are not renormalised); none in the paper, MarianMT forbids its pad token")

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.head_dim is None and self.d_model % self.num_heads:
            raise KeyRuleError("model.num_heads", f"model.d_model ({self.d_model}) must be divisible by "
                               f"model.num_heads ({self.num_heads})")
        if self.pre_post_norm and self.norm_first:
            raise KeyRuleError("model.pre_post_norm", "model.pre_post_norm and model.norm_first exclude each other")
        if self.freeze_embeddings and self.tie_output:
            raise KeyRuleError("model.freeze_embeddings", "model.freeze_embeddings would freeze the tied output "
                               "layer too; set model.tie_output false")
        return self


class TrainConfig(_Section):
    """Optimisation (paper section 5): Adam, the warmup schedule, label smoothing, batching."""

    seed: int = Field(1, ge=0, le=2**32 - 1, description="seed of initialisation, batch order and dropout; the same "
                                                         "seed and data give the same run")
    batch_tokens: int = Field(4096, gt=0, le=C_INT_MAX, description="padded tokens per batch (sentences x longest "
                                                                    "side)")
    accum_steps: int = Field(1, gt=0, le=C_INT_MAX, description="batches per process accumulated into one update; an "
                                                                "update takes accum_steps x processes batches")
    ddp_overlap: bool | None = Field(None, description="under torchrun: average the gradients during the backward "
                                     "pass with DistributedDataParallel (faster; each process holds a second, "
                                     "gradient-sized buffer) instead of all-reducing them after it; None: on CUDA "
                                     "only")
    max_steps: int | None = Field(None, gt=0, le=C_INT_MAX, description="stop after this many updates (None: no limit)")
    max_epochs: int | None = Field(None, gt=0, le=C_INT_MAX, description="stop after this many passes over the "
                                   "training data (None: no limit)")
    max_minutes: float | None = Field(None, gt=0, le=10**7, description="wall-clock budget; stop cleanly after it")
    batch_sentences: int | None = Field(None, gt=0, le=C_INT_MAX, description="sentences per batch; when set, batches "
                                        "are counted in sentences, not batch_tokens")
    schedule: Literal["noam", "constant", "inverse_sqrt", "cosine_restarts", "time_budget"] = Field(
        "noam", description="noam: paper eq. 3; constant; inverse_sqrt; cosine_restarts: SGDR (Loshchilov and "
        "Hutter, 2017) as TF's CosineDecayRestarts; time_budget: warmup and decay over the fraction of "
        "max_minutes used, fitted to the measured update rate (or of max_steps, where that ends first)")
    lr: float = Field(1e-3, gt=0, le=100.0, description="peak rate for constant/inverse_sqrt/time_budget, initial rate "
                                                        "for cosine_restarts")
    lr_factor: float = Field(1.0, gt=0, le=100.0, description="'factor' of the noam schedule")
    warmup_steps: int = Field(4000, ge=0, le=C_INT_MAX, description="noam, constant, inverse_sqrt: updates of linear "
                                                                    "warmup (paper: 4000)")
    first_decay_steps: int = Field(1000, gt=0, le=C_INT_MAX, description="cosine_restarts: updates in the first period")
    t_mul: float = Field(2.0, gt=0, le=100.0, description="cosine_restarts: each period is t_mul times the previous "
                         "one")
    m_mul: float = Field(1.0, gt=0, le=1.0, description="cosine_restarts: each restart's rate is m_mul times the "
                         "previous (at most 1: a rate growing m_mul^i over i restarts would overflow)")
    alpha: float = Field(0.0, ge=0.0, le=1.0, description="cosine_restarts: the floor, as a fraction of the rate")
    warmup_fraction: float = Field(
        0.2, gt=0.0, lt=1.0, description="time_budget: share of max_minutes spent warming up")
    budget_decay: Literal["inverse_sqrt", "cosine"] = Field(
        "inverse_sqrt", description="time_budget: after warmup, lr * sqrt(w / f) (noam's shape) or a cosine to 0 at "
        "the end of the budget (f: fraction used, w: warmup_fraction)")
    optimizer: Literal["adam", "sgd"] = Field("adam", description="adam (the paper, section 5.3) or SGD")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="sgd: momentum")
    nesterov: bool = Field(True, description="sgd: Nesterov momentum (Sutskever et al., 2013)")
    loss_normalization: Literal["tokens", "sentences"] = Field(
        "tokens", description="tokens: the loss summed over a batch's target tokens / their number; sentences: each "
        "sentence's mean loss per token, averaged over the batch's sentences")
    validate_every_epoch: bool = Field(
        False, description="validate after every epoch and log the epoch's train and valid loss and perplexity "
        "with its time")
    epoch_checkpoints: bool = Field(False, description="keep the weights after every epoch as "
                                    "checkpoints/epoch_N.safetensors")
    adam_betas: tuple[Annotated[float, Field(ge=0.0, lt=1.0)], Annotated[float, Field(ge=0.0, lt=1.0)]] = Field(
        (0.9, 0.98), description="adam: beta1 and beta2 (paper: 0.9, 0.98)")
    adam_eps: float = Field(1e-9, gt=0, le=1.0, description="adam: epsilon (paper: 1e-9)")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="L2 penalty added to the gradients by the optimizer "
                                "(torch.optim's weight_decay); the paper has none")
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0, description="epsilon_ls of label smoothing (paper section "
                                   "5.4: 0.1)")
    subword_alpha: float | None = Field(
        None, gt=0.0, le=1.0, description="subword regularisation (Kudo, 2018): each training batch encodes its "
        "sentences again with a segmentation sampled by SentencePiece, a new one each time a sentence is seen and the "
        "same ones on resume; a unigram model samples P(x)^alpha (Kudo: 0.1 to 0.5), a bpe model drops merges with "
        "probability alpha (BPE-dropout, Provilkov et al., 2020: 0.1); null: the prepared segmentation")
    subword_nbest: int = Field(-1, ge=-1, le=1000, description="with subword_alpha on a unigram model: sample among "
                                                               "the n best segmentations (n >= 2), or among all of "
                                                               "them (-1: forward-filtering and backward-sampling, "
                                                               "Kudo's l = infinity)")
    dropout_curriculum: int = Field(0, ge=0, le=C_INT_MAX, description="curriculum dropout (Morerio et al., 2017): "
                                    "each dropout probability of the model section grows from 0 as p * (1 - exp(-step "
                                    "/ N)), N this many updates (0.63 p after N, 0.95 p after 3N), so early updates "
                                    "learn without the noise and later ones get the whole p; the same rates on resume; "
                                    "0: constant p")
    clip_norm: float | None = Field(1.0, gt=0, le=1e6, description="clip the gradient's global L2 norm to this (None: "
                                                                   "no clipping, as in the paper)")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="fp32; bf16 autocast (CPUs with fast bfloat16, CUDA); fp16 autocast with loss scaling "
        "(CUDA only, fp32 elsewhere); the paper trained in float32")
    device: str = Field("auto", pattern=DEVICE_NAME, description="auto (CUDA, then MPS, then CPU), cpu, cuda, "
                        "cuda:N or mps; under torchrun 'cuda' is the GPU of the process's LOCAL_RANK")
    num_threads: int | None = Field(None, **ranges.THREADS.bounds(), description="CPU threads of PyTorch (None: its "
                                    "default, one per core)")
    compile: bool = Field(False, description="speed switch: the training step's encoder and decoder stack through "
                          "torch.compile (inductor, dynamic shapes; dropout draws stay PyTorch's own, so a seed gives "
                          "the eager run's masks); the compile time counts against max_minutes; false: eager")
    valid_every: int = Field(1000, gt=0, le=C_INT_MAX, description="validate every N updates")
    valid_bleu: bool = Field(True, description="validation also translates (greedy) and scores BLEU and chrF; the "
                             "best model is chosen by BLEU, else by validation loss")
    log_every: int = Field(100, gt=0, le=C_INT_MAX, description="log the training loss and speed every N updates")
    average_last: int = Field(0, ge=0, le=C_INT_MAX, description="average the last N validation checkpoints at the end")
    stop_patience: int | None = Field(None, gt=0, le=C_INT_MAX, description="stop after N validations without "
                                      "improvement")
    max_nonfinite_updates: int = Field(5, gt=0, le=C_INT_MAX, description="an update whose loss or gradient norm is "
                                       "not finite is skipped (counted and logged); after this many in a row training "
                                       "stops with an error, keeping a resumable checkpoint of the last finite state")
    init_from: str | None = Field(
        None, description="fine-tune: start from this attnmt model directory (trained, or imported with 'attnmt "
        "import marian'): its weights, its tokenizer(s) and vocabulary, its model section (and its decode section "
        "when this one sets none); keys given here must equal its own, except the dropout rates; a fresh optimizer "
        "and schedule; the starting model is validated as step 0")
    freeze: list[str] = Field(
        default_factory=list, description="parameters kept fixed in training (requires_grad off, left out of the "
        "optimizer): 'embeddings' (token embeddings and what is tied to them), 'encoder', 'decoder' (both without "
        "the token embeddings), or fnmatch patterns over parameter names such as 'decoder.layers.0.*'")


# The decoder layer whose head-averaged source attention aligned words best on the Multi30k
# German->English preset (docs/looking_inside.md); plots and the server show it by default.
DEFAULT_ATTENTION_LAYER = 2

# The decoder layer whose head-averaged source attention gives word alignments
# (``attnmt.decode.alignment``; translate --alignments, the API's ``alignments``): of the three
# layers of the Multi30k de->en preset, the one whose links hit the most hand-made links on
# test_2016 reference pairs (benchmarks/RESULTS.md, "Word alignment layer"). A shallower model
# uses its last layer.
DEFAULT_ALIGNMENT_LAYER = 3


class DecodeConfig(_Section):
    """Search defaults (beam search with the GNMT length penalty, Wu et al., 2016, eq. 14)."""

    beam_size: int = Field(5, **ranges.BEAM_SIZE.bounds(), description="beam width (1: greedy search; paper: 4)")
    length_penalty: float = Field(0.6, **ranges.LENGTH_PENALTY.bounds(), description="alpha in ((k + |Y|) / (k + "
                                  "1))^alpha")
    length_penalty_k: float = Field(5.0, **ranges.LENGTH_PENALTY_K.bounds(), description="k of the gnmt length penalty "
                                    "(Wu et al.: 5)")
    length_penalty_type: Literal["gnmt", "average"] = Field(
        "gnmt", description="gnmt: log P / ((k + |Y|) / (k + 1))^alpha; average: log P / |Y| (|Y| with EOS), the mean "
        "log-probability per token, OpenNMT-py's 'avg' and CTranslate2's default")
    max_len_a: float = Field(1.5, **ranges.MAX_LEN_A.bounds(), description="max output length = a * source length + b "
                             "(tokens, EOS included); every search ends a hypothesis that reaches it there, without "
                             "EOS")
    max_len_b: int = Field(10, **ranges.MAX_LEN_B.bounds(), description="b of the output length limit a * source "
                           "length + b (tokens)")
    early_stopping: bool = Field(
        False, description="beam search's stopping rule: true stops a sentence once round(beam_size x patience) "
        "hypotheses have finished (CTranslate2's and fairseq's rule); false is exact stopping, once no open "
        "hypothesis can beat the nbest finished ones (greedy search is the same under both)")
    patience: float = Field(1.0, **ranges.PATIENCE.bounds(), description="with early_stopping: wait for "
                            "round(beam_size x patience) finished hypotheses (Kasai et al., 2022)")
    batch_size: int = Field(128, **ranges.BATCH_SIZE.bounds(), description="sentences per search batch")
    precision: Literal["fp32", "bf16", "int8"] = Field(
        "fp32", description="inference precision: float32, bfloat16, or int8 (linear layers dynamically quantised "
        "to int8, CPU only)")
    device: str = Field("auto", pattern=DEVICE_NAME, description="auto (CUDA, then MPS, then CPU), cpu, cuda, "
                        "cuda:N or mps")
    attention: Literal["explicit", "fused"] = Field(
        "explicit", description="attention kernel for translation: the explicit formula of equation 1, or PyTorch's "
        "fused scaled_dot_product_attention (same function; the explicit one was faster for incremental decoding "
        "on the CPUs of benchmarks/RESULTS.md)")


# Keys that matter only to some values of another key: (section, key) -> (section, option, the
# option's values where the key applies). A key set explicitly (pydantic's ``model_fields_set``:
# written in the file or given with --set) to a value other than its default while its option has
# another value is refused, naming the option, so a knob never silently does nothing.
APPLIES_ONLY_TO: dict[tuple[str, str], tuple[str, str, tuple[str | bool, ...]]] = {
    **{("train", k): ("train", "schedule", ("cosine_restarts",))
       for k in ("first_decay_steps", "t_mul", "m_mul", "alpha")},
    **{("train", k): ("train", "schedule", ("time_budget",)) for k in ("warmup_fraction", "budget_decay")},
    ("train", "lr_factor"): ("train", "schedule", ("noam",)),
    ("train", "lr"): ("train", "schedule", ("constant", "inverse_sqrt", "cosine_restarts", "time_budget")),
    ("train", "warmup_steps"): ("train", "schedule", ("noam", "constant", "inverse_sqrt")),
    **{("train", k): ("train", "optimizer", ("sgd",)) for k in ("momentum", "nesterov")},
    **{("train", k): ("train", "optimizer", ("adam",)) for k in ("adam_betas", "adam_eps")},
    **{("tokenizer", k): ("tokenizer", "kind", ("sentencepiece",))
       for k in ("model_type", "vocab_size", "character_coverage", "max_sentences")},
    **{("tokenizer", k): ("tokenizer", "kind", ("word",))
       for k in ("lowercase", "min_freq", "max_vocab", "token_filter", "require_vectors", "src_lang", "tgt_lang")},
    **{("model", k): ("tokenizer", "kind", ("word",)) for k in ("src_vectors", "tgt_vectors")},
    ("model", "positional_layout"): ("model", "positional", ("sinusoidal",)),
    **{("decode", k): ("decode", "length_penalty_type", ("gnmt",)) for k in ("length_penalty", "length_penalty_k")},
    ("decode", "patience"): ("decode", "early_stopping", (True,)),
    ("train", "compile"): ("train", "loss_normalization", ("tokens",)),
    ("train", "dropout_curriculum"): ("train", "compile", (False,)),  # a new rate would recompile the graph
}


def _unused_keys(config: "Config") -> None:
    """Refuse a key of :data:`APPLIES_ONLY_TO` set to a non-default value for an option not in use.

    Raises:
        KeyRuleError: naming the first such key and the option it belongs to.
    """
    for (section, key), (opt_section, option, values) in APPLIES_ONLY_TO.items():
        sec = getattr(config, section)
        if key not in sec.model_fields_set or getattr(sec, key) == type(sec).model_fields[key].get_default(
                call_default_factory=True):
            continue
        value = getattr(getattr(config, opt_section), option)
        if value not in values:
            wanted = " or ".join(str(v).lower() if isinstance(v, bool) else v for v in values)
            raise KeyRuleError(f"{section}.{key}", f"{section}.{key} applies only to {opt_section}.{option} {wanted}, "
                               f"and {opt_section}.{option} is {value}: remove {section}.{key} or set "
                               f"{opt_section}.{option}")


class Config(_Section):
    """The whole configuration of a run."""

    data: DataConfig | None = Field(None, description="the training corpus; absent in imported models")
    tokenizer: TokenizerConfig = Field(TokenizerConfig(), description="how text becomes token ids")
    model: ModelConfig = Field(ModelConfig(), description="the Transformer's shape and options")
    train: TrainConfig = Field(TrainConfig(), description="optimisation, batching, validation and stopping")
    decode: DecodeConfig = Field(DecodeConfig(), description="search defaults of translate, evaluate and serve")

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "Config":
        """:data:`APPLIES_ONLY_TO` (skipped for the saved configuration of a model directory:
        ``context={"saved": True}``), then the rules between keys of different sections."""
        if not (info.context or {}).get("saved"):
            _unused_keys(self)
        if self.data is not None and self.data.max_len + 1 > self.model.max_positions:
            raise KeyRuleError("data.max_len", f"data.max_len ({self.data.max_len}) + 1 (EOS) must not exceed "
                               f"model.max_positions ({self.model.max_positions})")
        if self.train.schedule == "time_budget" and self.train.max_minutes is None:
            raise KeyRuleError("train.schedule", "train.schedule time_budget needs train.max_minutes (the budget "
                               "its warmup and decay are fitted to)")
        if self.tokenizer.require_vectors and (self.model.src_vectors is None or self.model.tgt_vectors is None):
            raise KeyRuleError("tokenizer.require_vectors", "tokenizer.require_vectors needs model.src_vectors and "
                               "model.tgt_vectors")
        no_pair = self.data is None or self.data.pair is None
        if self.tokenizer.kind == "word" and no_pair and None in (self.tokenizer.src_lang, self.tokenizer.tgt_lang):
            raise KeyRuleError("tokenizer.kind", "tokenizer.kind word needs data.pair or tokenizer.src_lang and "
                               "tokenizer.tgt_lang")
        if self.train.subword_alpha is not None and self.tokenizer.kind == "word":
            raise KeyRuleError("train.subword_alpha", "train.subword_alpha samples SentencePiece segmentations: it "
                               "needs tokenizer.kind sentencepiece")
        if "subword_nbest" in self.train.model_fields_set and self.train.subword_nbest != -1 and (
                self.train.subword_alpha is None or self.train.subword_nbest in (0, 1)):
            raise KeyRuleError("train.subword_nbest", "train.subword_nbest applies with train.subword_alpha and is -1 "
                               f"or at least 2 (0 and 1 sample nothing), not {self.train.subword_nbest}")
        if self.tokenizer.kind == "word" and self.tokenizer.joint:
            raise KeyRuleError("tokenizer.kind", "tokenizer.kind word builds one vocabulary per side: set "
                               "tokenizer.joint false")
        return self

    def languages(self) -> tuple[str, str]:
        """(source, target) language codes: tokenizer.src_lang/tgt_lang, else from data.pair."""
        pair = self.data.pair.split("-") if self.data is not None and self.data.pair else [None, None]
        return self.tokenizer.src_lang or pair[0], self.tokenizer.tgt_lang or pair[1]


def key_lines(text: str) -> dict[str, int]:
    """The 1-based line of each key of a YAML configuration, by dotted name ('train.lr'); {} where
    the text does not parse."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = f"{prefix}{key.value}"
                lines[name] = key.start_mark.line + 1
                walk(value, name + ".")

    if root is not None:
        walk(root, "")
    return lines


# pydantic's bound of a number field, in words: 'must be at most 10'
_BOUND_WORDS = {"le": "at most", "lt": "below", "ge": "at least", "gt": "above"}


def _out_of_range(e: dict) -> str | None:
    """A number outside its field's range as 'VALUE is out of range: must be at most N', else None."""
    ctx = e.get("ctx") or {}
    value = e["input"] if isinstance(e["input"], str) else repr(e["input"])  # YAML reads 1e6 as a string
    for name, words in _BOUND_WORDS.items():
        if name in ctx and e["type"].startswith(("less_than", "greater_than")):
            return f"{value} is out of range: must be {words} {ranges.number_text(ctx[name])}"
    if e["type"] in ("finite_number", "int_parsing_size"):  # nan, inf; a float too large for an int
        return f"{value} is out of range: must be a finite number"
    return None


def _format_validation_error(err: ValidationError, origin: str, lines: dict[str, int] | None = None) -> str:
    """One line: ``ORIGIN[:LINE]: invalid configuration: key: problem; ...``, LINE being that of the
    first erring key found in the file."""
    parts, where = [], None
    for e in err.errors():
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, KeyRuleError):
            key, msg = cause.key, str(cause)
            parts.append(msg)
        else:  # a list entry's index as data.train[2].max_pairs
            key = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in e["loc"]
                          if not (isinstance(x, str) and x.startswith("function-"))).lstrip(".")
            msg = "unknown key" if e["type"] == "extra_forbidden" else (
                _out_of_range(e) or e["msg"].removeprefix("Value error, "))
            parts.append(f"{key}: {msg}" if key else msg)
        found = re.sub(r"\[\d+\].*", "", key)  # key_lines knows mapping keys: data.train for data.train[2].src
        if where is None and lines and (key in lines or found in lines):
            where = lines.get(key, lines.get(found))
    return f"{origin}{f':{where}' if where else ''}: invalid configuration: " + "; ".join(parts)


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``section.key=value`` override set.

    Raises:
        ConfigError: an override without ``=`` or with an unparsable value.
    """
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. model.num_encoder_layers=4")
        key, value = item.split("=", 1)
        try:
            parsed = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item!r}: cannot parse value: {e}") from None
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {p!r} is not a section")
            node = child
        node[parts[-1]] = parsed
    return out


def config_from_dict(raw: dict[str, Any], origin: str = "<config>", *, saved: bool = False,
                     lines: dict[str, int] | Callable[[], dict[str, int]] | None = None) -> Config:
    """Validate a nested dict into a :class:`Config`.

    ``saved``: the configuration a model directory was trained with (its keys are not checked
    against :data:`APPLIES_ONLY_TO`, so that a model trained before a rule still loads).
    ``lines``: the line of each dotted key in the file (:func:`key_lines`), for the message, or
    a function that gives them (called only for a message).

    Raises:
        ConfigError: unknown keys, wrong types or inconsistent values, all named with their key,
            in one line.
    """
    try:
        return Config.model_validate(raw, context={"saved": saved})
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, origin, lines() if callable(lines) else lines)) from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML configuration file, apply dotted overrides, validate.

    Raises:
        ConfigError: missing file, YAML syntax error (with its line), or invalid values.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such configuration file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); is it a YAML configuration?") from None
    return config_from_yaml(text, path, overrides)


def config_from_yaml(text: str, path: str | Path, overrides: list[str] | None = None, *,
                     saved: bool = False) -> Config:
    """Parse YAML text (read from ``path``, named in errors), apply overrides, validate
    (``saved``: as :func:`config_from_dict`).

    Raises:
        ConfigError: YAML syntax error (with its line), not a mapping, or invalid values.
    """
    try:
        raw = yaml.load(text, Loader=SAFE_LOADER) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: YAML syntax error: {getattr(e, 'problem', e)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return config_from_dict(apply_overrides(raw, overrides or []), origin=str(path), saved=saved,
                            lines=lambda: key_lines(text))
