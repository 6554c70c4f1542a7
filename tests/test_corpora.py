"""Large-corpus data path: streaming reads, filters, memory-mapped shards, numpy batching,
weighted corpora, training from a prepared directory, and resume that notices changed data."""

from __future__ import annotations

import gzip
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from attnmt import rundir
from attnmt.cli import main
from attnmt.config import config_from_dict
from attnmt.data import plan, sentence_model
from attnmt.data.encoding import HashSet64, pair_hash
from attnmt.data.manifest import Manifest
from attnmt.data.prepare import prepare
from attnmt.data.text import iter_pairs
from attnmt.data.shards import ShardedCorpus
from attnmt.errors import ConfigError, DataError
from attnmt.train import data as train_data
from attnmt.train.distributed import Ranks
from attnmt.train import loop as loop_module
from attnmt.train.checkpoint import LAST_STATE
from attnmt.train.loop import TrainingRun, train

from .conftest import COPY_WORDS, copy_task_config


# ---- reading -------------------------------------------------------------------------------------

def test_streaming_reader_names_file_and_line(tmp_path):
    (tmp_path / "a.gz").write_bytes(gzip.compress("eins\r\n  zwei \n".encode()))
    (tmp_path / "b").write_text("one\ntwo\n")
    assert list(iter_pairs(tmp_path / "a.gz", tmp_path / "b")) == [("eins", "one"), ("zwei", "two")]
    (tmp_path / "bad").write_bytes(b"gut\nschlecht \xff\n")
    with pytest.raises(DataError, match=r"bad:2: invalid UTF-8"):
        list(iter_pairs(tmp_path / "bad", tmp_path / "b"))
    (tmp_path / "three").write_text("a\nb\nc\n")
    with pytest.raises(DataError, match=r"three has 3 lines but .*b has 2"):
        list(iter_pairs(tmp_path / "three", tmp_path / "b"))


def test_hash_set_matches_a_python_set():
    rng = np.random.default_rng(0)
    seen, reference = HashSet64(), set()
    for _ in range(40):
        chunk = rng.integers(0, 500, rng.integers(0, 60)).astype(np.uint64)
        new = seen.add_new(chunk)
        expected = []
        for h in chunk.tolist():
            expected.append(h not in reference)
            reference.add(h)
        assert new.tolist() == expected


# ---- preparing -----------------------------------------------------------------------------------

def _crafted_corpus(tmp_path, n=300):
    """Pairs with empty sides, duplicates, copies, length-ratio outliers and over-long lines."""
    rng = random.Random(1)
    src, tgt = [], []
    for i in range(n):
        s = " ".join(rng.choices(COPY_WORDS, k=rng.randint(1, 6)))
        t = " ".join(rng.choices(COPY_WORDS, k=rng.randint(1, 6)))
        kind = i % 10
        if kind == 1:
            s = "" if i % 20 == 1 else s
            t = t if i % 20 == 1 else "  "
        elif kind == 2 and src:
            s, t = src[-2], tgt[-2]  # a duplicate (of a usable pair)
        elif kind == 3:
            t = s  # a copy
        elif kind == 4:
            t = " ".join(rng.choices(COPY_WORDS, k=12))  # a ratio outlier (or too long)
        elif kind == 5 and i % 30 == 5:
            s = " ".join(rng.choices(COPY_WORDS, k=40))  # too long
        src.append(s)
        tgt.append(t)
    (tmp_path / "c.src").write_text("\n".join(src) + "\n")
    with gzip.open(tmp_path / "c.tgt.gz", "wt") as f:
        f.write("\n".join(tgt) + "\n")
    return src, tgt


def _prepare_config(tmp_path, **filters):
    return config_from_dict({"data": {"train_src": str(tmp_path / "c.src"), "train_tgt": str(tmp_path / "c.tgt.gz"),
                                      "max_len": 30, "filter": filters},
                             "tokenizer": {"vocab_size": 60, "model_type": "bpe"},
                             "model": {"max_positions": 64}})


def _brute_force(src, tgt, tok, max_len, ratio=None, copies=False, dedup=False):
    """Kept pairs (in order) and drop counts, by plain Python over the lines."""
    kept, dropped, seen = [], dict.fromkeys(["empty", "too_long", "length_ratio", "copies", "duplicate"], 0), set()
    for s, t in zip(src, tgt):
        s, t = s.strip(), t.strip()
        if not s or not t:
            dropped["empty"] += 1
            continue
        a, b = tok.encode(s), tok.encode(t)
        if len(a) > max_len or len(b) > max_len:
            dropped["too_long"] += 1
        elif ratio and max(len(a), len(b)) / min(len(a), len(b)) >= ratio:
            dropped["length_ratio"] += 1
        elif copies and s == t:
            dropped["copies"] += 1
        elif dedup and (s, t) in seen:
            dropped["duplicate"] += 1
        else:
            seen.add((s, t))
            kept.append((a, b))
    return kept, dropped


