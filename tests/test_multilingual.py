"""One model, many languages (attnmt.languages): tags, temperature sampling, the multilingual
data path, translation into a chosen language, and bilingual models left as they were."""

from __future__ import annotations

import json
from types import SimpleNamespace
import subprocess
import sys

import numpy as np
import pytest
import yaml

from attnmt import languages
from attnmt.config import config_from_dict
from attnmt.data import shards
from attnmt.data.manifest import Manifest
from attnmt.data.plan import weighted_sample
from attnmt.data.prepare import prepare
from attnmt.data.tokenizers import EOS_ID, Tokenizer
from attnmt.errors import ConfigError
from attnmt.languages import LanguageError, temperature_weights
from tests.conftest import MULTILINGUAL_DIRECTIONS, copy_task_config, multilingual_config

SENTENCES = ["ein mann sieht ein rot auto", "eine frau und ein kind spielen ball"] * 50


def test_tags_are_reserved_pieces_that_no_text_encodes_to():
    tok = Tokenizer.train(SENTENCES, vocab_size=60, model_type="bpe", user_symbols=["<2en>", "<2fr>"])
    for tag in ("<2en>", "<2fr>"):
        [tag_id] = tok.piece_ids([tag])
        assert tok.pieces([tag_id]) == [tag] and tag_id != tok.piece_ids(["<unk>"])[0]  # one piece of its own
        for text in (tag, f"ein {tag} mann", f"ein{tag}mann"):  # text spelling a tag is ordinary characters
            assert tag_id not in tok.encode(text)
        assert len(tok.encode(tag)) > 1  # its characters, one piece or more each


def test_temperature_weights_match_the_formula_and_the_sampler_draws_them_within_2_percent():
    sizes, weights = [20_000, 4_000, 500], [1.0, 1.0, 2.0]
    assert temperature_weights(sizes, weights, 1.0) == weights
    new = temperature_weights(sizes, weights, 5.0)
    mass = np.array(weights) * sizes
    expected = (mass / mass.sum()) ** (1 / 5)
    expected /= expected.sum()
    assert sum(w * n for w, n in zip(new, sizes)) == pytest.approx(mass.sum())  # the epoch keeps its size
    starts = np.cumsum([0] + sizes[:-1])
    corpora = [SimpleNamespace(start=int(s), pairs=n, weight=w) for s, n, w in zip(starts, sizes, new)]
    sample = weighted_sample(corpora, seed=1, epoch=0)
    drawn = np.array([((sample >= s) & (sample < s + n)).sum() for s, n in zip(starts, sizes)]) / len(sample)
    assert np.abs(drawn - expected).max() < 0.02
    assert drawn[2] > 5 * mass[2] / mass.sum()  # the small corpus is drawn far more than its share


def test_sampling_temperature_must_be_positive():
    with pytest.raises(ConfigError, match="sampling_temperature"):
        config_from_dict({"data": {"train_src": "a", "train_tgt": "b", "sampling_temperature": 0}})


def test_resolve_fills_target_languages_only_for_several_targets(tmp_path):
    multi = config_from_dict(multilingual_config(tmp_path))
    assert languages.resolve(multi).tokenizer.target_languages == ["de", "en", "fr"]
    assert multi.tokenizer.target_languages == []  # a copy, the given configuration untouched
    bilingual = config_from_dict(copy_task_config(tmp_path))
    assert languages.resolve(bilingual) is bilingual
    raw = multilingual_config(tmp_path)
    del raw["data"]["train"][1]["tgt_lang"]
    with pytest.raises(ConfigError, match="tgt_lang"):
        languages.resolve(config_from_dict(raw))
    raw = multilingual_config(tmp_path)
    raw["tokenizer"]["target_languages"] = ["en", "fr"]  # e.g. inherited from the model fine-tuned
    with pytest.raises(ConfigError, match="'de'"):
        languages.resolve(config_from_dict(raw))


