"""User mistakes with the languages of a model and its corpora: data.train entries that name some
languages but not all, a target language a model cannot give, a distillation rerun into the same
directory for another target language or other settings, a sampling temperature near 0, and
data.train's max_pairs and environment variables in data paths. Each ends in one line on stderr
and exit 2 naming the key or value, with the files already written unchanged; or does the right
thing with a warning."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
import yaml

from attnmt.config import config_from_dict
from attnmt.data.sampling import sample_lines
from attnmt.data.sources import data_path, training_corpora
from attnmt.errors import DataError
from attnmt.languages import served_languages, target_language, temperature_weights
from tests.conftest import GERMAN_ENGLISH, copy_task_config, toy_sentence, wait_ready, word_for_word
from tests.test_hardening import assert_one_line_error, run_cli


def _files(tmp_path: Path) -> dict[str, bool]:
    """Every file under ``tmp_path`` with its bytes (to show that nothing changed)."""
    return {str(p): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}


def _entries_config(tmp_path: Path, entries: list[dict], max_steps: int = 3) -> Path:
    """A copy-task configuration whose data.train is ``entries`` (each updated onto the copy
    task's files), written to tmp_path/config.yaml."""
    raw = copy_task_config(tmp_path, max_steps=max_steps)
    files = {"src": raw["data"].pop("train_src"), "tgt": raw["data"].pop("train_tgt")}
    raw["data"]["train"] = [{**files, **e} for e in entries]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


# ---- data.train entries that name some languages -------------------------------------------------

@pytest.mark.parametrize("entries, key", [
    ([{"src_lang": "de", "tgt_lang": "en"}, {"src_lang": "fr"}], "data.train[1].tgt_lang"),
    ([{"tgt_lang": "en"}, {"src_lang": "fr", "tgt_lang": "en"}], "data.train[0].src_lang"),
    ([{"src_lang": "de", "tgt_lang": "en"}, {}], "data.train[1].src_lang"),
])
def test_an_entry_without_its_languages_is_refused_before_anything_is_written(tmp_path, capsys, entries, key):
    config = _entries_config(tmp_path, entries)
    before = _files(tmp_path)
    rc, _, err = run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"))
    assert_one_line_error(rc, err, key, "config.yaml")
    assert _files(tmp_path) == before and not (tmp_path / "run").exists()


def test_data_pair_gives_the_entries_their_default_languages(tmp_path):
    raw = yaml.safe_load(_entries_config(tmp_path, [{"src_lang": "de"}, {}]).read_text())
    raw["data"]["pair"] = "de-en"
    config = config_from_dict(raw)
    assert [(c.src_lang, c.tgt_lang) for c in training_corpora(config)] == [("de", "en"), ("de", "en")]


# ---- the target language a model gives -----------------------------------------------------------

@pytest.fixture(scope="module")
def entry_model(tmp_path_factory) -> Path:
    """A tiny bilingual model trained from one data.train entry naming its languages (de -> en)."""
    tmp_path = tmp_path_factory.mktemp("entry_model")
    from attnmt.cli import main

    assert main(["-q", "train", str(_entries_config(tmp_path, [{"src_lang": "de", "tgt_lang": "en"}])),
                 "--output", str(tmp_path / "run")]) == 0
    return tmp_path / "run"


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_model_of_one_entry_refuses_another_target_language(entry_model, tmp_path, capsys, command):
    (tmp_path / "in.txt").write_text("alpha bravo\n")
    out = tmp_path / "out.txt"
    out.write_text("kept\n")
    args = ["--src", str(tmp_path / "in.txt"), "--ref", str(tmp_path / "in.txt")] if command == "evaluate" else [
        "--input", str(tmp_path / "in.txt"), "--output", str(out)]
    rc, _, err = run_cli(capsys, command, "--model", str(entry_model), "--tgt-lang", "fr", *args)
    assert_one_line_error(rc, err, "translates into en only", "'fr'")
    assert out.read_text() == "kept\n"


def test_a_model_of_one_entry_takes_its_own_target_language(entry_model, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("alpha bravo\n")
    rc, out, err = run_cli(capsys, "translate", "--model", str(entry_model), "--tgt-lang", "en",
                           "--input", str(tmp_path / "in.txt"))
    assert rc == 0 and len(out.splitlines()) == 1, err


def test_many_to_one_languages_come_from_the_entries(tmp_path):
    config = config_from_dict(yaml.safe_load(_entries_config(tmp_path, [
        {"src_lang": "de", "tgt_lang": "en"}, {"src_lang": "fr", "tgt_lang": "en"},
        {"src_lang": "cs", "tgt_lang": "en", "max_pairs": 10}]).read_text()))
    assert served_languages(config) == (["cs", "de", "fr"], ["en"])
    assert target_language(config, "en") is None  # one target language: no tag
    with pytest.raises(Exception, match="translates into en only, not 'fr'"):
        target_language(config, "fr")


def test_a_model_that_names_no_target_language_warns_that_tgt_lang_is_not_checked(tiny_run, tmp_path, capsys,
                                                                                    caplog):
    (tmp_path / "in.txt").write_text("alpha bravo\n")
    with caplog.at_level(logging.WARNING):
        rc, out, _ = run_cli(capsys, "translate", "--model", str(tiny_run), "--tgt-lang", "fr",
                             "--input", str(tmp_path / "in.txt"))
    assert rc == 0 and len(out.splitlines()) == 1
    assert any("is not checked" in r.getMessage() for r in caplog.records)


# ---- distillation reruns -------------------------------------------------------------------------

def _student(tmp_path: Path, pair: str, lines: int = 200) -> Path:
    """A tiny student configuration on the toy task, German into the target of ``pair``."""
    rng = random.Random(5)
    words = sorted(GERMAN_ENGLISH)
    german = [" ".join(rng.sample(words, rng.randint(2, 5))) for _ in range(lines)]
    tgt = pair.split("-")[1]
    for name, part in (("train", german), ("valid", german[:10])):
        (tmp_path / f"{name}.de").write_text("\n".join(part) + "\n", encoding="utf-8")
        (tmp_path / f"{name}.{tgt}").write_text("\n".join(toy_sentence(g, tgt) for g in part) + "\n",
                                                encoding="utf-8")
    raw = {"data": {"train_src": str(tmp_path / "train.de"), "train_tgt": str(tmp_path / f"train.{tgt}"),
                    "valid_src": str(tmp_path / "valid.de"), "valid_tgt": str(tmp_path / f"valid.{tgt}"),
                    "pair": pair, "max_len": 60},
           "tokenizer": {"vocab_size": 60, "model_type": "bpe"},
           "model": {"d_model": 16, "num_heads": 2, "d_ff": 32, "num_encoder_layers": 1, "num_decoder_layers": 1,
                     "max_positions": 64},
           "train": {"batch_tokens": 400, "schedule": "inverse_sqrt", "lr": 3e-3, "warmup_steps": 2,
                     "max_steps": 2, "valid_every": 2, "precision": "fp32", "num_threads": 1}}
    path = tmp_path / "student.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_distill_rerun_for_another_target_language_is_refused(multilingual_model_dir, tmp_path, capsys):
    student, out = _student(tmp_path, "de-en"), tmp_path / "student"
    rc, _, err = run_cli(capsys, "distill", str(student), "--teacher", str(multilingual_model_dir), "--output",
                         str(out), "--beam-size", "2")
    assert rc == 0, err
    english = (out / "distill" / "train.tgt").read_text(encoding="utf-8")
    assert english.split("\n")[0] == word_for_word((tmp_path / "train.de").read_text().split("\n")[0])
    before = _files(out)
    raw = yaml.safe_load(student.read_text())
    raw["data"]["pair"] = "de-fr"
    student.write_text(yaml.safe_dump(raw))
    rc, _, err = run_cli(capsys, "distill", str(student), "--teacher", str(multilingual_model_dir), "--output",
                         str(out), "--beam-size", "2")
    assert_one_line_error(rc, err, "tgt_lang 'en', not 'fr'", "new --output")
    assert _files(out) == before


@pytest.mark.parametrize("flag, value, field", [("--beam-size", "3", "decode.beam_size"),
                                                ("--length-penalty", "0.2", "decode.length_penalty")])
def test_distill_rerun_with_other_search_options_is_refused(dictionary_model_dir, tmp_path, capsys, flag, value,
                                                            field):
    student, out = _student(tmp_path, "de-en", lines=40), tmp_path / "student"
    common = ["distill", str(student), "--teacher", str(dictionary_model_dir), "--output", str(out)]
    rc, _, err = run_cli(capsys, *common, "--beam-size", "2")
    assert rc == 0, err
    before = _files(out)
    rc, _, err = run_cli(capsys, *common, *(["--beam-size", "2"] if flag != "--beam-size" else []), flag, value)
    assert_one_line_error(rc, err, field, "new --output")
    assert _files(out) == before


def test_distill_from_a_bilingual_teacher_into_another_language_is_refused(dictionary_model_dir, tmp_path, capsys):
    student, out = _student(tmp_path, "de-fr", lines=20), tmp_path / "student"
    rc, _, err = run_cli(capsys, "distill", str(student), "--teacher", str(dictionary_model_dir), "--output",
                         str(out))
    assert_one_line_error(rc, err, "translates into en only, not 'fr'")
    assert not out.exists()


# ---- sampling temperature ------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [1e-6, 1e-300])
def test_a_temperature_near_zero_samples_the_largest_corpus(temperature):
    weights = temperature_weights([100, 10, 50], [1.0, 1.0, 1.0], temperature)
    assert weights[1] == weights[2] == 0.0
    assert weights[0] * 100 == pytest.approx(160)  # the epoch's size, all from the largest corpus


def test_a_large_temperature_flattens_towards_uniform():
    weights = temperature_weights([100, 10], [1.0, 1.0], 1e6)
    assert weights[0] * 100 == pytest.approx(weights[1] * 10, rel=1e-4)


# ---- max_pairs and data paths --------------------------------------------------------------------

@pytest.mark.parametrize("value, problem", [(0, "out of range: must be above 0"), (-5, "out of range: must be above 0"),
                                            (2.5, "valid integer"), ("many", "valid integer"),
                                            (True, "a boolean is not a number")])
def test_max_pairs_out_of_range_is_one_line_naming_the_entry(tmp_path, capsys, value, problem):
    config = _entries_config(tmp_path, [{}, {}, {"max_pairs": value}])
    rc, _, err = run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"))
    assert_one_line_error(rc, err, "data.train[2].max_pairs", problem)
    assert not (tmp_path / "run").exists()


def test_max_pairs_reads_the_first_pairs_only(tmp_path, capsys):
    config = _entries_config(tmp_path, [{"max_pairs": 25}])
    rc, _, err = run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"))
    assert rc == 0, err
    import json

    entry = json.loads((tmp_path / "run" / "data" / "manifest.json").read_text())["train"]["corpora"][0]
    assert entry["lines"] == 25 and entry["max_pairs"] == 25
    assert entry["src"]["bytes"] == (tmp_path / "train.src").stat().st_size  # the whole file's record
    corpora = training_corpora(config_from_dict(yaml.safe_load(config.read_text())))
    src, tgt = sample_lines(corpora, 1000, seed=1)
    assert src == (tmp_path / "train.src").read_text().splitlines()[:25] and len(tgt) == 25


def test_max_pairs_beyond_the_corpus_warns_and_uses_it_all(tmp_path, capsys, caplog):
    config = _entries_config(tmp_path, [{"max_pairs": 10_000}])
    with caplog.at_level(logging.WARNING):
        rc, _, err = run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"))
    assert rc == 0, err
    assert any("max_pairs is 10000 but its files hold 400 pairs" in r.getMessage() for r in caplog.records)


def test_a_changed_max_pairs_on_resume_is_refused(tmp_path, capsys):
    config = _entries_config(tmp_path, [{"max_pairs": 100}], max_steps=2)
    assert run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"))[0] == 0
    raw = yaml.safe_load(config.read_text())
    raw["data"]["train"][0]["max_pairs"], raw["train"]["max_steps"] = 200, 4
    config.write_text(yaml.safe_dump(raw))
    before = _files(tmp_path / "run")
    rc, _, err = run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"), "--resume")
    assert_one_line_error(rc, err, "max_pairs 100 -> 200", "--allow-data-change")
    assert _files(tmp_path / "run") == before


def test_environment_variables_in_data_paths(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("x\n")
    monkeypatch.setenv("ATTNMT_TEST_DIR", str(tmp_path))
    assert data_path("$ATTNMT_TEST_DIR/a.txt") == tmp_path / "a.txt"
    monkeypatch.delenv("ATTNMT_TEST_DIR")
    with pytest.raises(DataError, match="ATTNMT_TEST_DIR is not set"):
        data_path("${ATTNMT_TEST_DIR}/a.txt")


def test_an_unset_variable_in_a_data_path_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ATTNMT_NOWHERE", raising=False)
    config = _entries_config(tmp_path, [{"src": "$ATTNMT_NOWHERE/train.src"}])
    rc, _, err = run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"))
    assert_one_line_error(rc, err, "ATTNMT_NOWHERE is not set")


def test_several_validation_sets_of_one_target_language(tmp_path, capsys):
    config = _entries_config(tmp_path, [{"src_lang": "de", "tgt_lang": "en"}, {"src_lang": "fr", "tgt_lang": "en"}])
    raw = yaml.safe_load(config.read_text())
    valid = {"src": raw["data"].pop("valid_src"), "tgt": raw["data"].pop("valid_tgt")}
    raw["data"]["valid"] = [{**valid, "src_lang": "de", "tgt_lang": "en"}, {**valid, "src_lang": "fr",
                                                                            "tgt_lang": "en"}]
    config.write_text(yaml.safe_dump(raw))
    rc, _, err = run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"))
    assert rc == 0, err
    import json

    manifest = json.loads((tmp_path / "run" / "data" / "manifest.json").read_text())
    assert [v["name"] for v in manifest["valid_sets"]] == ["de-en", "fr-en"]
    assert manifest["valid.0"]["pairs"] == manifest["valid.1"]["pairs"] == 20


@pytest.fixture(scope="module")
def many_to_one_model(tmp_path_factory) -> Path:
    """A tiny model trained from two data.train entries into one target language (de -> en and
    fr -> en on the copy task's files): no tag, two source languages."""
    tmp_path = tmp_path_factory.mktemp("many_to_one")
    from attnmt.cli import main

    config = _entries_config(tmp_path, [{"src_lang": "de", "tgt_lang": "en"}, {"src_lang": "fr", "tgt_lang": "en"}])
    assert main(["-q", "train", str(config), "--output", str(tmp_path / "run")]) == 0
    return tmp_path / "run"


def test_serve_a_many_to_one_model(many_to_one_model):
    from fastapi.testclient import TestClient

    from attnmt.decode.translator import Translator
    from attnmt.rundir import model_languages
    from attnmt.serve.app import create_app

    translator = Translator.from_dir(many_to_one_model)
    app = create_app(lambda: translator, name="m2o", languages=model_languages(many_to_one_model))
    with TestClient(app) as client:
        wait_ready(client)
        assert [(x["code"], x["targets"]) for x in client.get("/languages").json()] == [
            ("de", ["en"]), ("fr", ["en"]), ("en", [])]  # the target, listed as LibreTranslate lists languages
        info = client.get("/v1/models").json()["data"][0]
        assert (info["multilingual"], info["source_languages"], info["target_languages"]) == (
            False, ["de", "fr"], ["en"])
        for source in ("de", "fr"):
            r = client.post("/translate", json={"q": "alpha bravo", "source": source, "target": "en"})
            assert r.status_code == 200 and r.json()["translatedText"], r.text
        r = client.post("/translate", json={"q": "alpha bravo", "source": "de", "target": "fr"})
        assert 400 <= r.status_code < 500
        r = client.post("/v1/translate", json={"text": "alpha bravo", "tgt_lang": "fr"})
        assert 400 <= r.status_code < 500 and "en only" in r.text
        r = client.post("/v1/translate", json={"text": "alpha bravo", "tgt_lang": "en"})
        assert r.status_code == 200


def test_a_validation_set_in_another_target_language_is_refused_before_the_tokenizer(tmp_path, capsys):
    config = _entries_config(tmp_path, [{"src_lang": "de", "tgt_lang": "en"}])
    raw = yaml.safe_load(config.read_text())
    valid = {"src": raw["data"].pop("valid_src"), "tgt": raw["data"].pop("valid_tgt")}
    raw["data"]["valid"] = [{**valid, "src_lang": "de", "tgt_lang": "en"}, {**valid, "src_lang": "de",
                                                                            "tgt_lang": "fr"}]
    config.write_text(yaml.safe_dump(raw))
    rc, _, err = run_cli(capsys, "train", str(config), "--output", str(tmp_path / "run"))
    assert_one_line_error(rc, err, "data.valid[1].tgt_lang", "'fr'", "into en only")
    assert not (tmp_path / "run" / "data").exists()
