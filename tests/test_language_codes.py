"""Language codes are compared ignoring case wherever they are read, and mapped to one spelling:
the model's own where it has one (an imported OPUS-MT model's ``pt_br``), else the canonical one
(attnmt.config.canonical_language: 'EN' -> 'en', 'pt_br' -> 'pt_BR'). A configuration with
``tgt_lang: EN`` on one entry and ``en`` on another trains one tag, ``<2en>``."""

from __future__ import annotations

import json
import random
import typing

import pytest
import yaml
from fastapi.testclient import TestClient
from pydantic import BaseModel

from attnmt import config as config_module
from attnmt import languages
from attnmt.cli import main
from attnmt.config import Config, canonical_language, config_from_dict
from attnmt.errors import ConfigError
from attnmt.languages import LanguageError, spelling, target_language
from tests.conftest import GERMAN_ENGLISH, multilingual_config, toy_sentence, wait_ready
from tests.test_hardening import assert_one_line_error, run_cli


@pytest.mark.parametrize("code, canonical", [("en", "en"), ("EN", "en"), ("Fra", "fra"), ("pt_br", "pt_BR"),
                                             ("PT_br", "pt_BR"), ("zh_hant_tw", "zh_Hant_TW"), ("es_419", "es_419")])
def test_canonical_spelling(code, canonical):
    assert canonical_language(code) == canonical
    assert canonical_language(canonical) == canonical  # idempotent


def test_spelling_prefers_the_models_own_then_the_exact_then_the_canonical():
    assert spelling("EN", ["de", "en"]) == "en"
    assert spelling("pt_BR", ["fra", "pt_br"]) == "pt_br"  # the model's tag is >>pt_br<<
    assert spelling("pt_br", ["pt_br", "pt_BR"]) == "pt_br"  # OPUS-MT en-ROMANCE has both: the exact one
    assert spelling("PT_BR", ["pt_br", "pt_BR"]) == "pt_BR"  # neither exact: the canonical one
    assert spelling("pt", ["pt_br"]) is None


# ---- every language field of the configuration, read from the code --------------------------------


def _language_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, typing.Any]]:
    """(dotted name, field) of every field of ``model`` and of the models it holds whose name is
    a language code's (``*_lang``) or a pair's (``pair``, ``pairs``)."""
    found = []
    for name, field in model.model_fields.items():
        if name.endswith("_lang") or name in ("pair", "pairs"):
            found.append((prefix + name, field))
        for arg in [field.annotation, *typing.get_args(field.annotation)] + [
                a for arg in typing.get_args(field.annotation) for a in typing.get_args(arg)]:
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                found += _language_fields(arg, f"{prefix}{name}.")
    return found


def _config_with(path: str, value: str, tmp_path) -> Config:
    """A configuration whose field ``path`` (dotted; ``data.train.`` and ``data.valid.`` name an entry's) is ``value``."""
    raw = multilingual_config(tmp_path, max_steps=2)
    section, _, key = path.partition(".")
    if path.startswith(("data.train.", "data.valid.")):
        entries = raw["data"][path.split(".")[1]]
        side = path.rsplit(".", 1)[1]
        for entry in entries:
            entry[side] = value if entry[side] == "en" else entry[side]
    elif path in ("data.pair", "data.pairs"):
        raw["data"] = {"dataset": "multi30k", "max_len": 60, path[5:]: value if path == "data.pair" else [value, "en-fr"]}
    elif path.startswith("tokenizer."):
        raw["tokenizer"] = {"kind": "word", "joint": False, key: value}
        raw["data"]["pair"] = "de-en"
        del raw["data"]["valid"]
        for entry in raw["data"]["train"]:
            entry.pop("src_lang"), entry.pop("tgt_lang")
    else:
        raise AssertionError(f"{path}: a language field that this test does not know how to set; add it")
    return config_from_dict(raw)


