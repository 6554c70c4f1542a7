"""Sequence-level knowledge distillation (Kim and Rush, 2016): a student trained on a teacher's translations.

``attnmt distill STUDENT_CONFIG --teacher TEACHER_DIR --output RUN_DIR`` runs two stages:

1. The teacher translates the source side of the student configuration's training corpus into
   ``RUN_DIR/distill/train.tgt``, line N the translation of source line N (its beam output, which
   Kim and Rush found worth most: the student learns the teacher's mode, not the data's spread).
2. The student (STUDENT_CONFIG's model and training) trains on (source, teacher translation)
   pairs, optionally mixed with the original targets (``mix_original``: their weight in
   ``data.train``), validated on the configuration's own validation set.

Both stages resume. Translations are written in chunks of :data:`CHUNK_LINES` lines, each into its
own file under ``distill/parts/``, written to a temporary name and renamed into place once the
chunk is complete; a rerun skips the finished chunks, so after any interruption (``kill -9``
included) no finished line is translated again. A chunk always holds the same lines and is
translated in one call, so the distilled corpus equals an uninterrupted run's. Once every chunk is
done they are joined into ``train.tgt`` (atomically) and removed. ``distill/manifest.json`` records
the teacher (its weights' SHA-256), its decoding settings and the source file's SHA-256; a rerun
with another teacher, other settings or another source is refused, naming the field. Training then
resumes from ``RUN_DIR/checkpoints/last.pt`` where an earlier run left one.

Shapes: none; text lines in, text lines out (UTF-8, one sentence a line).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

from tqdm import tqdm

from attnmt import rundir
from attnmt.atomic import atomic_write
from attnmt.config import Config, config_from_dict
from attnmt.data.corpus import sha256_file
from attnmt.data.sources import training_corpora, validation_sets
from attnmt.data.text import iter_lines
from attnmt.errors import ConfigError
from attnmt.signals import stop_point
from attnmt.train.checkpoint import LAST_STATE
from attnmt.train.loop import train
from attnmt.train.report import TrainResult
from attnmt.train.setup import run_config

log = logging.getLogger(__name__)

DISTILL_DIR = "distill"
DISTILLED = "train.tgt"
MANIFEST = "manifest.json"
CHUNK_LINES = 2000  # lines per resumable unit: the most a kill can cost, and one translate call


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    while chunk := list(islice(lines, size)):
        yield chunk


def _flat(record: dict, prefix: str = "") -> dict:
    """``record`` with nested dicts flattened into dotted keys ('decode.beam_size')."""
    out = {}
    for key, value in record.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def _check_manifest(path: Path, record: dict) -> None:
    """Write ``record`` as the distillation's manifest, or check it against the one an earlier run wrote.

    Raises:
        ConfigError: an earlier run distilled with another teacher, settings or source (names the field).
    """
    if path.is_file():
        before, now = _flat(json.loads(path.read_text(encoding="utf-8"))), _flat(record)
        changed = [key for key in sorted(now.keys() | before.keys()) if before.get(key) != now.get(key)]
        if changed:
            key = changed[0]
            raise ConfigError(f"{path}: this run directory was distilled with {key} {before.get(key)!r}, not "
                              f"{now.get(key)!r}; use a new --output, or the same teacher and settings to resume")
        return
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=1), encoding="utf-8"))


def distill_corpus(source: Path, translate: Callable[[list[str]], list[str]], out_dir: Path, record: dict,
                   progress: bool = True, chunk_lines: int = CHUNK_LINES, max_lines: int | None = None) -> Path:
    """Translate every line of ``source`` with ``translate`` into ``out_dir/train.tgt``, resumably
    (module docstring).

    Args:
        source: the training source file (plain or gzip, UTF-8).
        translate: lines in, their translations out (same count, same order), e.g. the
            ``text`` of each result of ``Translator.translate``.
        out_dir: ``RUN_DIR/distill``.
        record: what the translations depend on (teacher, settings); with the source's SHA-256 it
            is the manifest a rerun must match.
        chunk_lines: lines per chunk (the resumable unit, translated in one call).
        max_lines: translate only the first N lines (a corpus' ``max_pairs``); None: all.
    Returns:
        ``out_dir/train.tgt``.
    Raises:
        ConfigError: the manifest differs from an earlier run's (:func:`_check_manifest`).
        DataError: the source cannot be read.
        RuntimeError: ``translate`` returned another number of lines than it was given.
    """
    distilled = out_dir / DISTILLED
    _check_manifest(out_dir / MANIFEST, {**record, "source": str(source), "source_sha256": sha256_file(source),
                                         "source_lines": max_lines, "chunk_lines": chunk_lines})  # the first write
    if distilled.is_file():
        log.info("%s: already distilled", distilled)
        return distilled
    parts = out_dir / "parts"
    parts.mkdir(exist_ok=True)
    done = {p.name for p in parts.glob("*.tgt")}
    names = []  # the chunk files, in order
    fresh = 0  # lines translated by this call
    total = 0  # lines of the source read
    with tqdm(unit=" lines", desc="distilling", disable=None if progress else True) as bar:
        for index, chunk in enumerate(_chunks(islice(iter_lines(source), max_lines), chunk_lines)):
            stop_point()  # a stop signal (attnmt.signals): the finished chunks stay for a rerun
            name = f"{index:08d}.tgt"
            names.append(name)
            if name not in done:
                out = translate(chunk)
                if len(out) != len(chunk):
                    raise RuntimeError(f"the teacher gave {len(out)} translations for {len(chunk)} lines")
                text = "".join(line.replace("\n", " ").replace("\r", " ") + "\n" for line in out)
                atomic_write(parts / name, lambda tmp, text=text: Path(tmp).write_text(text, encoding="utf-8"))
                fresh += len(chunk)
            total += len(chunk)
            bar.update(len(chunk))  # counts nothing when the bar is disabled (not a terminal)
    log.info("distilled %d lines (%d translated now, %d by an earlier run)", total, fresh, total - fresh)

    def join(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for name in names:
                f.write((parts / name).read_text(encoding="utf-8"))

    atomic_write(distilled, join)
    shutil.rmtree(parts)  # the chunks, and any temporary file a killed run left half-written
    return distilled


def student_config(config: Config, source: Path, distilled: Path, original: Path | None, mix_original: float,
                   data_dir: str | None = None, max_pairs: int | None = None,
                   languages: tuple[str | None, str | None] = (None, None)) -> Config:
    """The student configuration training on the distilled corpus: ``config`` with its data section
    naming ``source`` and ``distilled`` (and, with ``mix_original`` > 0, the original targets with
    that weight) and its validation files, the rest unchanged; ``max_pairs`` and ``languages``
    (source, target) are those of the corpus distilled.

    Raises:
        ConfigError: the result does not validate (e.g. a weight out of range).
    """
    raw = config.model_dump(mode="json")
    data = raw["data"]
    valid = validation_sets(config, data_dir)
    for key in ("dataset", "data_dir", "train_src", "train_tgt", "train", "valid_src", "valid_tgt"):
        data[key] = None
    if mix_original > 0 or max_pairs is not None or (data["pair"] is None and None not in languages):
        # data.train entries: the first max_pairs lines of source (those translated), the corpus' languages
        data["train"] = [{"src": str(source), "tgt": str(tgt), "weight": weight, "max_pairs": max_pairs,
                          "src_lang": languages[0], "tgt_lang": languages[1]}
                         for tgt, weight in ((distilled, 1.0), (original, mix_original)) if weight > 0]
    else:
        data["train_src"], data["train_tgt"] = str(source), str(distilled)
    if valid:
        data["valid_src"], data["valid_tgt"] = str(valid[0].src), str(valid[0].tgt)
    return config_from_dict(raw, origin="the student configuration")


def distill(config: Config, run_dir: str | Path, translate: Callable[[list[str]], list[str]], record: dict,
            mix_original: float = 0.0, data_dir: str | None = None, progress: bool = True) -> TrainResult:
    """Distil a teacher into the student of ``config``: translate its training source into
    ``run_dir/distill/train.tgt`` (:func:`distill_corpus`), then train the student on it
    (:func:`student_config`), resuming either stage where an earlier run stopped.

    Every check of the input (these, the student's configuration, an earlier run's manifest)
    comes before the first file is written.

    Raises:
        ConfigError: ``config`` names no single training corpus (a prepared directory, or several
            corpora in ``data.train``), ``mix_original`` is negative, the student's configuration
            is refused (``attnmt.train.setup.run_config``), or an earlier run distilled with
            other settings.
    """
    if mix_original < 0:
        raise ConfigError(f"distill: --mix-original {mix_original:g}: the original targets' weight must be >= 0")
    if config.data is None or config.data.prepared is not None:
        raise ConfigError("distill: the student configuration must name its training text (data.dataset, "
                          "data.train_src/train_tgt), not a prepared directory")
    corpora = training_corpora(config, data_dir)
    if len(corpora) != 1:
        raise ConfigError(f"distill: the student configuration names {len(corpora)} training corpora in "
                          "data.train; give one (data.train_src/train_tgt or a dataset)")
    run_dir = Path(run_dir)
    student = student_config(config, corpora[0].src, run_dir / DISTILL_DIR / DISTILLED, corpora[0].tgt, mix_original,
                             data_dir, corpora[0].max_pairs, (corpora[0].src_lang, corpora[0].tgt_lang))
    run_config(student)  # the student's configuration refused before the teacher translates a line
    distill_corpus(corpora[0].src, translate, run_dir / DISTILL_DIR, record, progress, max_lines=corpora[0].max_pairs)
    resume = (run_dir / LAST_STATE).exists()
    if resume:
        log.info("resuming the student's training in %s", run_dir)
    return train(student, run_dir, resume=resume, data_dir=data_dir, progress=progress)


def teacher_record(teacher_dir: str | Path, engine: str, decode: dict, tgt_lang: str | None = None) -> dict:
    """What a distilled corpus depends on: the teacher directory, its weights' SHA-256, the engine,
    the decoding settings (``decode``: a ``DecodeConfig`` dump) and the target language asked of the
    teacher (the student's; None where its configuration names none)."""
    teacher_dir = Path(teacher_dir)
    weights = next((teacher_dir / name for name in (rundir.WEIGHTS, rundir.CTRANSLATE2_MODEL, rundir.ONNX_ENCODER)
                    if (teacher_dir / name).is_file()), None)
    return {"teacher": str(teacher_dir.resolve()), "teacher_sha256": sha256_file(weights) if weights else None,
            "engine": engine, "decode": decode, "tgt_lang": tgt_lang}
