"""Fine-tuning: a run that starts from an existing model directory (``train.init_from``).

The usual way to adapt a pretrained translator (fairseq ``--restore-file --reset-optimizer``,
Marian ``--pretrained-model``, OpenNMT-py ``train_from``): continue training the model's own
weights on new pairs, with its own tokenizer(s) and vocabulary and a fresh optimizer and
schedule. The starting directory may be any attnmt model directory, trained by attnmt or
imported (``attnmt import marian``).

* :func:`inherit_from` makes the run's configuration: the ``model`` and ``tokenizer`` sections
  come from the starting directory (and its ``decode`` section, where the run's sets no key);
  a key the run's configuration sets must equal the directory's own, except the dropout rates,
  which only act in training.
* :func:`freeze` keeps chosen parameters fixed (``train.freeze``).

Library: fnmatch (standard library).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from torch import nn

from attnmt import rundir
from attnmt.config import Config, config_from_dict
from attnmt.errors import ConfigError

# model keys that only act in training: a fine-tuning run may set its own
TRAINING_ONLY_KEYS = frozenset({"dropout", "attention_dropout", "activation_dropout", "time_shared_dropout"})
FREEZE_GROUPS = ("embeddings", "encoder", "decoder")
TOKEN_EMBEDDINGS = ("encoder.embedding.weight", "decoder.embedding.weight")  # Transformer's names
START_RECORD = "init_from.json"  # in the run directory: where the run started (path, weights hash)


def inherit_from(config: Config, model_dir: str | Path) -> Config:
    """``config`` with the ``model`` and ``tokenizer`` sections of ``model_dir`` (and its
    ``decode`` section when ``config`` sets no decode key), validated again.

    Keys ``config`` sets explicitly (``model_fields_set``: written in the YAML file or given
    with ``--set``) must equal ``model_dir``'s, except :data:`TRAINING_ONLY_KEYS`, which it may
    change; keys it omits are inherited.

    Raises:
        CheckpointError: ``model_dir`` is not a model directory.
        ConfigError: keys that differ from ``model_dir``'s (all named, one line).
    """
    base = rundir.read_config(model_dir)
    raw = config.model_dump(mode="json")
    differing = []
    for section in ("model", "tokenizer"):
        mine, theirs = getattr(config, section), getattr(base, section)
        merged = theirs.model_dump(mode="json")
        for key in sorted(mine.model_fields_set):
            value = mine.model_dump(mode="json")[key]
            if section == "model" and key in TRAINING_ONLY_KEYS:
                merged[key] = value
            elif value != merged[key]:
                differing.append(f"{section}.{key} ({value!r} here, {merged[key]!r} there)")
        raw[section] = merged
    if differing:
        raise ConfigError(f"train.init_from {model_dir}: the configuration contradicts the model it starts from: "
                          f"{'; '.join(differing)}; leave these keys out to inherit them")
    if not config.decode.model_fields_set:
        raw["decode"] = base.decode.model_dump(mode="json")
    # saved=True: the run's own keys passed the rules when it was loaded; the inherited sections
    # are a saved model's
    return config_from_dict(raw, origin=f"the configuration with train.init_from {model_dir}", saved=True)


def _matches(model: nn.Module, pattern: str) -> set[int]:
    """ids of the parameter tensors ``pattern`` names (a group of :data:`FREEZE_GROUPS` or an
    fnmatch pattern; a tensor tied under several names matches by any of them)."""
    named = list(model.named_parameters(remove_duplicate=False))
    embeddings = {id(p) for name, p in named if name in TOKEN_EMBEDDINGS}
    if pattern == "embeddings":
        return embeddings
    if pattern in ("encoder", "decoder"):
        return {id(p) for name, p in named if name.startswith(pattern + ".") and id(p) not in embeddings}
    return {id(p) for name, p in named if fnmatch.fnmatchcase(name, pattern)}


def freeze(model: nn.Module, patterns: list[str]) -> list[str]:
    """Switch off ``requires_grad`` of the parameters ``patterns`` name (``train.freeze``).

    ``embeddings``: the token embeddings and the tensors tied to them (a tied output projection);
    ``encoder`` / ``decoder``: every parameter under ``encoder.`` / ``decoder.`` except those;
    anything else: an fnmatch pattern over the names of ``model.named_parameters()``.

    Returns:
        The names of the frozen parameters (each tensor once, by its first name).
    Raises:
        ConfigError: a pattern that names no parameter, or patterns that freeze every
            parameter (nothing would be left to train).
    """
    frozen: set[int] = set()
    for pattern in patterns:
        ids = _matches(model, pattern)
        if not ids:
            example = next(name for name, _ in model.named_parameters())
            raise ConfigError(f"train.freeze: {pattern!r} matches no parameter (use {', '.join(FREEZE_GROUPS)} or a "
                              f"pattern over names such as {example!r})")
        frozen |= ids
    names = []
    for name, p in model.named_parameters():
        if id(p) in frozen:
            p.requires_grad_(False)
            names.append(name)
    if patterns and not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"train.freeze leaves no parameter to train ({', '.join(patterns)} freeze them all); "
                          "freeze fewer groups or patterns, or drop train.freeze")
    return names
