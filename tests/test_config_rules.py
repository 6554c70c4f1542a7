"""The configuration checks itself: every rule between keys is registered and refuses a bad
configuration with one line naming the key (and its line in the file), through the library and
through the CLI (exit status 2); a knob that only matters to an option not in use is refused,
naming that option; every preset still validates."""

from __future__ import annotations

import string
import typing
from pathlib import Path

import pytest
import yaml

from attnmt import cli
from attnmt.config import APPLIES_ONLY_TO, Config, config_from_dict, config_from_yaml, load_config
from attnmt.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
BASE = {"data": {"dataset": "multi30k", "pair": "de-en"}}

# A value other than the default for each key of APPLIES_ONLY_TO.
OTHER_VALUE = {
    "first_decay_steps": 10, "t_mul": 3.0, "m_mul": 0.5, "alpha": 0.1, "warmup_fraction": 0.3,
    "budget_decay": "cosine", "lr_factor": 2.0, "lr": 0.5, "warmup_steps": 10, "momentum": 0.5, "nesterov": False,
    "adam_betas": [0.9, 0.999], "adam_eps": 1e-8, "model_type": "bpe", "vocab_size": 100,
    "character_coverage": 0.99, "max_sentences": 10, "lowercase": True, "min_freq": 2, "max_vocab": 10,
    "token_filter": "alpha_punct", "require_vectors": True, "src_lang": "de", "tgt_lang": "en",
    "src_vectors": "de.vec", "tgt_vectors": "en.vec", "positional_layout": "halves", "length_penalty": 1.0,
    "length_penalty_k": 1.0, "patience": 2.0, "compile": True, "dropout_curriculum": 1000,
}

# (name, YAML text, the key whose line the message gives, words the message must hold)
CROSS_FIELD = [
    ("time_budget needs max_minutes",
     "data: {dataset: multi30k, pair: de-en}\ntrain:\n  schedule: time_budget\n",
     3, ["train.schedule time_budget", "train.max_minutes"]),
    ("require_vectors needs both vector files",
     "data: {dataset: multi30k, pair: de-en}\ntokenizer:\n  kind: word\n  joint: false\n  require_vectors: true\n"
     "model: {src_vectors: a.vec}\n",
     5, ["tokenizer.require_vectors", "model.tgt_vectors"]),
    ("word tokens need languages",
     "data: {train_src: a.de, train_tgt: a.en}\ntokenizer:\n  kind: word\n  joint: false\n",
     3, ["tokenizer.kind word", "data.pair"]),
    ("word tokens need one vocabulary per side",
     "data: {dataset: multi30k, pair: de-en}\ntokenizer:\n  kind: word\n",
     3, ["tokenizer.kind word", "tokenizer.joint false"]),
    ("lengths fit the positions",
     "data:\n  dataset: multi30k\n  pair: de-en\n  max_len: 200\nmodel: {max_positions: 100}\n",
     4, ["data.max_len", "model.max_positions"]),
    ("heads divide d_model",
     "data: {dataset: multi30k, pair: de-en}\nmodel:\n  d_model: 30\n  num_heads: 8\n",
     4, ["model.d_model (30)", "model.num_heads (8)"]),
    ("pre_post_norm excludes norm_first",
     "data: {dataset: multi30k, pair: de-en}\nmodel:\n  norm_first: true\n  pre_post_norm: true\n",
     4, ["model.pre_post_norm", "model.norm_first"]),
    ("frozen embeddings and a tied output",
     "data: {dataset: multi30k, pair: de-en}\nmodel:\n  freeze_embeddings: true\n",
     3, ["model.freeze_embeddings", "model.tie_output false"]),
]


def _one_line_error(text: str, tmp_path: Path) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name,text,line,words", CROSS_FIELD, ids=[c[0] for c in CROSS_FIELD])
def test_cross_field_rule_refuses_with_one_line_naming_file_line_and_keys(name, text, line, words, tmp_path):
    message = _one_line_error(text, tmp_path)
    assert message.startswith(f"{tmp_path / 'bad.yaml'}:{line}: invalid configuration: ")
    for word in words:
        assert word in message


