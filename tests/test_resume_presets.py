"""Every preset of configs/ resumes: at tiny size, a run of four updates stopped by SIGTERM after
its second (a real ``attnmt train`` process) and then ``--resume``d ends with the weights of four
updates in one go. The presets are read from ``configs/*.yaml``, so a new one is covered; their
Multi30k files are the first lines of each file of ``$ATTNMT_DATA/multi30k`` under the same
names, the form every data section reads (``data.dataset`` or ``$ATTNMT_DATA`` paths)."""

from __future__ import annotations

import gzip
import multiprocessing
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnmt.cli import main
from attnmt.config import Config, load_config
from attnmt.data.sources import training_corpora
from attnmt.data.text import read_lines
from attnmt.data.tokenizers import WordTokenizer
from attnmt.data.vectors import write_vec
from tests.conftest import multi30k_data
from tests.test_mistakes_training import records

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted((REPO / "configs").glob("*.yaml"))
LINES = 200  # of each Multi30k file
D_MODEL = 16
STOPPED_AFTER = 2  # the update after whose checkpoint SIGTERM is sent
STOP_SECONDS = 60


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """A directory for ``$ATTNMT_DATA``: ``multi30k/`` with the first :data:`LINES` lines of every
    file of the real one, same names, gzipped."""
    root = multi30k_data()
    if root is None:
        pytest.skip("Multi30k not found: set ATTNMT_DATA to the directory holding multi30k/")
    out = tmp_path_factory.mktemp("data")
    (out / "multi30k").mkdir()
    for path in sorted((root / "multi30k").glob("*.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            head = [line for _, line in zip(range(LINES), f)]
        (out / "multi30k" / path.name).write_bytes(gzip.compress("".join(head).encode(), mtime=0))
    return out


@pytest.fixture
def data_env(tiny_data, monkeypatch) -> Path:
    monkeypatch.setenv("ATTNMT_DATA", str(tiny_data))
    return tiny_data


def tiny_settings(config: Config, workdir: Path) -> list[str]:
    """``--set`` overrides that make ``config`` tiny (vocabulary, model, batches, validation) and
    four updates long, whatever its keys; pretrained vectors are written for a model that reads
    them. Everything else (schedule, optimizer, precision, stopping rules) stays the preset's."""
    sets = ["train.max_steps=4", f"train.valid_every={STOPPED_AFTER}", "train.log_every=1", "train.num_threads=1",
            "data.valid_max_sentences=8", "train.valid_bleu=false",
            "train.device=cpu"]
    tc, mc = config.tokenizer, config.model
    if config.train.batch_sentences:
        sets.append("train.batch_sentences=16")
    else:
        sets.append("train.batch_tokens=384")
    if config.train.init_from:  # fine-tuning: model and tokenizer come from the starting model
        return sets
    if tc.kind == "sentencepiece":
        sets.append("tokenizer.vocab_size=150")
    sets += [f"model.d_model={D_MODEL}", "model.num_heads=2", "model.d_ff=32", "model.num_encoder_layers=1",
             "model.num_decoder_layers=1"]
    if mc.head_dim is not None:
        sets.append(f"model.head_dim={D_MODEL // 2}")
    for side, path in (("src", mc.src_vectors), ("tgt", mc.tgt_vectors)):
        if path is not None:
            sets.append(f"model.{side}_vectors={word_vectors(config, side, workdir)}")
    return sets


def word_vectors(config: Config, side: str, workdir: Path) -> Path:
    """A .vec file of random :data:`D_MODEL`-dimensional vectors for every word of the training
    text's ``side``, tokenized as the configuration's word tokenizer does."""
    tc, rng = config.tokenizer, random.Random(0)
    lang = config.languages()[side == "tgt"]
    lines = [line for c in training_corpora(config) for line in read_lines(c.src if side == "src" else c.tgt)]
    words = sorted({w for s in WordTokenizer([], lang, tc.lowercase, tc.token_filter).tokenize(lines) for w in s})
    path = workdir / f"{side}.vec"
    write_vec(path, {w: [rng.uniform(-1, 1) for _ in range(D_MODEL)] for w in words})
    return path


@pytest.fixture(scope="module")
def start_model(tiny_data, tmp_path_factory) -> Path:
    """A tiny German->English model (one update of configs/multi30k_de_en.yaml at tiny size):
    the ``train.init_from`` of a fine-tuning preset."""
    run = tmp_path_factory.mktemp("start") / "model"
    preset = REPO / "configs" / "multi30k_de_en.yaml"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNMT_DATA", str(tiny_data))
        sets = [s for s in tiny_settings(load_config(preset), run.parent) if not s.startswith("train.max_steps")]
        assert train_in_process(preset, run, [*sets, "train.max_steps=1"]) == 0
    return run


def set_args(sets: list[str]) -> list[str]:
    return [x for s in sets for x in ("--set", s)]


def train_in_process(preset: Path, run: Path, sets: list[str], *extra: str) -> int:
    return main(["-q", "train", str(preset), "--output", str(run), *set_args(sets), *extra])


def final_weights(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    """The best (or averaged) weights, ``model.safetensors``, and the weights of the last update,
    from the resumable state."""
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert state["progress"]["step"] == 4
    return {"model.safetensors": load_file(run / "model.safetensors"), "last update": state["model"]}


def attnmt_process(argv: list[str], env: dict[str, str]) -> None:
    """The body of an ``attnmt`` process started by :func:`attnmt_processes` (its exit status is
    ``main``'s)."""
    os.environ.update(env)
    sys.exit(main(argv))


@pytest.fixture(scope="module")
def attnmt_processes():
    """A start method for ``attnmt`` processes that skips the seconds a new interpreter spends
    importing PyTorch: a fork server, an interpreter of its own that imports attnmt's training
    modules once and then forks a process for each run. (Forking this test process instead could
    hang: a child inherits the OpenMP thread pool of the runs already trained here.)"""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "attnmt.train.trainer", "torch._dynamo"])
    return context


def stopped_after_second_update(preset: Path, run: Path, sets: list[str], processes) -> int:
    """Run ``attnmt train`` in a process of its own (from ``processes``: :func:`attnmt_processes`);
    SIGTERM as soon as the checkpoint of update :data:`STOPPED_AFTER` is logged. Returns the
    update the stopped run's state holds."""
    proc = processes.Process(target=attnmt_process, args=(
        ["-q", "train", str(preset), "--output", str(run), *set_args(sets)], {"ATTNMT_DATA": os.environ["ATTNMT_DATA"]}))
    proc.start()
    deadline = time.monotonic() + 300
    while not any(r["step"] == STOPPED_AFTER for r in records(run, "valid")):
        assert proc.is_alive(), f"ended with {proc.exitcode} before its second update"
        assert time.monotonic() < deadline, "no checkpoint of the second update"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGTERM)
    proc.join(STOP_SECONDS)
    if proc.is_alive():
        proc.kill()
        pytest.fail(f"still running {STOP_SECONDS} s after SIGTERM")
    assert proc.exitcode == 128 + signal.SIGTERM
    assert records(run, "interrupted") and not records(run, "done")
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)["progress"]["step"]


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_preset_resumes_to_the_weights_of_an_uninterrupted_run(preset, data_env, attnmt_processes, tmp_path,
                                                                    request):
    config = load_config(preset)
    sets = tiny_settings(config, tmp_path)
    if config.train.init_from:
        sets.append(f"train.init_from={request.getfixturevalue('start_model')}")
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert train_in_process(preset, whole, sets) == 0
    assert stopped_after_second_update(preset, stopped, sets, attnmt_processes) < 4
    at_stop = torch.load(stopped / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert train_in_process(preset, stopped, sets, "--resume") == 0
    expected, got = final_weights(whole), final_weights(stopped)
    for kind, tensors in expected.items():
        assert tensors.keys() == got[kind].keys()
        unequal = [name for name, t in tensors.items() if not torch.equal(t, got[kind][name])]
        assert not unequal, f"{kind}: {unequal}"
    assert any(not torch.equal(t, got["last update"][name]) for name, t in at_stop.items())  # the resume trained


def test_a_many_to_one_run_with_several_validation_sets_is_not_stale(tmp_path):
    """Two source languages into one target: no tags, so the manifest records no languages; the
    several validation sets (a split each) made the check compare languages all the same. A
    filter key that a manifest lacks (one written before the filter existed) is its default."""
    from attnmt.config import config_from_dict
    from attnmt.data.prepare import prepare
    from attnmt.data.staleness import changed_inputs
    from tests.conftest import copy_task_config

    raw = copy_task_config(tmp_path)
    d = raw["data"]
    d["train"] = [{"src": d["train_src"], "tgt": d["train_tgt"], "src_lang": lang, "tgt_lang": "en"}
                  for lang in ("de", "fr")]
    d["valid"] = [{"src": d["valid_src"], "tgt": d["valid_tgt"], "src_lang": lang, "tgt_lang": "en"}
                  for lang in ("de", "fr")]
    d["train_src"] = d["train_tgt"] = d["valid_src"] = d["valid_tgt"] = None
    config = config_from_dict(raw)
    manifest = prepare(config, tmp_path / "prepared")
    assert manifest.valid_sets and not any(c.tagged for c in manifest.train.corpora)
    assert changed_inputs(config, manifest) is None
    del manifest.filters["copies"]
    assert changed_inputs(config, manifest) is None
    raw["data"]["filter"] = {"copies": True}
    assert changed_inputs(config_from_dict(raw), manifest) == "data.filter.copies False -> True"
    raw["data"]["filter"] = {}
    raw["data"]["train"][1]["tgt_lang"] = "fr"  # now multilingual: the sources would carry tags
    assert "train[0] languages None-None -> de-en" == changed_inputs(config_from_dict(raw), manifest)