@pytest.mark.parametrize("dtype,workers", [(np.uint16, 2), (np.uint32, 1)])
def test_shards_round_trip_equals_direct_encoding(tmp_path, dtype, workers):
    src, tgt = _crafted_corpus(tmp_path)
    manifest = prepare(_prepare_config(tmp_path), tmp_path / "out", workers=workers, shard_pairs=70, dtype=dtype)
    tok, _ = rundir.read_tokenizers(tmp_path / "out")
    kept, dropped = _brute_force(src, tgt, tok, 30)
    corpus = ShardedCorpus(tmp_path / "out")
    assert len(manifest.train.shards) == -(-len(kept) // 70) > 2  # several shards
    assert corpus.shards[0].src.dtype == dtype and manifest.train.dropped == dropped
    assert len(corpus) == len(kept)
    for i, (a, b) in enumerate(kept):
        s, t = corpus.pair(i)
        assert s.tolist() == a and t.tolist() == b, i
    lengths = [(s.tolist(), t.tolist()) for s, t in corpus.length_chunks(size=50)]  # in chunks
    assert [len(s) for s, _ in lengths][:3] == [50, 20, 50]  # shard by shard (70 pairs a shard)
    assert [(a, b) for s, t in lengths for a, b in zip(s, t)] == [(len(a), len(b)) for a, b in kept]
    # batches read the pairs across shards, in the order asked, as writable arrays of their own
    order = list(range(len(kept)))[::-1]
    src_ids, tgt_ids = corpus.pairs(order)
    assert [(s.tolist(), t.tolist()) for s, t in zip(src_ids, tgt_ids)] == [kept[i] for i in order]
    assert all(s.flags.owndata and s.flags.writeable and s.dtype == dtype for s in src_ids + tgt_ids)
    if Path("/proc/self/maps").exists():  # and no shard file is mapped into the process, then or ever
        assert str(tmp_path / "out") not in Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("suffix, cut", [("src.bin", 2), (".tgt.idx.npy", 8), (".len.npy", 8)])
def test_a_truncated_shard_file_is_named(tmp_path, suffix, cut):
    _crafted_corpus(tmp_path)
    prepare(_prepare_config(tmp_path), tmp_path / "out", shard_pairs=70)
    path = tmp_path / "out" / f"train.00001.{suffix.lstrip('.')}"
    path.write_bytes(path.read_bytes()[:-cut])  # one token, offset or length pair short
    with pytest.raises(DataError, match=str(tmp_path / "out" / "train.00001")):
        ShardedCorpus(tmp_path / "out")


@pytest.mark.parametrize("name", ["../../outside/train.00001", "train.00000", "/tmp/train.00001"])
def test_a_shard_the_manifest_names_otherwise_is_refused(tmp_path, name):
    """A shard's name in the manifest is the one the writer gives it: a name leading out of the folder
    (or to another shard) is refused before any file is opened."""
    _crafted_corpus(tmp_path)
    prepare(_prepare_config(tmp_path), tmp_path / "out", shard_pairs=70)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    manifest["train"]["shards"][1]["name"] = name
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"manifest\.json: shard 1 of train is named .* not 'train\.00001'"):
        ShardedCorpus(tmp_path / "out")


def test_filter_counts_equal_a_brute_count(tmp_path):
    src, tgt = _crafted_corpus(tmp_path)
    config = _prepare_config(tmp_path, max_length_ratio=2.5, copies=True, dedup=True)
    manifest = prepare(config, tmp_path / "out")
    tok, _ = rundir.read_tokenizers(tmp_path / "out")
    kept, dropped = _brute_force(src, tgt, tok, 30, ratio=2.5, copies=True, dedup=True)
    assert manifest.train.dropped == dropped
    assert all(n > 0 for n in dropped.values()), dropped  # the corpus exercises every filter
    corpus = ShardedCorpus(tmp_path / "out")
    assert [(s.tolist(), t.tolist()) for s, t in (corpus.pair(i) for i in range(len(corpus)))] == kept
    assert pair_hash("ab", "c") != pair_hash("a", "bc")  # the side boundary is hashed


