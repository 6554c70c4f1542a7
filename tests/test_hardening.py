"""Hostile use: one-line errors for user mistakes, finite training, exact resume in every case,
atomic writes under a full disk, bounded memory for huge lines (issue: harden)."""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnmt import cli, rundir
from attnmt.config import config_from_dict
from attnmt.data.text import MAX_LINE_CHARS, decode_lines
from attnmt.decode.output import format_translations
from attnmt.decode.translator import Translator
from attnmt.errors import ConfigError, DataError, TrainingError, WriteError
from attnmt.search.beam import beam_search
from attnmt.search.options import SearchOptions
from attnmt.search.greedy import greedy_search
from attnmt.train import checkpoint as checkpoint_module
from attnmt.train import setup as train_setup
from attnmt.train.checkpoint import Checkpoints
from attnmt.train.metrics import MetricsLog, read_log
from attnmt.train.loop import TrainingRun, train
from attnmt.train import trainer as trainer_mod
from attnmt.train.trainer import Trainer
from tests.conftest import copy_task_config, tiny_model

TIMING_KEYS = {"seconds", "tgt_tokens_per_s", "peak_rss_mib", "minutes", "tgt_tokens_per_second"}


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """``attnmt -q ARGS`` in this process: (exit status, stdout, stderr)."""
    try:
        rc = cli.main(["-q", *args])
    except SystemExit as e:  # argparse
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, *needles: str, status: int = 2) -> None:
    """One line on stderr naming each of ``needles``, no traceback, exit ``status`` (2: the
    user's input; 1: the environment, ``attnmt.errors.EnvironmentFailure``)."""
    lines = err.strip().splitlines()
    assert rc == status and len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, err)


def strict_json(line: str):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(line, parse_constant=refuse)


def log_records(run_dir: Path) -> list[dict]:
    """The run's log records without wall-clock numbers (strict JSON, no torn line)."""
    text = (run_dir / "train_log.jsonl").read_text()
    assert text.endswith("\n")
    return [{k: v for k, v in strict_json(line).items() if k not in TIMING_KEYS} for line in text.splitlines()]


