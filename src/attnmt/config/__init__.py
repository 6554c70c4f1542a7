"""Typed configuration: pydantic models loaded from YAML, validated once, with dotted overrides.

A configuration file has five sections, each a model: ``data`` and ``tokenizer``
(:mod:`attnmt.config.corpus`), ``model``, ``train`` and ``decode`` (:mod:`attnmt.config.schema`,
with :class:`Config`, the whole). Every section forbids unknown keys and checks types
(:mod:`attnmt.config.section`), so a typo such as ``modle.d_model`` or ``d_model: big`` is an
error naming the key, never silently ignored. Every number key has a range on both sides, no
float may be nan or inf, and a boolean is never a number. Rules between keys are checked once the
whole configuration is read (:mod:`attnmt.config.rules`), and a key that only matters to another
key's value not in use (``train.t_mul`` under ``train.schedule: noam``: :data:`APPLIES_ONLY_TO`)
is refused, naming that option. Language codes have one spelling
(:mod:`attnmt.config.language_codes`). Reading a file, ``--set`` overrides and the one-line
errors naming the key and its line are :mod:`attnmt.config.loading`.

The names below are this package's interface: import them from ``attnmt.config``.

Library: pydantic (validation) and PyYAML (parsing).
"""

from attnmt.config.corpus import CorpusEntry, DataConfig, FilterConfig, TokenizerConfig, ValidEntry
from attnmt.config.language_codes import (LANGUAGE, LanguageCode, canonical_language, canonical_name, canonical_pair,
                                          known_as, one_spelling_each)
from attnmt.config.loading import (SAFE_LOADER, apply_overrides, config_from_dict, config_from_yaml, key_lines,
                                   load_config)
from attnmt.config.rules import APPLIES_ONLY_TO, KeyRuleError, language_rules
from attnmt.config.schema import (DEFAULT_ALIGNMENT_LAYER, DEFAULT_ATTENTION_LAYER, DEVICE_NAME, Config, DecodeConfig,
                                  ModelConfig, TrainConfig)

__all__ = [
    "APPLIES_ONLY_TO",
    "DEFAULT_ALIGNMENT_LAYER",
    "DEFAULT_ATTENTION_LAYER",
    "DEVICE_NAME",
    "LANGUAGE",
    "SAFE_LOADER",
    "Config",
    "CorpusEntry",
    "DataConfig",
    "DecodeConfig",
    "FilterConfig",
    "KeyRuleError",
    "LanguageCode",
    "ModelConfig",
    "TokenizerConfig",
    "TrainConfig",
    "ValidEntry",
    "apply_overrides",
    "canonical_language",
    "canonical_name",
    "canonical_pair",
    "config_from_dict",
    "config_from_yaml",
    "key_lines",
    "known_as",
    "language_rules",
    "load_config",
    "one_spelling_each",
]
