"""The presets in configs/: each loads and validates and says what it reproduces; the word-level
and the frozen-embedding presets train a few updates from the CLI on (a slice of) Multi30k and
translate."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from attnmt.config import load_config
from attnmt.data.tokenizers import WordTokenizer
from attnmt.data.vectors import write_vec
from attnmt.evaluate import tokenized_bleu

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted((REPO / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_loads_validates_and_names_its_source(path):
    config = load_config(path)
    assert path.read_text().startswith("# ")  # a comment saying what it reproduces
    # Multi30k through the dataset registry: the download alone trains every preset
    assert config.data.dataset == "multi30k" and config.data.train is None and config.data.valid is None
    if config.data.pairs is not None:  # several directions: a multilingual or a many-to-one preset
        targets = {pair.split("-")[1] for pair in config.data.pairs}
        assert len(config.data.pairs) > 1
        assert "multilingual" in path.stem if len(targets) > 1 else f"to_{targets.pop()}" in path.stem
    else:
        assert "_".join(config.data.pair.split("-")) in path.stem


# The many-to-English and Czech presets as they named Multi30k's files by path: the registry form
# must resolve to the same corpora (files, order, weights, languages, max_pairs) and validation sets.
BY_PATH = {
    "multi30k_many_to_en": {
        "train": [{"src": f"$ATTNMT_DATA/multi30k/train.{s}.gz", "tgt": "$ATTNMT_DATA/multi30k/train.en.gz",
                   "src_lang": s, "tgt_lang": "en", **({"max_pairs": 3000} if s == "cs" else {})}
                  for s in ("de", "fr", "cs")],
        "valid": [{"src": f"$ATTNMT_DATA/multi30k/val.{s}.gz", "tgt": "$ATTNMT_DATA/multi30k/val.en.gz",
                   "src_lang": s, "tgt_lang": "en"} for s in ("de", "fr", "cs")]},
    "multi30k_cs_en_lowres": {
        "train": [{"src": "$ATTNMT_DATA/multi30k/train.cs.gz", "tgt": "$ATTNMT_DATA/multi30k/train.en.gz",
                   "src_lang": "cs", "tgt_lang": "en", "max_pairs": 3000}],
        "valid_src": "$ATTNMT_DATA/multi30k/val.cs.gz", "valid_tgt": "$ATTNMT_DATA/multi30k/val.en.gz"},
}


@pytest.mark.parametrize("name", sorted(BY_PATH))
def test_registry_presets_read_what_they_read_by_path(name, tmp_path, monkeypatch):
    from attnmt.config import config_from_dict
    from attnmt.data.sources import training_corpora, validation_sets

    (tmp_path / "multi30k").mkdir()
    for split in ("train", "val"):
        for lang in ("de", "fr", "cs", "en"):
            (tmp_path / "multi30k" / f"{split}.{lang}.gz").write_bytes(b"")
    monkeypatch.setenv("ATTNMT_DATA", str(tmp_path))
    preset = load_config(REPO / "configs" / f"{name}.yaml")
    raw = preset.model_dump(exclude_unset=True)
    keep = {k: v for k, v in raw["data"].items() if k not in {"dataset", "pair", "pairs", "max_pairs"}}
    raw["data"] = {**keep, **BY_PATH[name]}
    by_path = config_from_dict(raw)

    def files(corpora):
        return [(c.src, c.tgt, c.weight, c.max_pairs) for c in corpora]

    train = training_corpora(preset)
    assert files(train) == files(training_corpora(by_path)) and train[-1].max_pairs == 3000
    assert [(c.src_lang, c.tgt_lang) for c in train] == [(c.src_lang, c.tgt_lang) for c in training_corpora(by_path)]
    assert files(validation_sets(preset)) == files(validation_sets(by_path))


def test_all_reference_presets_exist():
    names = {p.stem for p in PRESETS}
    assert {"tutorial_word_de_en", "spm_base_fr_en", "prenorm_frozen_de_en", "paper_base_de_en", "multi30k_de_en",
            "multi30k_en_de", "multi30k_en_fr"} <= names


def _slice(multi30k_dir, tmp_path, split, lang, n):
    lines = gzip.decompress((multi30k_dir / "multi30k" / f"{split}.{lang}.gz").read_bytes()).decode().splitlines()
    path = tmp_path / f"{split}.{lang}"
    path.write_text("\n".join(lines[:n]) + "\n")
    return path


def _cli(*args, cwd=REPO):
    proc = subprocess.run([sys.executable, "-m", "attnmt", "-q", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _smoke(multi30k_dir, tmp_path, preset, extra=()):
    """Train ``preset`` for 3 updates on the first 1,000 Multi30k training pairs (20 for
    validation, without BLEU) with the preset's own settings otherwise; returns the run
    directory."""
    files = {f"{split}_{side}": _slice(multi30k_dir, tmp_path, name, lang, n)
             for split, name, n in (("train", "train", 1000), ("valid", "val", 20))
             for side, lang in (("src", "de"), ("tgt", "en"))}
    run_dir = tmp_path / "run"
    sets = ["data.dataset=null", "data.pair=null", "tokenizer.src_lang=de", "tokenizer.tgt_lang=en",
            "train.max_steps=3", "train.log_every=1", "train.max_minutes=null", "train.valid_bleu=false",
            "train.num_threads=1", "train.batch_sentences=16", *extra,
            *(f"data.{key}={path}" for key, path in files.items())]
    _cli("train", str(REPO / "configs" / preset), "--output", str(run_dir), *(x for s in sets for x in ("--set", s)))
    return run_dir


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]


def _check_word_token_bleu(run_dir, tmp_path):
    """evaluate adds the tutorials' BLEU on a word-level model: its output words (greedy, from
    translate --format jsonl) against the first five val references tokenized by the model's own
    target tokenizer (lowercased, filtered as trained)."""
    (tmp_path / "five.en").write_text("\n".join((tmp_path / "val.en").read_text().splitlines()[:5]) + "\n")
    scores = json.loads(_cli("evaluate", "--model", str(run_dir), "--beam-size", "1", "--threads", "1", "--json",
                             "--src", str(tmp_path / "five.de"), "--ref", str(tmp_path / "five.en")))
    words = [json.loads(line)["hypotheses"][0]["tokens"][:-1] for line in _cli(
        "translate", "--model", str(run_dir), "--beam-size", "1", "--threads", "1", "--format", "jsonl",
        "--input", str(tmp_path / "five.de")).splitlines()]
    tgt = WordTokenizer.load(run_dir / "tgt.vocab.json")
    refs = tgt.tokenize((tmp_path / "five.en").read_text().splitlines())
    assert tgt.lowercase and all(w == w.lower() for r in refs for w in r)
    assert scores["bleu_tokenized"] == pytest.approx(tokenized_bleu(words, refs)["bleu"])
    assert "tok:none" in scores["bleu_tokenized_signature"]


def test_word_level_tutorial_preset_trains_and_translates(multi30k_dir, tmp_path):
    run_dir = _smoke(multi30k_dir, tmp_path, "tutorial_word_de_en.yaml")
    assert [r["step"] for r in _records(run_dir) if r["kind"] == "train"] == [1, 2, 3]
    src = WordTokenizer.load(run_dir / "src.vocab.json")
    assert src.lowercase and 500 < len(src) < 2000  # words seen twice in 1,000 sentences
    (tmp_path / "five.de").write_text("\n".join((tmp_path / "val.de").read_text().splitlines()[:5]) + "\n")
    out = _cli("translate", "--model", str(run_dir), "--scores", "--beam-size", "1", "--threads", "1",
               "--input", str(tmp_path / "five.de"))
    lines = out.splitlines()
    assert len(lines) == 5 and all(line.count(" ||| ") == 4 for line in lines)
    _check_word_token_bleu(run_dir, tmp_path)


def test_tokenized_bleu_is_unsmoothed_corpus_bleu_on_the_given_tokens():
    ref = [["a", "man", "rides", "a", "bike"]]
    assert tokenized_bleu([["a", "man", "rides", "a", "bike"]], ref)["bleu"] == pytest.approx(100.0)
    # precisions 4/5, 3/4, 2/3, 1/2 and no brevity penalty: (1/5) ** (1/4)
    assert tokenized_bleu([["a", "man", "rides", "a", "horse"]], ref)["bleu"] == pytest.approx(100 * 0.2 ** 0.25)
    # no 4-gram in common: 0 without smoothing (sacreBLEU's default smoothing would not give 0)
    assert tokenized_bleu([["a", "man", "rides", "one", "bike"]], ref)["bleu"] == 0.0
    # tokens are taken as given: "Man" is not "man", "bike." is one token
    assert tokenized_bleu([["A", "Man", "rides", "a", "bike."]], ref)["bleu"] == 0.0
    with pytest.raises(ValueError):
        tokenized_bleu([["a"]], [])


def test_frozen_embedding_preset_trains_with_vectors_from_a_vec_file(multi30k_dir, tmp_path):
    rng = random.Random(0)
    train_lines = _slice(multi30k_dir, tmp_path, "train", "de", 1000).read_text().splitlines()
    words = {t for s in WordTokenizer([], "de", True, "alpha_punct").tokenize(train_lines[:300]) for t in s}
    vectors = {w: [rng.uniform(-1, 1) for _ in range(300)] for w in sorted(words)}
    write_vec(tmp_path / "de.vec", vectors)
    en_words = {t for s in WordTokenizer([], "en", True, "alpha_punct").tokenize(
        _slice(multi30k_dir, tmp_path, "train", "en", 300).read_text().splitlines()) for t in s}
    write_vec(tmp_path / "en.vec", {w: [0.5] * 300 for w in en_words})
    run_dir = _smoke(multi30k_dir, tmp_path, "prenorm_frozen_de_en.yaml",
                     [f"model.src_vectors={tmp_path / 'de.vec'}", f"model.tgt_vectors={tmp_path / 'en.vec'}"])
    src = WordTokenizer.load(run_dir / "src.vocab.json")
    assert set(src.words) <= words  # only words with a vector
    weights = load_file(str(run_dir / "model.safetensors"))
    row = weights["encoder.embedding.weight"][src.stoi["mann"]]
    assert row.tolist() == pytest.approx(vectors["mann"], abs=1e-6)  # loaded, and frozen for 3 updates
    assert "encoder.position_scale" in weights
    (tmp_path / "five.de").write_text("\n".join((tmp_path / "val.de").read_text().splitlines()[:5]) + "\n")
    out = _cli("translate", "--model", str(run_dir), "--scores", "--beam-size", "2", "--threads", "1",
               "--input", str(tmp_path / "five.de"))
    lines = out.splitlines()
    assert len(lines) == 5 and all(line.count(" ||| ") == 4 for line in lines)
    _check_word_token_bleu(run_dir, tmp_path)