def test_prepare_uses_given_tokenizers_and_is_atomic(tmp_path):
    _crafted_corpus(tmp_path)
    prepare(_prepare_config(tmp_path), tmp_path / "first")
    tokenizers = rundir.read_tokenizers(tmp_path / "first")
    manifest = prepare(_prepare_config(tmp_path), tmp_path / "second", tokenizers)
    assert manifest.tokenizers == Manifest.load(tmp_path / "first").tokenizers
    (tmp_path / "c.src").write_text("only one line\n")  # misaligned now
    with pytest.raises(DataError, match="lines but"):
        prepare(_prepare_config(tmp_path), tmp_path / "third", tokenizers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.src", "c.tgt.gz", "first", "second"]  # no leftovers


def test_the_prepare_command_runs_without_pytorch(tmp_path):
    """Preparing needs no PyTorch, and not importing it keeps ``attnmt prepare`` (and each
    forked worker) about 150 MiB smaller."""
    _crafted_corpus(tmp_path)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(_prepare_config(tmp_path).model_dump(mode="json")))
    code = ("import sys; from attnmt.cli import main; "
            f"code = main(['-q', 'prepare', {str(tmp_path / 'c.yaml')!r}, '--output', {str(tmp_path / 'out')!r}]); "
            "print(code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines()[-1] == "0 False", out.stdout + out.stderr
    assert Manifest.load(tmp_path / "out").train.pairs > 0


def test_a_rank_that_cannot_see_rank_0s_directory_prepares_the_same_data(tmp_path, monkeypatch):
    """torchrun across machines with a text configuration: a rank whose machine lacks rank 0's
    RUN_DIR/data prepares a private copy with rank 0's tokenizers, identical to rank 0's."""
    _crafted_corpus(tmp_path)
    config = _prepare_config(tmp_path)
    manifest = prepare(config, tmp_path / "rank0")
    src_tok, tgt_tok = rundir.read_tokenizers(tmp_path / "rank0")
    rank1 = Ranks(rank=1, world_size=2, local_rank=0)
    (tmp_path / "machine1").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "machine1"))
    found = (str(tmp_path / "elsewhere" / "data"), manifest.fingerprint, train_data._protos(src_tok, tgt_tok, rank1))
    directory = train_data._rank_directory(config, found, None, rank1)
    assert directory.is_relative_to(tmp_path / "machine1")
    assert Manifest.load(directory).fingerprint == manifest.fingerprint
    # the learned sentence splitter is rank 0's alone (translation's, copied into the run by rank 0)
    files = sorted(p.name for p in (tmp_path / "rank0").iterdir() if p.name != sentence_model.FOLDER)
    assert files == sorted(p.name for p in directory.iterdir()) and any(f.endswith(".bin") for f in files)
    differ = [f for f in files if (directory / f).read_bytes() != (tmp_path / "rank0" / f).read_bytes()]
    assert differ == ["manifest.json"]  # its timings; the tokenizers, token ids, offsets and lengths are equal
    prepared = config_from_dict({"data": {"prepared": str(tmp_path / "rank0")}})
    with pytest.raises(DataError, match="no such prepared directory on the machine of rank 1"):
        train_data._rank_directory(prepared, found, None, rank1)


# ---- weights -------------------------------------------------------------------------------------

def test_corpus_weights_3_to_1(tmp_path):
    rng = random.Random(2)
    for name in ("a", "b"):
        lines = [" ".join(rng.choices(COPY_WORDS, k=rng.randint(1, 5))) + f" {name}" for _ in range(500)]
        for side in ("src", "tgt"):
            (tmp_path / f"{name}.{side}").write_text("\n".join(lines) + "\n")
    entries = [{"src": str(tmp_path / f"{n}.src"), "tgt": str(tmp_path / f"{n}.tgt"), "weight": w}
               for n, w in (("a", 1.5), ("b", 0.5))]
    config = config_from_dict({"data": {"train": entries}, "tokenizer": {"vocab_size": 60, "model_type": "bpe"}})
    corpora = prepare(config, tmp_path / "out").train.corpora
    corpus = ShardedCorpus(tmp_path / "out")
    draws = []
    for epoch in (0, 1):
        batches = plan.epoch_plan(train_data.buckets(corpus), corpora, 200, None, 1, epoch).share()
        indices = batches.indices
        from_a = int((indices < corpora[1].start).sum())
        assert from_a / (len(indices) - from_a) == pytest.approx(3.0, rel=0.02)
        assert set(indices[indices < corpora[1].start].tolist()) == set(range(corpora[1].start))  # all of a
        b = indices[indices >= corpora[1].start]
        assert len(set(b.tolist())) == len(b)  # b sampled without replacement
        draws.append(set(b.tolist()))
    assert draws[0] != draws[1]  # a new half of b every epoch