@pytest.mark.parametrize("name,text,line,words", CROSS_FIELD, ids=[c[0] for c in CROSS_FIELD])
def test_cli_refuses_each_cross_field_rule_with_exit_2_and_one_line(name, text, line, words, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    status = cli.main(["train", str(path), "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith(f"attnmt: error: {path}:{line}: ")
    assert all(word in err for word in words)
    assert not (tmp_path / "run").exists()


def _wrong_option_value(section: str, option: str, values: tuple[str, ...]) -> str:
    """A value of the option under which the key does not apply (not time_budget, which needs more)."""
    annotation = getattr(Config.model_fields[section].annotation, "model_fields")[option].annotation
    choices = (False, True) if annotation is bool else typing.get_args(annotation)
    return next(v for v in choices if v not in values and v != "time_budget")


@pytest.mark.parametrize("section,key", sorted(APPLIES_ONLY_TO), ids=[f"{s}.{k}" for s, k in sorted(APPLIES_ONLY_TO)])
def test_a_knob_of_an_option_not_in_use_is_refused_naming_that_option(section, key, tmp_path, capsys):
    opt_section, option, values = APPLIES_ONLY_TO[(section, key)]
    wrong = _wrong_option_value(opt_section, option, values)
    raw = {**BASE, opt_section: {option: wrong}}
    raw.setdefault(section, {})[key] = OTHER_VALUE[key]
    text = yaml.safe_dump(raw, sort_keys=False)
    message = _one_line_error(text, tmp_path)
    assert f"{section}.{key} applies only to {opt_section}.{option} " in message
    assert f"{opt_section}.{option} is {wrong}" in message
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.strip().startswith(f"{key}:"))
    assert message.startswith(f"{tmp_path / 'bad.yaml'}:{line}: ")
    assert cli.main(["train", str(tmp_path / "bad.yaml"), "--output", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"attnmt: error: {message}\n"


@pytest.mark.parametrize("section,key", sorted(APPLIES_ONLY_TO), ids=[f"{s}.{k}" for s, k in sorted(APPLIES_ONLY_TO)])
def test_the_same_knob_is_accepted_under_its_option(section, key):
    opt_section, option, values = APPLIES_ONLY_TO[(section, key)]
    raw = {**BASE, opt_section: {option: values[0]}}
    raw.setdefault(section, {})[key] = OTHER_VALUE[key]
    extra = {"train": {"max_minutes": 5}, "tokenizer": {"joint": False}, "model": {"src_vectors": "a.vec",
                                                                                   "tgt_vectors": "b.vec"}}
    for sec, keys in extra.items():  # what the option's other rules ask for
        if (sec == "train" and values[0] == "time_budget") or (sec != "train" and values[0] == "word"):
            raw.setdefault(sec, {}).update({k: v for k, v in keys.items() if k not in raw.get(sec, {})})
    config = config_from_dict(raw)
    assert getattr(getattr(config, section), key) == (tuple(OTHER_VALUE[key]) if key == "adam_betas"
                                                      else OTHER_VALUE[key])


def test_knobs_at_their_default_and_saved_configurations_are_accepted():
    """A full dump (every key set, as a model directory's config.yaml) validates again; a saved
    configuration is not checked for unused knobs (a model trained before a rule still loads)."""
    dumped = Config.model_validate(BASE).model_dump(mode="json")
    assert config_from_dict(dumped).train.t_mul == 2.0
    dumped["train"]["t_mul"] = 3.0  # schedule noam
    with pytest.raises(ConfigError, match="train.t_mul applies only to train.schedule cosine_restarts"):
        config_from_dict(dumped)
    assert config_from_yaml(yaml.safe_dump(dumped), "config.yaml", saved=True).train.t_mul == 3.0


def test_an_override_is_checked_too():
    text = yaml.safe_dump(BASE)
    with pytest.raises(ConfigError, match=r"^cfg\.yaml: invalid configuration: train\.momentum applies only to "
                                          r"train\.optimizer sgd"):
        config_from_yaml(text, "cfg.yaml", ["train.momentum=0.5"])
    assert config_from_yaml(text, "cfg.yaml", ["train.optimizer=sgd", "train.momentum=0.5"]).train.momentum == 0.5


BENCH_VALUES = {"data": "plain", "updates": 100, "warmup": 200, "precision": "fp32", "threads": 2, "log_every": 20,
                "decode_batch": 128}


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")) + [REPO / "benchmarks/configs/attnmt.yaml"],
                         ids=lambda p: p.stem)
def test_every_preset_validates(path):
    text = string.Template(path.read_text(encoding="utf-8")).safe_substitute(BENCH_VALUES)  # $ATTNMT_DATA stays
    config = config_from_yaml(text, path)
    assert config.data is not None
