"""Named test sets (``--testset multi30k:test_2016_flickr``): the direction from the model or from
--src-lang/--tgt-lang, the files of the local copy, and one line naming what the dataset has for a
set, a direction or a language it lacks; ``data.max_pairs`` by direction (the registry form of a
low-resource direction)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from attnmt.config import config_from_dict
from attnmt.data.corpus import MULTI30K
from attnmt.data.sources import training_corpora
from attnmt.data.testsets import direction, parse_testset, resolve_testset
from attnmt.errors import ConfigError, DataError
from tests.test_hardening import assert_one_line_error, run_cli


@pytest.fixture
def local_copy(tmp_path) -> Path:
    """A local copy of Multi30k's layout (empty files: a local copy is trusted as it is)."""
    folder = tmp_path / "data" / "multi30k"
    folder.mkdir(parents=True)
    for name in MULTI30K.sha256:
        (folder / name).write_bytes(b"")
    return folder.parent


def model_dir(tmp_path: Path, data: dict) -> Path:
    """A model directory's config.yaml (all --testset reads of the model) with this data section."""
    run = tmp_path / "model"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    return run


def test_a_test_set_name_is_dataset_colon_split_of_the_registry():
    assert parse_testset("multi30k:test_2016_flickr") == ("multi30k", "test_2016_flickr")
    with pytest.raises(DataError, match="expected DATASET:SPLIT"):
        parse_testset("test_2016_flickr")
    with pytest.raises(DataError, match="unknown dataset 'wmt14'; known: multi30k"):
        parse_testset("wmt14:newstest2014")
    with pytest.raises(DataError, match="multi30k has no set 'test_2017_mscoco'; it has train, val, test_2016_flickr"):
        parse_testset("multi30k:test_2017_mscoco")


def test_the_direction_is_the_model_s_own_or_chosen_among_its_languages():
    assert direction(["de"], ["en"], None, None) == ("de", "en")
    assert direction(["de", "fr", "cs"], ["en"], "cs", None) == ("cs", "en")
    assert direction([], [], "fr", "en") == ("fr", "en")  # languages not recorded: the options say
    with pytest.raises(DataError, match=r"several source languages \(de, fr\): choose one with --src-lang"):
        direction(["de", "fr"], ["en"], None, None)
    with pytest.raises(DataError, match="several target languages .* --tgt-lang"):
        direction(["en"], ["de", "fr"], None, None)
    with pytest.raises(DataError, match="--src-lang cs: this model's source languages are de, fr"):
        direction(["de", "fr"], ["en"], "cs", None)
    with pytest.raises(DataError, match="names no source language: give --src-lang"):
        direction([], ["en"], None, None)


def test_a_test_set_s_files_come_from_the_local_copy_as_they_are(local_copy):
    src, ref = resolve_testset("multi30k:test_2016_flickr", "cs", "en", local_copy)
    assert (src, ref) == (local_copy / "multi30k" / "test_2016_flickr.cs.gz",
                          local_copy / "multi30k" / "test_2016_flickr.en.gz")
    with pytest.raises(DataError, match="multi30k has no direction de-fr; it has de-en, en-de, en-fr, fr-en, en-cs"):
        resolve_testset("multi30k:test_2016_flickr", "de", "fr", local_copy)


def test_evaluate_and_translate_testset_mistakes_are_one_line(tmp_path, local_copy, capsys):
    many = model_dir(tmp_path, {"dataset": "multi30k", "pairs": ["de-en", "fr-en"]})
    rc, _, err = run_cli(capsys, "evaluate", "--model", str(many), "--testset", "multi30k:test_2016_flickr",
                         "--data-dir", str(local_copy))
    assert_one_line_error(rc, err, "several source languages (de, fr)", "--src-lang")
    rc, _, err = run_cli(capsys, "translate", "--model", str(many), "--testset", "multi30k:test_2099",
                         "--src-lang", "de")
    assert_one_line_error(rc, err, "multi30k has no set 'test_2099'", "test_2016_flickr")
    rc, _, err = run_cli(capsys, "translate", "--model", str(many), "--src-lang", "de")
    assert_one_line_error(rc, err, "--src-lang", "--testset")
    rc, _, err = run_cli(capsys, "translate", "--model", str(many), "--testset", "multi30k:val", "--input", "x.txt")
    assert_one_line_error(rc, err, "--testset or --input")
    rc, _, err = run_cli(capsys, "evaluate", "--model", str(many), "--src", "a.de")
    assert_one_line_error(rc, err, "--src and --ref")
    rc, _, err = run_cli(capsys, "evaluate", "--model", str(many), "--testset", "multi30k:val", "--src", "a.de",
                         "--ref", "a.en")
    assert_one_line_error(rc, err, "--testset", "--src and --ref")


def test_data_max_pairs_cuts_a_direction_of_the_dataset(local_copy):
    raw = {"data": {"dataset": "multi30k", "pairs": ["de-en", "cs-en"], "max_pairs": {"cs-en": 3000},
                    "data_dir": str(local_copy)}}
    corpora = training_corpora(config_from_dict(raw))
    assert [(c.src.name, c.max_pairs) for c in corpora] == [("train.de.gz", None), ("train.cs.gz", 3000)]
    one = training_corpora(config_from_dict({"data": {"dataset": "multi30k", "pair": "cs-en",
                                                      "max_pairs": {"cs-en": 10}, "data_dir": str(local_copy)}}))
    assert [c.max_pairs for c in one] == [10]
    with pytest.raises(ConfigError, match="data.max_pairs names 'fr-en', not a pair of data.pair or data.pairs "
                                          r"\(de-en, cs-en\)"):
        config_from_dict({"data": {**raw["data"], "max_pairs": {"fr-en": 5}}})
    with pytest.raises(ConfigError, match="data.max_pairs.cs-en: 0 is out of range: must be above 0"):
        config_from_dict({"data": {**raw["data"], "max_pairs": {"cs-en": 0}}})