# ---- training ------------------------------------------------------------------------------------

def _records(run_dir, kind="train"):
    return [r for r in map(json.loads, (run_dir / "train_log.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_training_from_a_prepared_directory_equals_training_from_text(tmp_path):
    raw = copy_task_config(tmp_path, max_steps=6, valid_every=3, average_last=0)
    train(config_from_dict(raw), tmp_path / "from_text", progress=False)
    prepare(config_from_dict(raw), tmp_path / "prepared")
    prepared = dict(raw, data={"prepared": str(tmp_path / "prepared")})
    train(config_from_dict(prepared), tmp_path / "from_dir", progress=False)
    a, b = _records(tmp_path / "from_text"), _records(tmp_path / "from_dir")
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and len(a) == 3
    assert [r["valid_loss"] for r in _records(tmp_path / "from_text", "valid")] == [
        r["valid_loss"] for r in _records(tmp_path / "from_dir", "valid")]
    assert (tmp_path / "from_dir" / "spm.model").read_bytes() == (tmp_path / "prepared" / "spm.model").read_bytes()
    assert not (tmp_path / "from_dir" / "data").exists()  # nothing prepared again


def test_train_with_the_configuration_a_directory_was_prepared_from(tmp_path, capsys):
    """``attnmt prepare CONFIG --output DIR``, then ``attnmt train CONFIG --set
    data.prepared=DIR``: the text keys must name what DIR was prepared from."""
    raw = copy_task_config(tmp_path, max_steps=2, valid_every=2, average_last=0)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    prepared = tmp_path / "prepared"
    assert main(["-q", "prepare", str(tmp_path / "c.yaml"), "--output", str(prepared)]) == 0
    command = ["-q", "train", str(tmp_path / "c.yaml"), "--set", f"data.prepared={prepared}", "--output"]
    assert main(command + [str(tmp_path / "run")]) == 0
    assert not (tmp_path / "run" / "data").exists()  # trained from DIR, prepared nothing
    for side in ("src", "tgt"):
        with open(tmp_path / f"train.{side}", "a") as f:
            f.write("alpha bravo\n")
    capsys.readouterr()
    assert main(command + [str(tmp_path / "run2")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "attnmt: error:" in error
    assert f"{prepared} was not prepared from the data this configuration names" in error
    assert "train.src: content differs from the prepared" in error and not (tmp_path / "run2").exists()
    other_filter = dict(raw, data={**raw["data"], "max_len": 30, "prepared": str(prepared)})
    with pytest.raises(ConfigError, match=r"data\.max_len 60 -> 30"):
        TrainingRun(config_from_dict(other_filter), tmp_path / "run3", progress=False)


def test_validation_lines_too_long_for_the_model_are_left_out(tmp_path):
    raw = copy_task_config(tmp_path, max_steps=1)
    raw["data"]["max_len"], raw["model"]["max_positions"] = 60, 64
    with open(tmp_path / "valid.src", "a") as f:
        f.write(" ".join(COPY_WORDS * 8) + "\n")  # 80 words: more than max_positions subwords
    with open(tmp_path / "valid.tgt", "a") as f:
        f.write("alpha\n")
    training = TrainingRun(config_from_dict(raw), tmp_path / "run", progress=False)
    [valid] = training.data.valid_sets
    assert valid.pairs.dropped_long == 1 and len(valid.pairs.src) == 20 == len(valid.refs)
    assert training.trainer.evaluate()["valid_loss"] > 0  # no position beyond the model's


def test_resume_refuses_changed_data_or_batching_in_one_line(tmp_path):
    raw = copy_task_config(tmp_path, max_steps=4, valid_every=2, average_last=0)
    run = tmp_path / "run"
    train(config_from_dict(raw), run, progress=False)
    longer = dict(raw, train={**raw["train"], "max_steps": 6})
    other_budget = dict(longer, train={**longer["train"], "batch_tokens": 400})
    with pytest.raises(ConfigError, match=r"train\.batch_tokens changed since the checkpoint \(300 -> 400\)") as e:
        TrainingRun(config_from_dict(other_budget), run, resume=True, progress=False)
    assert "\n" not in str(e.value)
    for side in ("src", "tgt"):
        with open(tmp_path / f"train.{side}", "a") as f:
            f.write("alpha bravo\n")
    with pytest.raises(ConfigError, match=r"train\.src: content differs.*--allow-data-change") as e:
        TrainingRun(config_from_dict(longer), run, resume=True, progress=False)
    assert "\n" not in str(e.value)
    result = train(config_from_dict(longer), run, resume=True, progress=False, allow_data_change=True)
    assert result.steps == 6 and Manifest.load(run / "data").train.pairs == 401


def test_epochs_are_planned_once_each_and_the_planner_is_in_the_signature(tmp_path, monkeypatch):
    """Each epoch's share is planned once, after the previous one is freed; a finished run
    resumed counts its epoch without planning it; a checkpoint of another planner (one from
    before the planner was recorded, here) is refused in one line."""
    raw = copy_task_config(tmp_path, max_steps=24, valid_every=12, average_last=0)  # 20 batches an epoch
    training = TrainingRun(config_from_dict(raw), tmp_path / "run", progress=False)
    planned, real = [], loop_module.epoch_share

    def epoch_share(config, data, epoch, ranks, start=0):
        assert training._epoch_batches is None  # the previous epoch's share is gone
        planned.append((epoch, start))
        return real(config, data, epoch, ranks, start)

    monkeypatch.setattr(loop_module, "epoch_share", epoch_share)
    first = training.run()
    assert planned == [(0, 0), (1, 0)] and 1 < first.epochs_done < 2
    assert torch.load(tmp_path / "run" / LAST_STATE, weights_only=True)["data"]["batch_plan"] == plan.GENERATOR
    planned.clear()
    again = train(config_from_dict(raw), tmp_path / "run", resume=True, progress=False)  # finished: nothing to do
    assert planned == [] and again.epochs_done == first.epochs_done
    state = torch.load(tmp_path / "run" / LAST_STATE, weights_only=True)
    del state["data"]["batch_plan"]
    torch.save(state, tmp_path / "run" / LAST_STATE)
    longer = dict(raw, train={**raw["train"], "max_steps": 26})
    with pytest.raises(ConfigError, match=r"cannot resume: the batch planner .* changed since the checkpoint "
                                          r"\(None -> attnmt-plan-2 .*--allow-data-change") as e:
        TrainingRun(config_from_dict(longer), tmp_path / "run", resume=True, progress=False)
    assert "\n" not in str(e.value)


def test_resume_from_a_prepared_directory_notices_a_new_one(tmp_path):
    raw = copy_task_config(tmp_path, max_steps=2, valid_every=2, average_last=0)
    prepare(config_from_dict(raw), tmp_path / "prepared")
    prepared = dict(raw, data={"prepared": str(tmp_path / "prepared")})
    train(config_from_dict(prepared), tmp_path / "run", progress=False)
    raw["data"]["max_len"] = 3  # another corpus at the same path
    prepare(config_from_dict(raw), tmp_path / "prepared", replace=True)
    prepared["train"] = {**prepared["train"], "max_steps": 3}
    with pytest.raises(ConfigError, match=r"prepared training data \(fingerprint\) changed"):
        train(config_from_dict(prepared), tmp_path / "run", resume=True, progress=False)


def test_kill_9_and_resume_is_bit_exact(tmp_path):
    """SIGKILL at random moments (preparation, updates, validations), then --resume, until the
    run finishes: the same weights, optimizer state and log as without interruption."""
    raw = copy_task_config(tmp_path, max_steps=40, valid_every=5, log_every=5, average_last=2)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))

    def command(run, resume):
        return [sys.executable, "-m", "attnmt", "-q", "train", str(tmp_path / "c.yaml"), "--output", str(run)] + (
            ["--resume"] if resume else [])

    t0 = time.monotonic()
    subprocess.run(command(tmp_path / "straight", False), check=True, capture_output=True, timeout=300)
    duration, rng, kills = time.monotonic() - t0, random.Random(3), 0
    run = tmp_path / "killed"
    for _ in range(4):
        proc = subprocess.Popen(command(run, run.exists()), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            proc.wait(timeout=rng.uniform(0.3, 1.0) * duration)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            continue
        assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
        break
    subprocess.run(command(run, run.exists()), check=True, capture_output=True, timeout=300)
    assert kills >= 2
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["progress"]["step"] == b["progress"]["step"] == 40 and a["data"] == b["data"]
    timing = {"seconds", "tgt_tokens_per_s", "peak_rss_mib", "minutes", "tgt_tokens_per_second"}
    strip = lambda rs: [{k: v for k, v in r.items() if k not in timing} for r in rs]  # noqa: E731
    log_a = [json.loads(line) for line in (tmp_path / "straight" / "train_log.jsonl").read_text().splitlines()]
    log_b = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert strip(log_a) == strip(log_b)
