"""The fields of a MarianMT ``config.json`` (and ``generation_config.json``) that the import reads,
each checked as the parser checks a number before any is used.

A Hugging Face config is a file from outside: a ``vocab_size`` of 2**64 would otherwise size a
loop, a ``d_model`` of 1e300 reach PyTorch. :class:`MarianConfig` lists the fields with their
ranges (:mod:`attnmt.ranges`, the same ones the ``model`` section's keys use) and
:func:`read_marian_config` checks them (:func:`attnmt.ranges.check_record`), naming the file
and the field.

Library: the standard dataclasses; the field names are transformers' ``MarianConfig``'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from attnmt import ranges
from attnmt.errors import CheckpointError


@dataclass(frozen=True)
class MarianConfig:
    """What the import reads of a MarianMT config.json; a missing optional field takes
    transformers' default."""

    model_type: str
    vocab_size: int = field(metadata={"range": ranges.VOCABULARY})
    pad_token_id: int
    d_model: int = field(metadata={"range": ranges.WIDTH})
    encoder_attention_heads: int = field(metadata={"range": ranges.HEADS})
    decoder_attention_heads: int = field(metadata={"range": ranges.HEADS})
    encoder_ffn_dim: int = field(metadata={"range": ranges.WIDTH})
    decoder_ffn_dim: int = field(metadata={"range": ranges.WIDTH})
    encoder_layers: int = field(metadata={"range": ranges.LAYERS})
    decoder_layers: int = field(metadata={"range": ranges.LAYERS})
    eos_token_id: int = 0
    decoder_start_token_id: int | None = None
    decoder_vocab_size: int | None = field(default=None, metadata={"range": ranges.VOCABULARY})
    dropout: float = field(default=0.1, metadata={"range": ranges.PROBABILITY})
    attention_dropout: float = field(default=0.0, metadata={"range": ranges.PROBABILITY})
    activation_dropout: float = field(default=0.0, metadata={"range": ranges.PROBABILITY})
    max_position_embeddings: int = field(default=1024, metadata={"range": ranges.POSITIONS})
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    scale_embedding: bool = False
    activation_function: str = "gelu"


def read_marian_config(hf: object, path: Path) -> MarianConfig:
    """The checked fields of the parsed config.json ``hf`` (read from ``path``); other keys are
    ignored, as transformers ignores what its config class does not know.

    Raises:
        CheckpointError: not a JSON object, a field missing, of the wrong kind or out of its range,
            or a token id outside the vocabulary, naming the file and the field.
    """
    if not isinstance(hf, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    names = [f.name for f in dataclasses.fields(MarianConfig)]
    required = [f.name for f in dataclasses.fields(MarianConfig)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in hf]
    if missing:
        raise CheckpointError(f"{path}: missing {', '.join(missing)}; is it a MarianMT config.json?")
    config = MarianConfig(**{name: hf[name] for name in names if name in hf and hf[name] is not None
                             or name in required})
    try:
        ranges.check_record(config, "")
        for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(config, name)
            if value is not None:
                ranges.Range(0, config.vocab_size - 1, integer=True).check(value, name)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    return config


def read_beam_size(generation: object, path: Path) -> int | None:
    """``num_beams`` of a parsed generation_config.json, None where it has none.

    Raises:
        CheckpointError: not a JSON object, or ``num_beams`` outside :data:`attnmt.ranges.BEAM_SIZE`.
    """
    if not isinstance(generation, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    if generation.get("num_beams") is None:
        return None
    try:
        return ranges.BEAM_SIZE.check(generation["num_beams"], "num_beams")
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
