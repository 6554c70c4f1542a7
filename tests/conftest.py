"""Shared fixtures: the local Multi30k copy, tiny models, and a live server in a thread."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from attnmt.config import ModelConfig
from attnmt.model.transformer import Transformer

REPO = Path(__file__).resolve().parents[1]


WEB = REPO / "src" / "attnmt" / "web"
# What the browser features' tests need, and the reason each skips without it, naming the package.
WEB_TOOLS = {
    "page": "the web page is not built: pip install -e . builds it where npm is on PATH (Debian packages nodejs npm)",
    "packages": "the page's JavaScript packages are not installed: pip install -e . installs them where npm is on "
                "PATH (Debian package npm)",
    "node": "node is not installed (Debian package nodejs)",
    "chromium": "chromium is not installed (Debian package chromium)",
}


def chromium_path() -> str | None:
    """The chromium executable on PATH (or Debian's /usr/bin/chromium), else None."""
    found = shutil.which("chromium") or "/usr/bin/chromium"
    return found if os.path.exists(found) else None


def missing_web_tool(*needs: str) -> str | None:
    """The skip reason of the first of ``needs`` (keys of :data:`WEB_TOOLS`) that is absent, else None."""
    from attnmt.interop import web_bundle

    present = {"page": lambda: not web_bundle.missing_assets(WEB / "dist"),
               "packages": lambda: (WEB / "node_modules" / "@sctg").is_dir(),
               "node": lambda: shutil.which("node") is not None,
               "chromium": lambda: chromium_path() is not None}
    return next((WEB_TOOLS[need] for need in needs if not present[need]()), None)


def skip_without(*needs: str) -> None:
    """Skip the calling test (or fixture) where one of ``needs`` is absent, naming its package:
    every test of the suite that needs the built page, its JavaScript packages, node or chromium
    calls this (tests/test_web_skips.py checks it)."""
    reason = missing_web_tool(*needs)
    if reason is not None:
        pytest.skip(reason)


def multi30k_data() -> Path | None:
    """The directory named by ``$ATTNMT_DATA`` if it holds ``multi30k/train.de.gz``, else None."""
    root = os.environ.get("ATTNMT_DATA")
    return Path(root) if root and (Path(root) / "multi30k" / "train.de.gz").is_file() else None


@pytest.fixture(autouse=True, scope="session")
def _precision_cache_of_the_session(tmp_path_factory):
    """``precision: auto``'s cache (``attnmt.autoprecision``) in a folder of the test session, for
    this process and the commands it starts: the tests neither read a user's timings nor leave theirs."""
    saved = os.environ.get("ATTNMT_PRECISION_CACHE")
    os.environ["ATTNMT_PRECISION_CACHE"] = str(tmp_path_factory.mktemp("precision_cache") / "precision.json")
    yield
    if saved is None:
        os.environ.pop("ATTNMT_PRECISION_CACHE", None)
    else:
        os.environ["ATTNMT_PRECISION_CACHE"] = saved


@pytest.fixture(scope="session")
def _torch_threads_of_the_session():
    """PyTorch's thread count when the session started."""
    import torch

    return torch.get_num_threads()


@pytest.fixture(autouse=True)
def _torch_threads_as_they_were(_torch_threads_of_the_session):
    """PyTorch's thread count back to the session's after each test: a training with
    ``train.num_threads`` sets it for the whole process (``attnmt.train.setup``), a module's
    fixture included, and a later test's model, trained or searched at another count, would
    differ from its reference in the last bits of float32."""
    import torch

    yield
    if torch.get_num_threads() != _torch_threads_of_the_session:
        torch.set_num_threads(_torch_threads_of_the_session)


@pytest.fixture(autouse=True)
def _attnmt_loggers_enabled():
    """attnmt's loggers switched on for every test: a library that configures logging with
    ``logging.config.dictConfig`` (``disable_existing_loggers`` defaults to True) silences the
    loggers that exist at that moment, and the tests that check a warning through ``caplog``
    would then see nothing."""
    for name, logger in logging.root.manager.loggerDict.items():
        if name.startswith("attnmt") and isinstance(logger, logging.Logger):
            logger.disabled = False


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")])])
def device(request) -> str:
    """The device a test builds its model on: 'cpu', and 'cuda' (mark ``cuda``: run with
    ``pytest -m cuda``) where PyTorch sees a GPU."""
    return request.param


@pytest.fixture
def multi30k_dir() -> Path:
    """The directory holding multi30k/*.gz, ``$ATTNMT_DATA`` (skips the test where it is absent)."""
    root = multi30k_data()
    if root is None:
        pytest.skip("Multi30k not found: set ATTNMT_DATA to the directory holding multi30k/")
    return root


def tiny_model(seed: int = 0, vocab: int = 40, device: str = "cpu", **overrides) -> Transformer:
    """A small randomly initialised Transformer in eval mode, on ``device``."""
    torch.manual_seed(seed)
    cfg = dict(d_model=32, num_heads=4, d_ff=64, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0,
               max_positions=128)
    cfg.update(overrides)
    return Transformer(ModelConfig(**cfg), vocab, vocab).eval().to(device)


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
    from attnmt.train.loop import train

    tmp_path = tmp_path_factory.mktemp("dictionary")
    rng = random.Random(0)
    words = sorted(GERMAN_ENGLISH)
    for name, n in (("train", 3000), ("valid", 40)):
        src = [" ".join(rng.sample(words, rng.randint(2, 6))) for _ in range(n)]
        (tmp_path / f"{name}.de").write_text("\n".join(src) + "\n", encoding="utf-8")
        (tmp_path / f"{name}.en").write_text("\n".join(map(word_for_word, src)) + "\n", encoding="utf-8")
    files = {f"{name}_{side}": str(tmp_path / f"{name}.{lang}")
             for name in ("train", "valid") for side, lang in (("src", "de"), ("tgt", "en"))}
    raw = {"data": {**files, "pair": "de-en", "max_len": 60},
           "tokenizer": {"vocab_size": 120, "model_type": "bpe"},
           "model": {"d_model": 64, "num_heads": 4, "d_ff": 128, "num_encoder_layers": 2, "num_decoder_layers": 2,
                     "dropout": 0.0, "share_embeddings": True, "max_positions": 64},
           "train": {"batch_tokens": 1500, "schedule": "inverse_sqrt", "lr": 3e-3, "warmup_steps": 50,
                     "max_steps": 250, "valid_every": 250, "log_every": 50, "label_smoothing": 0.1, "seed": 3},
           "decode": {"beam_size": 4}}
    run_dir = tmp_path / "run"
    train(config_from_dict(raw), run_dir, progress=False)
    return run_dir


# The toy task in three languages: the same concepts, one word each, in the same order.
ENGLISH_FRENCH = {"a": "un", "man": "homme", "woman": "femme", "dog": "chien", "cat": "chat", "child": "enfant",
                  "sees": "voit", "rides": "conduit", "red": "rouge", "big": "grand", "house": "maison",
                  "ball": "balle", "car": "voiture", "city": "ville", "and": "et", "plays": "joue"}


def toy_sentence(german: str, lang: str) -> str:
    """A sentence of the toy task (German words) in ``lang`` (de, en or fr), word for word."""
    english = word_for_word(german)
    return {"de": german, "en": english, "fr": " ".join(ENGLISH_FRENCH[w] for w in english.split())}[lang]


MULTILINGUAL_DIRECTIONS = ("de-en", "en-de", "en-fr", "fr-en")


def multilingual_config(tmp_path: Path, max_steps: int = 800) -> dict:
    """A raw configuration of the toy task in four directions (de<->en, en<->fr; de->fr and
    fr->de are zero-shot) with data.train and data.valid entries naming their languages, files
    written under ``tmp_path``. One thread, so that the model does not depend on the thread
    count an earlier test left (after 600 updates one thread's model still garbled en->fr)."""
    import random

    rng = random.Random(1)
    words = sorted(GERMAN_ENGLISH)
    for name, n in (("train", 1500), ("valid", 30)):
        german = [" ".join(rng.sample(words, rng.randint(2, 6))) for _ in range(n)]
        for lang in ("de", "en", "fr"):
            (tmp_path / f"{name}.{lang}").write_text("\n".join(toy_sentence(g, lang) for g in german) + "\n",
                                                     encoding="utf-8")
    train = [{"src": str(tmp_path / f"train.{d[:2]}"), "tgt": str(tmp_path / f"train.{d[3:]}"), "src_lang": d[:2],
              "tgt_lang": d[3:]} for d in MULTILINGUAL_DIRECTIONS]
    valid = [{"src": str(tmp_path / f"valid.{d[:2]}"), "tgt": str(tmp_path / f"valid.{d[3:]}"), "src_lang": d[:2],
              "tgt_lang": d[3:]} for d in ("de-en", "en-fr")]
    return {"data": {"train": train, "valid": valid, "max_len": 60},
            "tokenizer": {"vocab_size": 150, "model_type": "bpe"},
            "model": {"d_model": 64, "num_heads": 4, "d_ff": 128, "num_encoder_layers": 2, "num_decoder_layers": 2,
                      "dropout": 0.0, "share_embeddings": True, "max_positions": 64},
            "train": {"batch_tokens": 1500, "schedule": "inverse_sqrt", "lr": 3e-3, "warmup_steps": 50,
                      "max_steps": max_steps, "valid_every": max_steps, "log_every": 50, "seed": 3,
                      "num_threads": 1},
            "decode": {"beam_size": 4}}


@pytest.fixture(scope="session")
def multilingual_model_dir(tmp_path_factory) -> Path:
    """A small multilingual Transformer trained on the toy task in four directions
    (:func:`multilingual_config`): a model directory with tokenizer.target_languages [de, en, fr]."""
    from attnmt.config import config_from_dict
    from attnmt.train.loop import train

    tmp_path = tmp_path_factory.mktemp("multilingual")
    train(config_from_dict(multilingual_config(tmp_path)), tmp_path / "run", progress=False)
    return tmp_path / "run"


COPY_WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def copy_task_config(tmp_path: Path, max_steps: int = 12, **train) -> dict:
    """A raw configuration of a tiny copy task (word sequences translated to themselves): 400
    training and 20 validation pairs written under ``tmp_path``, a 16-dimensional model, fp32;
    trains in a few seconds. ``train`` overrides the train section."""
    import random

    rng = random.Random(0)
    lines = [" ".join(rng.sample(COPY_WORDS, rng.randint(1, 5))) for _ in range(420)]
    for name, part in (("train", lines[:400]), ("valid", lines[400:])):
        for side in ("src", "tgt"):
            (tmp_path / f"{name}.{side}").write_text("\n".join(part) + "\n")
    raw = {
        "data": {"train_src": str(tmp_path / "train.src"), "train_tgt": str(tmp_path / "train.tgt"),
                 "valid_src": str(tmp_path / "valid.src"), "valid_tgt": str(tmp_path / "valid.tgt")},
        "tokenizer": {"vocab_size": 40, "model_type": "bpe"},
        "model": {"d_model": 16, "num_heads": 2, "d_ff": 32, "num_encoder_layers": 1, "num_decoder_layers": 1,
                  "dropout": 0.1, "share_embeddings": True, "max_positions": 128},
        "train": {"batch_tokens": 300, "schedule": "inverse_sqrt", "lr": 3e-3, "warmup_steps": 5,
                  "max_steps": max_steps, "valid_every": 4, "log_every": 2, "precision": "fp32", "seed": 3, "num_threads": 1,
                  "average_last": 2},
        "decode": {"beam_size": 3, "max_len_b": 5},
    }
    raw["data"]["max_len"] = 60
    raw["train"].update(train)
    return raw


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A finished tiny copy-task run directory (a model directory), shared by tests that only
    read it."""
    from attnmt.config import config_from_dict
    from attnmt.train.loop import train

    tmp_path = tmp_path_factory.mktemp("tiny_run")
    train(config_from_dict(copy_task_config(tmp_path)), tmp_path / "run", progress=False)
    return tmp_path / "run"


def wait_ready(client, seconds: float = 60) -> None:
    """Wait until a test client's app answers ``/health`` with 200: the server loads its model in
    a worker thread, and until then every request is a 503 "loading"."""
    deadline = time.monotonic() + seconds
    while client.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "the model did not load"
        time.sleep(0.02)


@contextlib.contextmanager
def live_server(app) -> Iterator[str]:
    """``app`` served by uvicorn on a free port, in a thread (for what needs a real connection:
    client disconnects, other projects' HTTP clients): its base URL, without a trailing slash,
    once ``/health`` answers 200; stopped at exit."""
    import httpx
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the model did not load"
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


def checkpoint_tensors(state, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor (and number) of a loaded checkpoint, by its path in the nested dicts and lists."""
    out = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(checkpoint_tensors(v, f"{prefix}/{k}"))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(checkpoint_tensors(v, f"{prefix}/{i}"))
    elif isinstance(state, torch.Tensor):
        out[prefix] = state
    elif isinstance(state, (int, float)) and not isinstance(state, bool):
        out[prefix] = torch.tensor(state)
    return out


def checkpoint_differences(a: Path, b: Path) -> list[str]:
    """The entries of two ``checkpoints/last.pt`` files that differ, bit for bit (the wall-clock
    fields aside: the elapsed time, and the log's length, which holds timings' digits)."""
    left, right = (checkpoint_tensors(torch.load(p, map_location="cpu", weights_only=True)) for p in (a, b))
    timing = ("elapsed_seconds", "log_bytes")
    keys = {k for k in left.keys() | right.keys() if not any(t in k for t in timing)}
    return sorted(k for k in keys if k not in left or k not in right or left[k].shape != right[k].shape
                  or not torch.equal(left[k], right[k]))
