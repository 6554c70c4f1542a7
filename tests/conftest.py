"""Shared fixtures: the local Multi30k copy and tiny models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnmt.config import ModelConfig
from attnmt.model.transformer import Transformer

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def multi30k_dir() -> Path:
    """The directory holding multi30k/*.gz (skips the test where it is absent)."""
    if not (SHARED_DATA / "multi30k" / "train.de.gz").is_file():
        pytest.skip("Multi30k not found in ../shared/data")
    return SHARED_DATA


def tiny_model(seed: int = 0, vocab: int = 40, **overrides) -> Transformer:
    """A small randomly initialised Transformer in eval mode."""
    torch.manual_seed(seed)
    cfg = dict(d_model=32, num_heads=4, d_ff=64, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0,
               max_positions=128)
    cfg.update(overrides)
    return Transformer(ModelConfig(**cfg), vocab, vocab).eval()


# A toy German->English dictionary task: each German word has one English word, in the same order.
GERMAN_ENGLISH = {"ein": "a", "mann": "man", "frau": "woman", "hund": "dog", "katze": "cat", "kind": "child",
                  "sieht": "sees", "fährt": "rides", "rot": "red", "groß": "big", "haus": "house", "ball": "ball",
                  "auto": "car", "stadt": "city", "und": "and", "spielt": "plays"}


def word_for_word(sentence: str) -> str:
    """The reference translation of a sentence of the toy German->English task."""
    return " ".join(GERMAN_ENGLISH[w] for w in sentence.split())


@pytest.fixture(scope="session")
def dictionary_model_dir(tmp_path_factory) -> Path:
    """A small Transformer trained for about half a minute on the toy German->English task:
    a model directory for translation, serving and the web page."""
    import random

    from attnmt.config import config_from_dict
    from attnmt.train.trainer import train

    tmp_path = tmp_path_factory.mktemp("dictionary")
    rng = random.Random(0)
    words = sorted(GERMAN_ENGLISH)
    for name, n in (("train", 3000), ("valid", 40)):
        src = [" ".join(rng.sample(words, rng.randint(2, 6))) for _ in range(n)]
        (tmp_path / f"{name}.de").write_text("\n".join(src) + "\n", encoding="utf-8")
        (tmp_path / f"{name}.en").write_text("\n".join(map(word_for_word, src)) + "\n", encoding="utf-8")
    files = {f"{name}_{side}": str(tmp_path / f"{name}.{lang}")
             for name in ("train", "valid") for side, lang in (("src", "de"), ("tgt", "en"))}
    raw = {"data": {**files, "pair": "de-en"},
           "tokenizer": {"vocab_size": 120, "model_type": "bpe"},
           "model": {"d_model": 64, "num_heads": 4, "d_ff": 128, "num_encoder_layers": 2, "num_decoder_layers": 2,
                     "dropout": 0.0, "share_embeddings": True, "max_positions": 64},
           "train": {"batch_tokens": 1500, "schedule": "inverse_sqrt", "lr": 3e-3, "warmup_steps": 50,
                     "max_steps": 250, "valid_every": 250, "log_every": 50, "label_smoothing": 0.1, "seed": 3},
           "decode": {"beam_size": 4}}
    run_dir = tmp_path / "run"
    train(config_from_dict(raw), run_dir, progress=False)
    return run_dir
