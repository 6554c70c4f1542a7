"""Typed configuration: pydantic models loaded from YAML, validated once, with dotted overrides.

A configuration file has five sections, each a model below: ``data``, ``tokenizer``, ``model``,
``train`` and ``decode``. Every section forbids unknown keys and checks types, so a typo such as
``modle.d_model`` or ``d_model: big`` is an error naming the key, never silently ignored.
Command-line overrides use dotted keys (``--set model.num_encoder_layers=4``); the value is parsed as
YAML, so ``4`` is an int, ``0.1`` a float, ``true`` a bool and ``null`` None.

Library: pydantic (validation) and PyYAML (parsing).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from attnmt.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(_Section):
    """Where the parallel corpus comes from.

    Either a registered ``dataset`` (``multi30k``) with a language ``pair`` (``de-en``), read from
    ``data_dir`` (or the ``ATTNMT_DATA`` environment variable, or downloaded), or explicit
    line-aligned files ``train_src``/``train_tgt`` (and optionally ``valid_src``/``valid_tgt``).
    """

    dataset: str | None = None
    pair: str | None = None
    data_dir: str | None = None
    train_split: str = "train"
    valid_split: str = "val"
    test_split: str | None = "test_2016_flickr"
    train_src: str | None = None
    train_tgt: str | None = None
    valid_src: str | None = None
    valid_tgt: str | None = None
    max_len: int = Field(100, gt=0, description="drop training pairs longer than this (subword tokens)")
    valid_max_sentences: int | None = Field(None, gt=0, description="use only the first N validation pairs")

    @model_validator(mode="after")
    def _one_source(self) -> "DataConfig":
        if self.dataset is None and (self.train_src is None or self.train_tgt is None):
            raise ValueError("give either data.dataset (with data.pair) or data.train_src and data.train_tgt")
        if self.dataset is not None and self.pair is None:
            raise ValueError("data.dataset needs data.pair, e.g. 'de-en'")
        if (self.valid_src is None) != (self.valid_tgt is None):
            raise ValueError("give both data.valid_src and data.valid_tgt, or neither")
        return self


class TokenizerConfig(_Section):
    """SentencePiece subword model(s) trained on the training split (Kudo and Richardson, 2018)."""

    model_type: Literal["unigram", "bpe"] = "unigram"
    vocab_size: int = Field(8000, gt=8)
    joint: bool = True
    character_coverage: float = Field(1.0, gt=0.0, le=1.0)
    max_sentences: int = Field(2_000_000, gt=0, description="sentences sampled to train SentencePiece")


class ModelConfig(_Section):
    """The Transformer's hyper-parameters (Vaswani et al., 2017, Table 3; base: 512/8/2048/6)."""

    d_model: int = Field(512, gt=0)
    num_heads: int = Field(8, gt=0)
    d_ff: int = Field(2048, gt=0)
    num_encoder_layers: int = Field(6, gt=0)
    num_decoder_layers: int = Field(6, gt=0)
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="P_drop on sub-layer outputs and embeddings")
    attention_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on attention weights")
    activation_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout inside the feed-forward")
    norm_first: bool = Field(False, description="pre-norm; the paper is post-norm (False)")
    positional: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = Field(1024, gt=0)
    share_embeddings: bool = Field(False, description="one embedding for source and target (joint vocab)")
    tie_output: bool = Field(True, description="output projection shares the target embedding (sec. 3.4)")
    output_bias: bool = Field(False, description="a learned bias on the logits; the paper has none")
    activation: Literal["relu", "swish", "gelu"] = Field(
        "relu", description="feed-forward activation; the paper's is relu (equation 2)")
    positional_layout: Literal["interleaved", "halves"] = Field(
        "interleaved", description="sinusoid layout: sin and cos interleaved on even and odd dimensions "
        "(the paper, section 3.5), or all sines in the first half and all cosines in the second (tensor2tensor, "
        "MarianMT, CTranslate2)")
    scale_embedding: bool = Field(True, description="multiply embeddings by sqrt(d_model) (the paper, section 3.4)")
    decoder_start_id: int = Field(2, ge=0, description="the id fed to the decoder first: BOS (2) in attnmt's "
                                  "vocabularies; an imported MarianMT model starts from its pad token (0)")
    forbidden_ids: list[int] = Field(
        default_factory=list, description="ids search never outputs: their log-probability is set to -inf after "
        "the log-softmax (the others are not renormalised); none in the paper, MarianMT forbids its pad token")

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.d_model % self.num_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.num_heads ({self.num_heads})")
        return self


