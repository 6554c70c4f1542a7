"""Typed configuration: unknown keys, wrong types, overrides, the presets."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnmt.config import load_config
from attnmt.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
BASE = "data: {dataset: multi30k, pair: de-en}\n"


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_unknown_key_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.d_modle: unknown key"):
        load_config(write(tmp_path, BASE + "model: {d_modle: 3}\n"))


def test_mistyped_value_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.d_model"):
        load_config(write(tmp_path, BASE + "model: {d_model: big}\n"))


def test_heads_must_divide_d_model(tmp_path):
    with pytest.raises(ConfigError, match="divisible"):
        load_config(write(tmp_path, BASE + "model: {d_model: 100, num_heads: 8}\n"))


def test_yaml_syntax_error_names_line(tmp_path):
    with pytest.raises(ConfigError, match=r"c\.yaml:3"):
        load_config(write(tmp_path, BASE + "model: {d_model: 64}\ntrain: seed: 3\n"))


def test_dotted_overrides_are_typed(tmp_path):
    cfg = load_config(write(tmp_path, BASE), ["model.num_encoder_layers=4", "train.precision=bf16",
                                              "train.max_minutes=1.5", "decode.length_penalty=1"])
    assert cfg.model.num_encoder_layers == 4 and cfg.train.precision == "bf16"
    assert cfg.train.max_minutes == 1.5 and cfg.decode.length_penalty == 1.0
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(write(tmp_path, BASE), ["model.layers=4"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(write(tmp_path, BASE), ["model.layers"])


def test_presets_validate():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.data.dataset == "multi30k", path  # the registry: the download alone trains each