def model_state(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


def assert_same_run(a: Path, b: Path) -> None:
    """Same weights (last state and model.safetensors), same log records, same step files."""
    sa, sb = model_state(a), model_state(b)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    ma, mb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    assert log_records(a) == log_records(b)
    assert sorted(p.name for p in (a / "checkpoints").iterdir()) == sorted(p.name for p in (b / "checkpoints").iterdir())


# ---- configuration: finite, positive ----------------------------------------------------------


@pytest.mark.parametrize("override, key", [
    ("train.lr_factor=.inf", "train.lr_factor"), ("train.lr=.nan", "train.lr"),
    ("decode.length_penalty=.nan", "decode.length_penalty"), ("train.adam_eps=0", "train.adam_eps"),
    ("train.adam_betas=[0.9, 1.0]", "train.adam_betas"), ("train.max_nonfinite_updates=0", "max_nonfinite_updates"),
    ("model.max_positions=50", "max_positions"),
])
def test_config_values_must_be_finite_and_meaningful(tmp_path, override, key):
    from attnmt.config import apply_overrides

    raw = apply_overrides(copy_task_config(tmp_path), [override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_from_dict(raw)


def test_max_nonfinite_updates_option(tmp_path):
    raw = copy_task_config(tmp_path)
    assert config_from_dict(raw).train.max_nonfinite_updates == 5  # the default: a few
    raw["train"]["max_nonfinite_updates"] = 2
    assert config_from_dict(raw).train.max_nonfinite_updates == 2


# ---- every user mistake: one line, exit 2 -------------------------------------------------------


@pytest.fixture(scope="module")
def broken_models(tiny_run, tmp_path_factory) -> dict[str, Path]:
    """Copies of the tiny model directory, each with one file broken."""
    root = tmp_path_factory.mktemp("broken")

    def variant(name, edit):
        d = root / name
        shutil.copytree(tiny_run, d, ignore=shutil.ignore_patterns("checkpoints"))
        edit(d)
        return d

    weights = (tiny_run / "model.safetensors").read_bytes()
    return {
        "truncated": variant("truncated", lambda d: (d / "model.safetensors").write_bytes(weights[: len(weights) // 2])),
        "empty": variant("empty", lambda d: (d / "model.safetensors").write_bytes(b"")),
        "no_weights": variant("no_weights", lambda d: (d / "model.safetensors").unlink()),
        "bad_yaml": variant("bad_yaml", lambda d: (d / "config.yaml").write_text("model: [\n  d_model: 3\n")),
        "no_spm": variant("no_spm", lambda d: (d / "spm.model").unlink()),
        "bad_spm": variant("bad_spm", lambda d: (d / "spm.model").write_bytes(b"not a model" * 9)),
        "other_size": variant("other_size", lambda d: (d / "config.yaml").write_text(
            (d / "config.yaml").read_text().replace("d_model: 16", "d_model: 32"))),
    }


def test_cli_user_mistakes_are_one_line(tiny_run, broken_models, tmp_path, capsys):
    two = tmp_path / "two.txt"
    two.write_text("alpha bravo\ncharlie\n")
    (tmp_path / "one.txt").write_text("alpha\n")
    (tmp_path / "empty").write_text("")
    flipped = bytearray(gzip.compress(b"alpha bravo\n" * 500))
    flipped[len(flipped) // 2] ^= 0xFF
    (tmp_path / "flipped.gz").write_bytes(bytes(flipped))
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "train_log.jsonl").write_text('{"kind": "train", "step": 1}\nGARBAGE\n{"kind": "x"}\n')
    m, inp, missing_dir = str(tiny_run), ["--input", str(two)], str(tmp_path / "missing" / "out")
    cases = [  # (arguments, words the message must contain)
        (["translate", "--model", m, "--batch-size", "-1", *inp], ["--batch-size", "out of range"]),
        (["translate", "--model", m, "--beam-size", "0", *inp], ["--beam-size"]),
        (["translate", "--model", m, "--nbest", "0", *inp], ["--nbest"]),
        (["translate", "--model", m, "--length-penalty", "nan", *inp], ["finite"]),
        (["translate", "--model", m, "--threads", "0", *inp], ["--threads"]),
        (["translate", "--model", m, "--nbest", "4", "--beam-size", "2", *inp], ["nbest"]),
        (["translate", "--model", m, *inp, "--output", missing_dir], ["--output", "does not exist"]),
        (["translate", "--model", m, *inp, "--output", str(tmp_path)], ["is a directory"]),
        (["translate", "--model", m, "--input", str(tmp_path / "flipped.gz")], ["flipped.gz", "corrupt gzip"]),
        (["translate", "--model", m, "--weights", str(tiny_run / "checkpoints" / "last.pt"), *inp], ["last.pt"]),
        (["score", "--model", m, "--src", str(two), "--tgt", str(tmp_path / "one.txt")], ["line-aligned"]),
        (["score", "--model", m, "--src", str(two), "--tgt", str(two), "--output", missing_dir], ["--output"]),
        (["evaluate", "--model", m, "--src", str(two), "--ref", str(two), "--hyp-output", missing_dir],
         ["--hyp-output"]),
        (["plot-attention", "--model", m, "alpha", "--output", missing_dir], ["--output"]),
        (["plot-attention", "--model", m, "--input", str(two), "--output", str(two)], ["not a directory"]),
        (["plot-attention", "--model", m, "alpha", "--output", str(tmp_path / "a.png"), "--layer", "0"], ["--layer"]),
        (["plot-training", str(tiny_run), "--output", missing_dir], ["--output"]),
        (["evaluate", "--model", m, "--src", str(tmp_path / "empty"), "--ref", str(tmp_path / "empty")],
         ["no sentences"]),
        (["plot-training", str(tmp_path / "torn")], ["train_log.jsonl:2"]),
        (["train", str(tiny_run / "config.yaml"), "--output", str(two / "run")], ["--output"]),
        (["train", str(tiny_run / "config.yaml"), "--output", str(tmp_path / "r"), "--set", "train.lr=.inf"],
         ["train.lr", "finite"]),
        (["train", str(tmp_path), "--output", str(tmp_path / "r")], [str(tmp_path)]),
        (["train", str(tmp_path / "flipped.gz"), "--output", str(tmp_path / "r")], ["flipped.gz", "UTF-8"]),
    ]
    for name, needles in (("truncated", ["model.safetensors", "truncated"]), ("empty", ["model.safetensors"]),
                          ("no_weights", ["model.safetensors"]), ("bad_yaml", ["config.yaml:3", "YAML syntax"]),
                          ("no_spm", ["no tokenizer", "spm.model"]), ("bad_spm", ["spm.model"]),
                          ("other_size", ["config.yaml", "model.d_model is 32", "model.safetensors"])):
        cases.append((["translate", "--model", str(broken_models[name]), *inp], needles))
    for args, needles in cases:
        rc, out, err = run_cli(capsys, *args)
        assert_one_line_error(rc, err, *needles)
        assert out == ""
    assert not (tmp_path / "missing").exists() and not (tmp_path / "r").exists()


def test_bad_training_data_is_named_before_any_work(tmp_path):
    raw = copy_task_config(tmp_path)
    flipped = bytearray(gzip.compress((tmp_path / "train.src").read_bytes()))
    flipped[len(flipped) // 2] ^= 0xFF
    (tmp_path / "flipped.gz").write_bytes(bytes(flipped))
    (tmp_path / "empty").write_text("")
    cases = [
        ({"train_src": str(tmp_path / "flipped.gz")}, "corrupt gzip"),
        ({"train_src": str(tmp_path / "empty"), "train_tgt": str(tmp_path / "empty")}, "no training pair"),
        ({"valid_tgt": str(tmp_path / "missing.tgt")}, "missing.tgt: no such file"),
    ]
    for data, message in cases:
        bad = copy_task_config(tmp_path)
        bad["data"].update(data)
        with pytest.raises(DataError, match=message):
            TrainingRun(config_from_dict(bad), tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()  # nothing left in --output (no SentencePiece model)
    assert raw  # the good configuration stays usable


# ---- finite training ----------------------------------------------------------------------------


def test_nonfinite_updates_are_skipped_counted_and_stop_training(tmp_path, caplog, monkeypatch):
    raw = copy_task_config(tmp_path, schedule="noam", clip_norm=None, max_nonfinite_updates=3)
    del raw["train"]["lr"]  # noam's rate is lr_factor's (train.lr applies to the other schedules)
    # a rate of 1e30 (train.lr_factor's range stops at 100) blows the weights up to non-finite updates
    monkeypatch.setattr(trainer_mod, "learning_rate", lambda *args, **kwargs: 1e30)
    with caplog.at_level(logging.WARNING), pytest.raises(TrainingError, match="3 updates in a row"):
        train(config_from_dict(raw), tmp_path / "run", progress=False)
    records = read_log(tmp_path / "run" / "train_log.jsonl")
    skipped = [r for r in records if r["kind"] == "nonfinite"]
    assert [r["in_a_row"] for r in skipped] == [1, 2, 3] and [r["total"] for r in skipped] == [1, 2, 3]
    assert sum("update skipped" in r.message for r in caplog.records) == 3
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["model"].values())  # the last finite state
    assert state["progress"]["step"] == skipped[0]["step"] and state["progress"]["nonfinite_total"] == 3
    assert not (tmp_path / "run" / "model.safetensors").exists()  # no validation of a broken model
    resumed = TrainingRun(config_from_dict(raw), tmp_path / "run", resume=True, progress=False)
    assert resumed.progress.step == state["progress"]["step"]  # resumable


def test_nonfinite_validation_or_weights_are_never_best(tiny_run, tmp_path):
    shutil.copytree(tiny_run, tmp_path / "run")
    config = config_from_dict(copy_task_config(tmp_path))
    training = TrainingRun(config, tmp_path / "run", resume=True, progress=False)
    before = (tmp_path / "run" / "model.safetensors").read_bytes()
    training.progress.best_key = (-float("inf"), -float("inf"))
    nan = {"valid_loss": float("nan"), "valid_ppl": float("nan"), "valid_bleu": 50.0, "valid_chrf": 50.0}
    assert not training.checkpoints.keep_if_best(nan, {})
    good = {"valid_loss": 1.0, "valid_ppl": 2.0, "valid_bleu": 50.0, "valid_chrf": 50.0}
    with torch.no_grad():
        training.trainer.params[0].fill_(float("nan"))
    assert not training.checkpoints.keep_if_best(good, {})
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before


@pytest.fixture(scope="module")
def nan_model_dir(tiny_run, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("nan") / "model"
    shutil.copytree(tiny_run, d, ignore=shutil.ignore_patterns("checkpoints"))
    weights = {k: torch.full_like(v, float("nan")) for k, v in load_file(str(d / "model.safetensors")).items()}
    save_file(weights, str(d / "model.safetensors"))
    return d


def test_search_never_returns_zero_hypotheses():
    model = tiny_model(vocab=40)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    src = torch.tensor([[5, 6, 7, 3], [8, 3, 0, 0]])
    for nbest in (1, 3):
        hyps = beam_search(model, src, SearchOptions(beam_size=3, nbest=nbest))
        assert [len(h) for h in hyps] == [nbest, nbest]
    assert len(greedy_search(model, src)) == 2


def test_nan_model_output_keeps_lines_and_json_is_strict(nan_model_dir, capsys, tmp_path):
    (tmp_path / "in").write_text("alpha bravo\ncharlie\n\n")
    m = ["--model", str(nan_model_dir), "--input", str(tmp_path / "in")]
    rc, out, _ = run_cli(capsys, "translate", *m)
    assert rc == 0 and len(out.split("\n")) == 4
    rc, out, _ = run_cli(capsys, "translate", *m, "--beam-size", "3", "--nbest", "2", "--scores")
    assert rc == 0 and [line.split(" ||| ")[0] for line in out.splitlines()] == ["0", "0", "1", "1", "2", "2"]
    rc, out, _ = run_cli(capsys, "translate", *m, "--beam-size", "3", "--nbest", "2", "--format", "jsonl")
    rows = [strict_json(line) for line in out.splitlines()]
    assert rc == 0 and [len(r["hypotheses"]) for r in rows] == [2, 2, 2]
    assert rows[0]["hypotheses"][0]["score"] is None
    rc, out, _ = run_cli(capsys, "score", "--model", str(nan_model_dir), "--src", str(tmp_path / "in"), "--tgt",
                         str(tmp_path / "in"), "--format", "jsonl")
    assert rc == 0 and [strict_json(line)["perplexity"] for line in out.splitlines()] == [None] * 4


# ---- exact resume -------------------------------------------------------------------------------


class Killed(BaseException):
    """Stands for SIGKILL: not an Exception, so no handler in attnmt runs."""


def test_resuming_a_finished_run_does_nothing(tiny_run, tmp_path, caplog):
    shutil.copytree(tiny_run, tmp_path / "run")
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with caplog.at_level(logging.INFO):
        result = train(config_from_dict(copy_task_config(tmp_path)), tmp_path / "run", resume=True, progress=False)
    assert result.steps == 12 and any("already finished" in r.message for r in caplog.records)
    after = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert {p: b for p, b in after.items() if p.name != "config.yaml"} == \
        {p: b for p, b in before.items() if p.name != "config.yaml"}
    assert sum(r["kind"] == "done" for r in log_records(tmp_path / "run")) == 1


def _kill_at_step(step):
    original = Trainer.train_step

    def train_step(self, batches, *args):
        if self.progress.step == step:
            raise Killed
        return original(self, batches, *args)
    return Trainer, "train_step", train_step


def _kill_in_final_validation():
    original = Trainer.evaluate

    def evaluate(self):
        if self.progress.stop_reason is not None:
            raise Killed
        return original(self)
    return Trainer, "evaluate", evaluate


def _kill_in_averaging():
    def average_checkpoints(self):
        raise Killed
    return TrainingRun, "average_checkpoints", average_checkpoints


def _kill_before_the_last_save():
    original = Checkpoints.save

    def save(self, log_bytes):
        if self.trainer.progress.finished:
            raise Killed
        return original(self, log_bytes)
    return Checkpoints, "save", save


@pytest.mark.parametrize("kill", ["mid_training", "final_validation", "averaging", "last_save"])
def test_resume_after_a_kill_finishes_like_an_uninterrupted_run(tiny_run, tmp_path, monkeypatch, kill):
    owner, name, replacement = {"mid_training": lambda: _kill_at_step(6), "final_validation": _kill_in_final_validation,
                         "averaging": _kill_in_averaging, "last_save": _kill_before_the_last_save}[kill]()
    config = config_from_dict(copy_task_config(tmp_path))
    with monkeypatch.context() as patch:
        patch.setattr(owner, name, replacement)
        with pytest.raises(Killed):
            train(config, tmp_path / "run", progress=False)
    with open(tmp_path / "run" / "train_log.jsonl", "a") as f:
        f.write('{"kind": "train", "st')  # and a torn line, as a kill while writing leaves
    train(config, tmp_path / "run", resume=True, progress=False)
    assert_same_run(tiny_run, tmp_path / "run")
    steps = [r["step"] for r in log_records(tmp_path / "run") if r["kind"] == "train"]
    assert steps == sorted(set(steps))  # no record twice


def test_a_new_run_never_appends_to_a_stale_log(tiny_run, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "train_log.jsonl").write_text('{"kind": "train", "step": 99}\n{"kind": "tr')
    save_file({"x": torch.zeros(1)}, str(run / "checkpoints" / "step_99.safetensors"))
    train(config_from_dict(copy_task_config(tmp_path)), run, progress=False)  # no last.pt: not a run yet
    assert_same_run(tiny_run, run)


# ---- atomic writes and a full disk --------------------------------------------------------------


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_atomic_write_on_a_full_disk_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "file"
    target.write_text("old")

    def half_then_full(tmp):
        Path(tmp).write_text("ne")
        _enospc()
    with pytest.raises(WriteError, match="No space left on device"):
        rundir.atomic_write(target, half_then_full)
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(WriteError, match="file: cannot write"):
        rundir.atomic_write(target, lambda tmp: Path(tmp).write_text("new"))
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_metrics_log_on_a_full_disk_keeps_whole_records(tmp_path, monkeypatch):
    log = MetricsLog(tmp_path / "log.jsonl")
    log.write("train", step=1, loss=float("nan"))
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(WriteError, match="No space left"):
        log.write("train", step=2, loss=1.0)
    assert (tmp_path / "log.jsonl").read_text() == '{"kind": "train", "step": 1, "loss": null}\n'


def test_full_disk_while_training_loses_nothing(tiny_run, tmp_path, monkeypatch):
    """The disk fills at the second checkpoint: one clear error; the first checkpoint stays
    readable and a resume (disk freed) finishes the run exactly; a full disk while writing
    the SentencePiece model leaves no spm.model."""
    config = config_from_dict(copy_task_config(tmp_path))
    real_save, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) == 2:
            Path(f).write_bytes(b"PK\x03\x04 torn")
            _enospc()
        return real_save(obj, f, *args, **kwargs)
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint_module.torch, "save", save)
        with pytest.raises(WriteError, match=r"last\.pt: cannot write: No space left on device"):
            train(config, tmp_path / "run", progress=False)
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)["progress"]["step"] == 4
    assert not list((tmp_path / "run").rglob("*.tmp"))
    train(config, tmp_path / "run", resume=True, progress=False)
    assert_same_run(tiny_run, tmp_path / "run")
    with monkeypatch.context() as patch:
        patch.setattr(train_setup.rundir.Tokenizer, "save", lambda self, path: _enospc())
        with pytest.raises(WriteError, match="spm.model"):
            TrainingRun(config, tmp_path / "run2", progress=False)
    assert not (tmp_path / "run2" / "spm.model").exists()


def test_cli_full_disk_is_one_line_and_keeps_the_old_output(tiny_run, tmp_path, monkeypatch, capsys):
    (tmp_path / "in").write_text("alpha bravo\n")
    (tmp_path / "out").write_text("previous\n")
    monkeypatch.setattr(os, "fsync", _enospc)
    rc, _, err = run_cli(capsys, "translate", "--model", str(tiny_run), "--input", str(tmp_path / "in"),
                         "--output", str(tmp_path / "out"))
    assert_one_line_error(rc, err, "out", "No space left on device", "free some space", status=1)  # the disk's fault
    assert (tmp_path / "out").read_text() == "previous\n"


# ---- hostile sizes ------------------------------------------------------------------------------


def test_a_10mb_line_is_cut_with_a_warning(tiny_run, tmp_path, capsys, caplog):
    huge = "alpha bravo " * 900_000  # 10.8 MB
    with caplog.at_level(logging.WARNING):
        lines = decode_lines((huge + "\ncharlie\n").encode(), "big.txt")
    assert [len(line) for line in lines] == [MAX_LINE_CHARS, 7]
    assert any("big.txt:1" in r.message and "cut" in r.message for r in caplog.records)
    (tmp_path / "big.txt").write_text(huge + "\ncharlie\n")
    rc, out, _ = run_cli(capsys, "translate", "--model", str(tiny_run), "--beam-size", "2", "--input",
                         str(tmp_path / "big.txt"))
    assert rc == 0 and len(out.split("\n")) == 3


def test_training_data_with_a_10mb_line(tmp_path):
    raw = copy_task_config(tmp_path, max_steps=1)
    with open(tmp_path / "train.src", "a") as f:
        f.write("alpha " * 1_800_000 + "\n")
    with open(tmp_path / "train.tgt", "a") as f:
        f.write("alpha\n")
    training = TrainingRun(config_from_dict(raw), tmp_path / "run", progress=False)
    assert training.data.train.dropped["too_long"] == 1 and len(training.data.train) == 400


def test_translator_output_is_one_line_per_input(tiny_run):
    tr = Translator.from_dir(tiny_run)
    lines = ["alpha\u2028bravo", "charlie\rdelta", "", "\x00\x1b[31m", "\\ud800"]
    out = format_translations(tr.translate(lines, beam_size=2), "text", True, 1)
    assert len("\n".join(out).split("\n")) == len(lines) and all(len(line.splitlines()) == 1 for line in out)