def test_every_language_field_of_the_configuration_is_written_canonically(tmp_path):
    fields = _language_fields(Config)
    names = [name for name, _ in fields]
    assert {"data.pair", "data.pairs", "data.train.src_lang", "data.train.tgt_lang", "data.valid.tgt_lang",
            "tokenizer.src_lang", "tokenizer.tgt_lang"} <= set(names), names
    for name in names:
        value = "DE-En" if name.endswith(("pair", "pairs")) else "EN"
        config = _config_with(name, value, tmp_path)
        written = yaml.safe_dump(config.model_dump(mode="json"))
        assert "EN" not in written and "En" not in written, (name, written)


def test_two_spellings_of_one_pair_are_refused():
    with pytest.raises(ConfigError, match="names 'de-en' and 'DE-EN', one in two spellings"):
        config_from_dict({"data": {"dataset": "multi30k", "pairs": ["de-en", "DE-EN"]}})
    with pytest.raises(ConfigError, match="names a pair twice"):
        config_from_dict({"data": {"dataset": "multi30k", "pairs": ["de-en", "de-en"]}})
    with pytest.raises(ConfigError, match="two different language codes"):
        config_from_dict({"data": {"dataset": "multi30k", "pair": "en-EN"}})


def test_en_and_EN_entries_resolve_to_one_target_language(tmp_path):
    raw = multilingual_config(tmp_path)
    raw["data"]["train"][0]["tgt_lang"] = "EN"  # de-EN beside fr-en
    raw["data"]["valid"][0]["tgt_lang"] = "En"
    assert languages.resolve(config_from_dict(raw)).tokenizer.target_languages == ["de", "en", "fr"]
    raw["tokenizer"]["target_languages"] = ["de", "en", "fr"]  # inherited: a corpus into 'EN' is one of them
    languages.resolve(config_from_dict(raw))


# ---- a model trained on EN and en ------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_case_run(tmp_path_factory):
    """A multilingual model trained (one update) on entries into 'EN' and 'en' and a validation set into 'En'."""
    tmp_path = tmp_path_factory.mktemp("mixed_case")
    raw = multilingual_config(tmp_path, max_steps=1)
    raw["data"]["train"][0]["tgt_lang"] = "EN"
    raw["data"]["train"][0]["src_lang"] = "DE"
    raw["data"]["valid"][0]["tgt_lang"] = "En"
    raw["train"]["valid_bleu"] = False
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    assert main(["-q", "train", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "run")]) == 0
    return tmp_path / "run"


def test_EN_and_en_train_one_tag(mixed_case_run):
    from attnmt.rundir import read_config, read_tokenizers

    config = read_config(mixed_case_run)
    assert config.tokenizer.target_languages == ["de", "en", "fr"]
    src_tok, _ = read_tokenizers(mixed_case_run)
    pieces = set(src_tok.pieces(list(range(len(src_tok)))))
    assert {"<2de>", "<2en>", "<2fr>"} <= pieces and not {p for p in pieces if p.lower() != p and p.startswith("<2")}
    manifest = json.loads((mixed_case_run / "data" / "manifest.json").read_text())
    assert [(c["src_lang"], c["tgt_lang"]) for c in manifest["train"]["corpora"]][0] == ("de", "en")


def test_tgt_lang_option_ignores_case(mixed_case_run, tmp_path, capsys):
    (tmp_path / "in").write_text(toy_sentence("ein mann sieht ein auto", "de") + "\n")
    outputs = {}
    for code in ("en", "EN", "eN"):
        rc, out, err = run_cli(capsys, "translate", "--model", str(mixed_case_run), "--input", str(tmp_path / "in"),
                               "--tgt-lang", code)
        assert rc == 0, err
        outputs[code] = out
    assert len(set(outputs.values())) == 1
    from attnmt.decode.translator import Translator

    tr = Translator.from_dir(mixed_case_run)
    assert tr.translate(["ein mann"], tgt_lang="EN")[0].src_pieces[0] == "<2en>"
    rc, _, err = run_cli(capsys, "translate", "--model", str(mixed_case_run), "--input", str(tmp_path / "in"),
                         "--tgt-lang", "cs")
    assert_one_line_error(rc, err, "unknown target language 'cs'", "de, en, fr")