def test_multilingual_prepare_tags_every_source_with_its_corpus_target(tmp_path):
    out = tmp_path / "prepared"
    manifest = prepare(config_from_dict(multilingual_config(tmp_path)), out)
    tok = Tokenizer.load(out / "spm.model")
    assert [(c.src_lang, c.tgt_lang) for c in manifest.train.corpora] == [
        tuple(d.split("-")) for d in MULTILINGUAL_DIRECTIONS]
    corpus = shards.ShardedCorpus(out, "train", manifest)
    for entry in manifest.train.corpora:
        [tag_id] = tok.piece_ids([f"<2{entry.tgt_lang}>"])
        src, _ = corpus.pairs(range(entry.start, entry.start + entry.pairs))
        assert {int(s[0]) for s in src} == {tag_id}
        assert all(tag_id not in s[1:].tolist() for s in src)
    assert [(v.name, v.split) for v in manifest.valid_sets] == [("de-en", "valid.0"), ("en-fr", "valid.1")]
    refs = (out / shards.refs_file("valid.1")).read_text(encoding="utf-8").split("\n")
    assert refs[0] == (tmp_path / "valid.fr").read_text(encoding="utf-8").split("\n")[0]
    # the directions are part of what the directory is: the fingerprint changes with them
    raw = multilingual_config(tmp_path)
    raw["data"]["train"][0]["tgt_lang"], raw["data"]["train"][0]["tgt"] = "fr", str(tmp_path / "train.fr")
    other = prepare(config_from_dict(raw), tmp_path / "other")
    assert other.fingerprint != manifest.fingerprint


def test_a_bilingual_model_is_unchanged(tmp_path, tiny_run):
    config = config_from_dict(copy_task_config(tmp_path))
    manifest = prepare(config, tmp_path / "prepared")
    assert "valid_sets" not in manifest.to_dict() and "src_lang" not in manifest.to_dict()["train"]["corpora"][0]
    assert (tmp_path / "prepared" / shards.VALID_REFS).is_file()
    src_tok = Tokenizer.load(tmp_path / "prepared" / "spm.model")
    # its tokenizer is the one trained without tags: byte for byte what Tokenizer.train gives
    lines = (tmp_path / "train.src").read_text().split("\n")[:-1] + (tmp_path / "train.tgt").read_text().split("\n")[:-1]
    assert src_tok.model_proto == Tokenizer.train(lines, 40, "bpe", seed=3).model_proto
    # a model directory written before multilingual models existed (config.yaml without their
    # keys) loads and translates as with them
    from attnmt.decode.translator import Translator

    tr = Translator.from_dir(tiny_run)
    sources = ["alpha bravo", "delta echo foxtrot"]
    assert tr.encode_sources(sources) == [tr.src_tokenizer.encode(s) + [EOS_ID] for s in sources]
    before = [t.text for t in tr.translate(sources)]
    old = tmp_path / "old"
    old.mkdir()
    for f in tiny_run.iterdir():
        if f.is_file():
            (old / f.name).write_bytes(f.read_bytes())
    raw = yaml.safe_load((old / "config.yaml").read_text())
    for key in ("target_languages", "language_tag"):
        del raw["tokenizer"][key]
    for key in ("pairs", "valid", "sampling_temperature"):
        del raw["data"][key]
    (old / "config.yaml").write_text(yaml.safe_dump(raw))
    assert [t.text for t in Translator.from_dir(old).translate(sources)] == before


@pytest.fixture(scope="module")
def translator(multilingual_model_dir):
    from attnmt.decode.translator import Translator

    return Translator.from_dir(multilingual_model_dir)


def test_translation_into_each_trained_language(translator, multilingual_model_dir):
    from tests.conftest import toy_sentence

    assert translator.config.tokenizer.target_languages == ["de", "en", "fr"]
    german = ["ein mann sieht ein auto", "kind spielt ball und katze", "frau fährt rot auto"]
    for src_lang, tgt_lang in (("de", "en"), ("en", "fr"), ("fr", "en"), ("en", "de")):
        sources = [toy_sentence(g, src_lang) for g in german]
        out = translator.translate(sources, tgt_lang=tgt_lang)
        assert out[0].src_pieces[0] == f"<2{tgt_lang}>"
        right = sum(t.text == toy_sentence(g, tgt_lang) for t, g in zip(out, german))
        assert right >= 2, (src_lang, tgt_lang, [t.text for t in out])
    log = [json.loads(line) for line in (multilingual_model_dir / "train_log.jsonl").read_text().splitlines()]
    valid = [r for r in log if r["kind"] == "valid"][-1]
    assert set(valid["valid_directions"]) == {"de-en", "en-fr"}
    directions = valid["valid_directions"]
    assert valid["valid_bleu"] == pytest.approx((directions["de-en"]["bleu"] + directions["en-fr"]["bleu"]) / 2)


