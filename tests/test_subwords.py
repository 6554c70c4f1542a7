"""Subword regularisation (train.subword_alpha): sampled segmentations per batch, repeatable,
the same text, exact resume, and the configurations it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnmt.config import config_from_dict
from attnmt.data.tokenizers import Tokenizer
from attnmt.errors import ConfigError
from attnmt.train.subwords import SubwordSampler
from tests.conftest import GERMAN_ENGLISH
from tests.test_end_to_end import _config, straight_and_resumed

WORDS = sorted(GERMAN_ENGLISH)
SENTENCES = [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(4 + i % 5)) for i in range(300)]


@pytest.fixture(scope="module")
def unigram():
    return Tokenizer.train(SENTENCES, 150, "unigram")


def _rows(tok: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    return [np.array(ids, np.uint16) for ids in tok.encode_batch(texts)]


def test_each_batch_samples_new_segmentations_of_the_same_text_and_repeats_them(unigram):
    sampler = SubwordSampler(unigram, unigram, 0.1, -1, seed=3)
    texts = SENTENCES[:40]
    rows = _rows(unigram, texts)
    first = sampler(rows, rows, epoch=0, batch=5)
    again = sampler(rows, rows, epoch=0, batch=5)
    later = sampler(rows, rows, epoch=1, batch=5)
    as_lists = lambda side: [r.tolist() for r in side]  # noqa: E731
    assert as_lists(first[0]) == as_lists(again[0]) and as_lists(first[1]) == as_lists(again[1])  # repeatable
    assert as_lists(first[0]) != as_lists(later[0])  # another epoch, other segmentations
    assert as_lists(first[0]) != [r.tolist() for r in rows]  # not the prepared (best) segmentation
    assert [unigram.decode(r.tolist()) for r in first[0]] == texts  # the same text, segmented otherwise
    assert [unigram.decode(r.tolist()) for r in later[1]] == texts
    assert all(r.dtype == np.int64 for r in first[0] + first[1])


def test_the_nbest_setting_limits_the_candidates(unigram):
    """nbest 2: each sentence takes one of its two best segmentations."""
    text = SENTENCES[7]
    sampler = SubwordSampler(unigram, unigram, 0.05, 2, seed=1)  # a flat P(x)^alpha
    rows = _rows(unigram, [text])
    seen = {tuple(sampler(rows, rows, epoch=0, batch=b)[0][0].tolist()) for b in range(40)}
    best_two = {tuple(ids) for ids in unigram._text_sp.nbest_encode(text, nbest_size=2, out_type=int)}
    assert seen <= best_two and len(seen) == 2


def test_a_run_with_subword_sampling_resumes_bit_exactly(tmp_path):
    raw = _config(tmp_path, max_steps=30)
    raw["train"].update(precision="fp32", batch_tokens=600, valid_bleu=False, subword_alpha=0.2)
    a, b = straight_and_resumed(raw, tmp_path, 15)
    assert a["progress"]["step"] == b["progress"]["step"] == 30
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    plain = dict(raw, train={k: v for k, v in raw["train"].items() if k != "subword_alpha"})
    c, _ = straight_and_resumed(plain, tmp_path / "plain", 15)
    assert any(not torch.equal(value, c["model"][key]) for key, value in a["model"].items())  # it samples


def test_resuming_with_another_subword_setting_is_refused(tmp_path):
    from attnmt.train.loop import train

    raw = _config(tmp_path, max_steps=4)
    raw["train"].update(precision="fp32", batch_tokens=600, valid_bleu=False)
    train(config_from_dict(raw), tmp_path / "run", progress=False)
    raw["train"].update(max_steps=8, subword_alpha=0.1)
    with pytest.raises(ConfigError, match="train.subword_alpha changed"):
        train(config_from_dict(raw), tmp_path / "run", resume=True, progress=False)


@pytest.mark.parametrize("settings, key", [
    ({"tokenizer": {"kind": "word", "joint": False}, "data": {"dataset": "multi30k", "pair": "de-en"},
      "train": {"subword_alpha": 0.1}}, "train.subword_alpha"),
    ({"train": {"subword_nbest": 8}}, "train.subword_nbest"),
    ({"train": {"subword_alpha": 0.1, "subword_nbest": 1}}, "train.subword_nbest"),
    ({"train": {"subword_alpha": 1.5}}, "train.subword_alpha"),
])
def test_configurations_that_cannot_sample_are_refused(settings, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_from_dict(settings)


def test_a_multilingual_model_or_another_vocabulary_is_refused(unigram):
    with pytest.raises(ConfigError, match="without language tags"):  # a rule between keys: config/rules.py
        config_from_dict({"tokenizer": {"target_languages": ["en", "fr"]}, "train": {"subword_alpha": 0.1}})
    with pytest.raises(ConfigError, match="SentencePiece tokenizers"):
        SubwordSampler(unigram, object(), 0.1, -1, seed=1)