def test_a_bilingual_models_own_target_in_another_case(tiny_run):
    from attnmt.rundir import read_config

    config = read_config(tiny_run).model_copy(deep=True)
    config.tokenizer.tgt_lang = "en"
    assert target_language(config, "EN") is None  # its own target: no tag
    with pytest.raises(LanguageError, match="into en only"):
        target_language(config, "fr")


def test_server_and_libretranslate_take_codes_in_any_case(mixed_case_run):
    from attnmt.decode.translator import Translator
    from attnmt.serve.app import create_app

    source = toy_sentence("ein mann sieht ein auto", "de")
    with TestClient(create_app(lambda: Translator.from_dir(mixed_case_run))) as client:
        wait_ready(client)
        replies = {code: client.post("/v1/translate", json={"text": source, "tgt_lang": code}) for code in ("en", "EN")}
        assert {r.status_code for r in replies.values()} == {200}
        assert replies["EN"].json()["translations"] == replies["en"].json()["translations"]
        libre = {pair: client.post("/translate", json={"q": source, "source": pair[0], "target": pair[1]})
                 for pair in (("de", "en"), ("DE", "EN"))}
        assert {r.status_code for r in libre.values()} == {200}, [r.text for r in libre.values()]
        assert libre[("DE", "EN")].json() == libre[("de", "en")].json()
        same = client.post("/translate", json={"q": source, "source": "EN", "target": "en"})
        assert same.status_code == 400 and "not available as a target language" in same.json()["error"]
        unknown = client.post("/v1/translate", json={"text": source, "tgt_lang": "CS"})
        assert unknown.status_code == 422 and "'CS'" in unknown.text  # unknown: refused, named as given


# ---- an imported OPUS-MT model keeps its own spelling ----------------------------------------------


def test_opus_mt_model_keeps_its_spelling_and_takes_any_case(tmp_path):
    """A MarianMT model whose vocabulary holds ``>>pt_br<<`` (as OPUS-MT en-ROMANCE does): imported,
    its target language stays 'pt_br' (its tag), and 'pt_BR' or 'PT_BR' asks for that tag."""
    pytest.importorskip("transformers")
    from tests.test_interop_marian import save_marian
    from tests.test_multilingual_interop import _spm

    rng, words = random.Random(5), sorted(GERMAN_ENGLISH)
    german = [" ".join(rng.sample(words, rng.randint(2, 6))) for _ in range(300)]
    protos = (_spm([toy_sentence(g, "en") for g in german], 40),
              _spm([toy_sentence(g, lang) for g in german for lang in ("de", "fr")], 60))
    (tmp_path / "hf").mkdir()
    save_marian(tmp_path / "hf", protos, special=(">>pt_br<<", ">>fra<<"), max_positions=64)
    assert main(["-q", "import", "marian", str(tmp_path / "hf"), "--output", str(tmp_path / "model")]) == 0
    from attnmt.decode.translator import Translator
    from attnmt.rundir import read_config

    assert read_config(tmp_path / "model").tokenizer.target_languages == ["fra", "pt_br"]
    tr = Translator.from_dir(tmp_path / "model")
    for code in ("pt_br", "pt_BR", "PT_BR"):
        assert tr.translate(["a man"], tgt_lang=code, beam_size=1)[0].src_pieces[0] == ">>pt_br<<"
    assert tr.translate(["a man"], tgt_lang="FRA", beam_size=1)[0].src_pieces[0] == ">>fra<<"


def test_canonical_language_lives_beside_the_pattern_it_spells():
    """The configuration's language fields share one annotation: checked against LANGUAGE and spelled canonically."""
    args = typing.get_args(config_module.LanguageCode)
    assert args[0] is str and any(getattr(m, "func", None) is canonical_language for m in args[1:])