class TrainConfig(_Section):
    """Optimisation (paper section 5): Adam, the warmup schedule, label smoothing, batching."""

    seed: int = 1
    batch_tokens: int = Field(4096, gt=0, description="padded tokens per batch (sentences x longest side)")
    accum_steps: int = Field(1, gt=0)
    max_steps: int | None = Field(None, gt=0)
    max_epochs: int | None = Field(None, gt=0)
    max_minutes: float | None = Field(None, gt=0, description="wall-clock budget; stop cleanly after it")
    schedule: Literal["noam", "constant", "inverse_sqrt"] = "noam"
    lr: float = Field(1e-3, gt=0, description="peak rate for constant/inverse_sqrt")
    lr_factor: float = Field(1.0, gt=0, description="'factor' of the noam schedule")
    warmup_steps: int = Field(4000, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = Field(0.0, ge=0.0)
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0)
    clip_norm: float | None = Field(1.0, gt=0)
    precision: Literal["fp32", "bf16"] = "fp32"
    num_threads: int | None = Field(None, gt=0)
    valid_every: int = Field(1000, gt=0, description="validate every N updates")
    valid_bleu: bool = True
    log_every: int = Field(100, gt=0)
    average_last: int = Field(0, ge=0, description="average the last N validation checkpoints at the end")
    stop_patience: int | None = Field(None, gt=0, description="stop after N validations without improvement")


class DecodeConfig(_Section):
    """Search defaults (beam search with the GNMT length penalty, Wu et al., 2016, eq. 14)."""

    beam_size: int = Field(5, gt=0)
    length_penalty: float = Field(0.6, description="alpha in ((k + |Y|) / (k + 1))^alpha")
    length_penalty_k: float = Field(5.0, ge=0.0)
    max_len_a: float = Field(1.5, ge=0.0, description="max output length = a * source length + b")
    max_len_b: int = Field(10, ge=0)
    batch_size: int = Field(128, gt=0, description="sentences per search batch")
    precision: Literal["fp32", "bf16", "int8"] = "fp32"
    attention: Literal["explicit", "fused"] = Field(
        "explicit", description="attention kernel for translation: the explicit formula of equation 1, or PyTorch's "
        "fused scaled_dot_product_attention (same function; the explicit one was faster for incremental decoding "
        "on the CPUs of benchmarks/RESULTS.md)")


class Config(_Section):
    """The whole configuration of a run."""

    data: DataConfig | None = Field(None, description="the training corpus; absent in imported models")
    tokenizer: TokenizerConfig = TokenizerConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    decode: DecodeConfig = DecodeConfig()


def _format_validation_error(err: ValidationError, origin: str) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        parts.append(f"{loc}: {msg}" if loc else msg)
    return f"{origin}: invalid configuration: " + "; ".join(parts)


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


def config_from_dict(raw: dict[str, Any], origin: str = "<config>") -> Config:
    """Validate a nested dict into a :class:`Config`.

    Raises:
        ConfigError: unknown keys, wrong types or inconsistent values, all named with their key.
    """
    try:
        return Config.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, origin)) from None


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
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: YAML syntax error: {getattr(e, 'problem', e)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return config_from_dict(apply_overrides(raw, overrides or []), origin=str(path))
