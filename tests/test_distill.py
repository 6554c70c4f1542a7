"""attnmt distill: the teacher's translations of the student's training source, line-aligned; the
student trained on them; a rerun after an interruption (a crash in-process, and kill -9 of a real
process) translates no finished line again and gives the same distilled corpus."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from attnmt.cli import main
from attnmt.config import config_from_dict
from attnmt.decode.translator import Translator
from attnmt.distill import DISTILL_DIR, DISTILLED, distill, distill_corpus
from attnmt.errors import ConfigError
from tests.conftest import GERMAN_ENGLISH, word_for_word


def _student(tmp_path: Path, train_lines: int = 300, max_steps: int = 6) -> dict:
    """A tiny student on the toy German->English task (the teacher's task)."""
    rng = random.Random(7)
    words = sorted(GERMAN_ENGLISH)
    for name, n in (("train", train_lines), ("valid", 20)):
        src = [" ".join(rng.sample(words, rng.randint(2, 6))) for _ in range(n)]
        (tmp_path / f"{name}.de").write_text("\n".join(src) + "\n", encoding="utf-8")
        (tmp_path / f"{name}.en").write_text("\n".join(map(word_for_word, src)) + "\n", encoding="utf-8")
    return {"data": {"train_src": str(tmp_path / "train.de"), "train_tgt": str(tmp_path / "train.en"),
                     "valid_src": str(tmp_path / "valid.de"), "valid_tgt": str(tmp_path / "valid.en"), "pair": "de-en",
                     "max_len": 60},
            "tokenizer": {"vocab_size": 60, "model_type": "bpe"},
            "model": {"d_model": 16, "num_heads": 2, "d_ff": 32, "num_encoder_layers": 2, "num_decoder_layers": 1,
                      "dropout": 0.0, "share_embeddings": True, "max_positions": 64},
            "train": {"batch_tokens": 400, "schedule": "inverse_sqrt", "lr": 3e-3, "warmup_steps": 5,
                      "max_steps": max_steps, "valid_every": max_steps, "precision": "fp32", "seed": 1,
                      "num_threads": 1}}


def test_distill_translates_the_source_and_trains_the_student(dictionary_model_dir, tmp_path, capsys):
    raw = _student(tmp_path)
    (tmp_path / "student.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    out = tmp_path / "student"
    assert main(["-q", "distill", str(tmp_path / "student.yaml"), "--teacher", str(dictionary_model_dir),
                 "--output", str(out), "--beam-size", "2", "--threads", "1"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["steps"] == 6
    sources = (tmp_path / "train.de").read_text(encoding="utf-8").splitlines()
    distilled = (out / DISTILL_DIR / DISTILLED).read_text(encoding="utf-8").splitlines()
    expected = [r.text for r in Translator.from_dir(dictionary_model_dir).translate(sources, beam_size=2)]
    assert distilled == expected and len(distilled) == 300
    assert sum(d != word_for_word(s) for d, s in zip(distilled, sources)) > 0  # the teacher's, not the references
    student = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    assert student["data"]["train_tgt"] == str(out / DISTILL_DIR / DISTILLED)
    assert student["model"]["num_decoder_layers"] == 1 and (out / "model.safetensors").is_file()
    manifest = json.loads((out / DISTILL_DIR / "manifest.json").read_text())
    assert manifest["decode"]["beam_size"] == 2 and manifest["teacher"] == str(dictionary_model_dir.resolve())
    # the same command again: nothing translated, training already over, same student
    weights = (out / "model.safetensors").read_bytes()
    assert main(["-q", "distill", str(tmp_path / "student.yaml"), "--teacher", str(dictionary_model_dir),
                 "--output", str(out), "--beam-size", "2", "--threads", "1"]) == 0
    assert (out / "model.safetensors").read_bytes() == weights
    # another teacher setting on the same run directory is refused in one line
    assert main(["distill", str(tmp_path / "student.yaml"), "--teacher", str(dictionary_model_dir),
                 "--output", str(out), "--beam-size", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "manifest.json" in err and "decode" in err


def test_mixing_the_original_targets_names_both_corpora(dictionary_model_dir, tmp_path):
    config = config_from_dict(_student(tmp_path, train_lines=60, max_steps=2))
    calls = []

    def translate(lines):
        calls.append(len(lines))
        return [word_for_word(x).upper() for x in lines]

    distill(config, tmp_path / "run", translate, {"teacher": "fake"}, mix_original=0.5, progress=False)
    data = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]
    assert [(e["tgt"], e["weight"]) for e in data["train"]] == [
        (str(tmp_path / "run" / DISTILL_DIR / DISTILLED), 1.0), (str(tmp_path / "train.en"), 0.5)]
    assert sum(calls) == 60
    with pytest.raises(ConfigError, match="must be >= 0"):
        distill(config, tmp_path / "run2", translate, {"teacher": "fake"}, mix_original=-1, progress=False)


class Crash(Exception):
    """The process dying inside the teacher's call."""


def test_a_crash_midway_loses_no_finished_chunk(tmp_path, caplog):
    source = tmp_path / "src.txt"
    source.write_text("".join(f"line {i}\n" for i in range(1050)), encoding="utf-8")
    translated: list[str] = []
    crash = [True]

    def translate(lines):
        translated.extend(lines)
        if crash[0] and len(translated) == 400:  # the second chunk of 200: the process dies inside the call
            raise Crash
        return [x.upper() for x in lines]

    with pytest.raises(Crash):
        distill_corpus(source, translate, tmp_path / "a", {"teacher": "t"}, progress=False, chunk_lines=200)
    assert len(list((tmp_path / "a" / "parts").glob("*.tgt"))) == 1
    translated.clear()
    crash[0] = False
    with caplog.at_level("INFO", logger="attnmt.distill"):
        out = distill_corpus(source, translate, tmp_path / "a", {"teacher": "t"}, progress=False, chunk_lines=200)
    assert "distilled 1050 lines (850 translated now, 200 by an earlier run)" in caplog.text
    assert len(translated) == 1050 - 200 and len(set(translated)) == len(translated)
    assert out.read_text(encoding="utf-8") == source.read_text(encoding="utf-8").upper()
    assert not (tmp_path / "a" / "parts").exists()


KILL_SCRIPT = """
import sys
from attnmt.decode.translator import Translator
from attnmt.distill import distill_corpus
from pathlib import Path
tr = Translator.from_dir(sys.argv[1])
log = open(sys.argv[3], "a")
def translate(lines):
    log.write("".join(x + "\\n" for x in lines)); log.flush()
    return [r.text for r in tr.translate(lines, beam_size=2)]
distill_corpus(Path(sys.argv[2]), translate, Path(sys.argv[4]), {"teacher": sys.argv[1]}, progress=False,
               chunk_lines=int(sys.argv[5]))
"""


def test_kill_9_during_translation_then_rerun(dictionary_model_dir, tmp_path):
    """A real process killed with SIGKILL once two chunks are on disk: the rerun translates only the
    lines of unfinished chunks, and the corpus equals an uninterrupted run's, byte for byte."""
    rng = random.Random(3)
    words = sorted(GERMAN_ENGLISH)
    lines = [" ".join(rng.sample(words, rng.randint(2, 6))) for _ in range(1200)]
    source = tmp_path / "train.de"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out, log, chunk = tmp_path / "killed", tmp_path / "translated.log", 50
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(dictionary_model_dir), str(source), str(log),
                             str(out), str(chunk)], env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list((out / "parts").glob("*.tgt"))) < 2 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = len(list((out / "parts").glob("*.tgt")))
    assert 2 <= finished < len(lines) // chunk and not (out / DISTILLED).exists()
    log.write_text("")
    subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(dictionary_model_dir), str(source), str(log), str(out),
                    str(chunk)], env=env, check=True, timeout=300)
    again = log.read_text(encoding="utf-8").splitlines()
    assert len(again) == len(lines) - finished * chunk  # no finished line translated again
    reference = distill_corpus(source, lambda xs: [r.text for r in Translator.from_dir(dictionary_model_dir)
                                                   .translate(xs, beam_size=2)],
                               tmp_path / "whole", {"teacher": str(dictionary_model_dir)}, progress=False,
                               chunk_lines=chunk)
    assert (out / DISTILLED).read_bytes() == reference.read_bytes()