def test_an_unknown_or_missing_target_language_is_refused_naming_the_known_ones(translator):
    with pytest.raises(LanguageError, match="choose one with --tgt-lang.*de, en, fr"):
        translator.translate(["ein mann"])
    with pytest.raises(LanguageError, match="unknown target language 'cs'; this model knows de, en, fr"):
        translator.translate(["ein mann"], tgt_lang="cs")
    assert languages.served_languages(translator.config) == (["de", "en", "fr"], ["de", "en", "fr"])


def test_cli_tgt_lang(multilingual_model_dir, tmp_path):
    cmd = [sys.executable, "-m", "attnmt", "translate", "--model", str(multilingual_model_dir)]
    from attnmt.decode.translator import Translator
    from tests.conftest import ENGLISH_FRENCH

    sources = ["a man sees a car", "a child plays ball"]
    done = subprocess.run(cmd + ["--tgt-lang", "fr"], input="".join(s + "\n" for s in sources),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    expected = [t.text for t in Translator.from_dir(multilingual_model_dir).translate(sources, tgt_lang="fr")]
    assert done.stdout.splitlines() == expected
    assert set(" ".join(expected).split()) <= set(ENGLISH_FRENCH.values())  # French words only
    for extra, message in (([], "choose one with --tgt-lang"), (["--tgt-lang", "cs"], "unknown target language 'cs'")):
        done = subprocess.run(cmd + extra, input="ein mann\n", capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stdout == ""
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and "de, en, fr" in lines[0]


def test_bilingual_model_refuses_another_target_language(tiny_run):
    from attnmt.decode.translator import Translator

    tr = Translator.from_dir(tiny_run)
    tr.config.data.pair = "de-en"  # a bilingual model that knows its languages
    assert tr.translate(["alpha"], tgt_lang="en")[0].text == tr.translate(["alpha"])[0].text
    with pytest.raises(LanguageError, match="into en only, not 'fr'"):
        tr.translate(["alpha"], tgt_lang="fr")


def test_data_pairs_of_a_dataset(tmp_path):
    config = config_from_dict({"data": {"dataset": "multi30k", "pairs": ["de-en", "en-fr"]}})
    assert languages.resolve(config).tokenizer.target_languages == ["en", "fr"]
    assert languages.served_languages(languages.resolve(config)) == (["de", "en"], ["en", "fr"])
    for bad in (["de-en", "de-en"], ["de_en"], ["de-de"]):
        with pytest.raises(ConfigError):
            config_from_dict({"data": {"dataset": "multi30k", "pairs": bad}})


def test_fine_tuning_a_multilingual_model_keeps_its_languages_and_tags(multilingual_model_dir, tmp_path):
    from attnmt.decode.translator import Translator
    from attnmt.train.loop import train

    files = multilingual_model_dir.parent
    raw = {"data": {"train_src": str(files / "train.de"), "train_tgt": str(files / "train.fr"), "pair": "de-fr",
                    "max_len": 60, "valid_src": str(files / "valid.de"), "valid_tgt": str(files / "valid.fr")},
           "train": {"init_from": str(multilingual_model_dir), "max_steps": 3, "valid_every": 3, "batch_tokens": 800,
                     "schedule": "constant", "lr": 1e-4, "warmup_steps": 0}}
    train(config_from_dict(raw), tmp_path / "tuned", progress=False)
    tuned = Translator.from_dir(tmp_path / "tuned")
    assert tuned.config.tokenizer.target_languages == ["de", "en", "fr"]
    manifest = Manifest.load(tmp_path / "tuned" / "data")
    [tag_fr] = tuned.src_tokenizer.piece_ids(["<2fr>"])
    corpus = shards.ShardedCorpus(tmp_path / "tuned" / "data", "train", manifest)
    src, _ = corpus.pairs(range(5))
    assert {int(s[0]) for s in src} == {tag_fr}  # the fine-tuning pairs carry the model's tag of their target
    assert tuned.translate(["a man"], tgt_lang="en")[0].src_pieces[0] == "<2en>"
    raw["data"]["pair"] = "de-cs"  # a target the model does not know
    with pytest.raises(ConfigError, match="'cs' .* not one of the model's"):
        train(config_from_dict(raw), tmp_path / "tuned-cs", progress=False)
