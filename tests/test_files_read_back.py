"""What attnmt reads back, it checks: every kind of file attnmt writes and reads again (a model
directory's files, named in ``attnmt.rundir``; a training run's checkpoints and log; a prepared
directory's manifest and shards, named in ``attnmt.data.shards``; the exports for other engines),
cut to half, emptied, or with a byte flipped, is refused by the command that reads it with one
line naming the file, exit 2, never a traceback. Where attnmt recorded the file's hash or size
when it wrote it (:data:`RECORDED`), a changed file is refused rather than used. The kinds are
listed from the code (:func:`file_kinds`), so a new kind fails
:func:`test_every_kind_of_file_has_a_reader` until it has a case here."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from attnmt import rundir
from attnmt.autoprecision import Choice
from attnmt.train.calibration import keep_choice
from tests.test_hardening import run_cli

# The file name constants of attnmt.rundir that name no file of their own here, and why.
NOT_WRITTEN_HERE = {
    "VOCAB": "an imported MarianMT model's vocabulary: checked in tests/test_interop_marian.py",
    "SRC_SPM": "a model with two SentencePiece models: read by the same Tokenizer.load as spm.model",
    "TGT_SPM": "a model with two SentencePiece models: read by the same Tokenizer.load as spm.model",
    "SRC_WORDS": "a word vocabulary: its fields are checked in tests/test_concepts_data.py",
    "TGT_WORDS": "a word vocabulary: its fields are checked in tests/test_concepts_data.py",
}

# kind -> (the file under the work copy, the command reading it: argv with {W} for the work folder)
TRANSLATE = ["translate", "--model", "{W}/run", "--input", "{W}/in.txt", "--output", "{W}/out.txt"]
RESUME = ["train", "{W}/run/config.yaml", "--output", "{W}/run", "--resume", "--set", "train.max_steps=16"]
RESUME_AUTO = [*RESUME, "--set", "train.precision=auto"]  # a run of precision auto reads back what it chose
KINDS = {
    "CONFIG": ("run/config.yaml", TRANSLATE),
    "JOINT_SPM": ("run/spm.model", TRANSLATE),
    "WEIGHTS": ("run/model.safetensors", TRANSLATE),
    "PRECISION_CHOICE": ("run/precision.json", RESUME_AUTO),
    "checkpoint state": ("run/checkpoints/last.pt", RESUME),
    "checkpoint weights": ("run/checkpoints/step_12.safetensors", RESUME),
    "training log": ("run/train_log.jsonl", ["plot-training", "{W}/run", "--output", "{W}/curves.png"]),
    "manifest": ("run/data/manifest.json", RESUME),
    "shard tokens": ("run/data/train.00000.src.bin", RESUME),
    "shard offsets": ("run/data/train.00000.tgt.idx.npy", RESUME),
    "shard lengths": ("run/data/train.00000.len.npy", RESUME),
    "CTRANSLATE2_MODEL": ("ct2/model.bin", ["translate", "--model", "{W}/ct2", "--engine", "ctranslate2", "--input",
                                           "{W}/in.txt", "--output", "{W}/out.txt", "--early-stopping", "true"]),
    "ONNX_ENCODER": ("onnx/encoder.onnx", ["translate", "--model", "{W}/onnx", "--engine", "onnxruntime", "--input",
                                          "{W}/in.txt", "--output", "{W}/out.txt"]),
    "ONNX_DECODER_STEP": ("onnx/decoder_step.onnx", ["translate", "--model", "{W}/onnx", "--engine", "onnxruntime",
                                                    "--input", "{W}/in.txt", "--output", "{W}/out.txt"]),
}

# kinds whose hash or size attnmt records when it writes them: a flipped byte is refused too
RECORDED = {"WEIGHTS", "checkpoint weights", "manifest", "shard offsets", "shard lengths"}


# kinds appended record by record, where a torn last record is what a crash leaves: read without it
TORN_TAIL_SKIPPED = {"training log"}


def file_kinds() -> set[str]:
    """The file names of ``attnmt.rundir`` (its upper-case string constants naming a file), and
    the kinds of a training run and a prepared directory."""
    names = {name for name, value in vars(rundir).items()
             if re.fullmatch(r"[A-Z0-9_]+", name) and isinstance(value, str) and "." in value}
    return names | {"checkpoint state", "checkpoint weights", "training log", "manifest", "shard tokens",
                    "shard offsets", "shard lengths"}


def test_every_kind_of_file_has_a_reader():
    assert {"CONFIG", "WEIGHTS", "JOINT_SPM", "CTRANSLATE2_MODEL", "ONNX_ENCODER"} <= file_kinds()
    assert set(KINDS) | set(NOT_WRITTEN_HERE) == file_kinds()


@pytest.fixture(scope="module")
def originals(tiny_run, tmp_path_factory) -> Path:
    """The tiny run and its two exports, made once."""
    pytest.importorskip("ctranslate2")
    pytest.importorskip("onnxruntime")
    root = tmp_path_factory.mktemp("originals")
    shutil.copytree(tiny_run, root / "run")
    # what a run of precision auto keeps of its choice (the tiny run trained at fp32: the choice it would keep)
    keep_choice(root / "run", Choice("fp32", {"fp32": 1000.0, "bf16": 900.0}))
    for fmt, folder in (("ctranslate2", "ct2"), ("onnx", "onnx")):
        assert run_cli_plain("export", fmt, "--model", str(tiny_run), "--output", str(root / folder)) == 0
    (root / "in.txt").write_text("alpha bravo\ncharlie delta\n")
    return root


def run_cli_plain(*argv: str) -> int:
    from attnmt.cli import main

    return main(["-q", *argv])


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # a flipped byte, three quarters in: past any header, in the data
        at = len(data) * 3 // 4
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1:])


@pytest.mark.parametrize("how", ["empty", "truncated", "flipped"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_damaged_file_is_one_line_naming_it(kind, how, originals, tmp_path, capsys):
    work = tmp_path / "w"
    shutil.copytree(originals, work)
    name, argv = KINDS[kind]
    corrupt(work / name, how)
    rc, _, err = run_cli(capsys, *[a.replace("{W}", str(work)) for a in argv])
    assert "Traceback" not in err, err
    if rc == 0:  # read without noticing: only where attnmt kept no record of the file, and the bytes still parse
        assert (how == "flipped" and kind not in RECORDED) or (how == "truncated" and kind in TORN_TAIL_SKIPPED), (
            kind, how, err)
        return
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "error:" in lines[0], (rc, err)
    assert Path(name).name in lines[0], err
