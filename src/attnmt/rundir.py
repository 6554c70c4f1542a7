"""A model directory: what translation needs, read and written in one place.

    RUN_DIR/config.yaml        the validated configuration (``attnmt.config.Config``)
    RUN_DIR/spm.model          joint SentencePiece model, or src.spm.model and tgt.spm.model,
                               or the word vocabularies src.vocab.json and tgt.vocab.json
    RUN_DIR/vocab.json         with src.spm.model and tgt.spm.model: the shared vocabulary of an
                               imported MarianMT model (a JSON list, the piece of each id)
    RUN_DIR/model.safetensors  the weights translation uses, with the model section they were
                               trained as in their metadata (:data:`attnmt.weights.ARCHITECTURE`)
    RUN_DIR/sentences/         where sentences start, learned with the tokenizers (optional; for
                               documents: ``attnmt.data.sentence_model``)

An export for another engine keeps config.yaml and the tokenizers and holds, in place of the
weights, CTranslate2's model.bin (:data:`CTRANSLATE2_MODEL`) or the ONNX graphs encoder.onnx
and decoder_step.onnx (:data:`ONNX_ENCODER`, :data:`ONNX_DECODER_STEP`); their names are
written here only, for the exporters, the engines and the checks that tell them apart.

Training adds its resumable state under ``RUN_DIR/checkpoints/`` (``attnmt.train.checkpoint``),
which translation never reads. Every file is written to a temporary name in the same directory
and renamed into place (:func:`attnmt.atomic.atomic_write`), so a crash leaves the old file or the new one,
never a torn one. Loading never executes code from a file: weights are safetensors and YAML is
read with ``yaml.safe_load``. Loading weights refuses a config.yaml whose model section no longer
says what they were trained as (a hand edit such as num_heads 8 -> 4 keeps every weight shape
and would otherwise load as another function): :func:`attnmt.weights.check_architecture`.

Library: safetensors, PyYAML.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from safetensors import SafetensorError, safe_open

from attnmt.atomic import atomic_write
from attnmt.config import Config, canonical_language, config_from_yaml
from attnmt.data import sentence_model
from attnmt.data.tokenizers import Tokenizer, VocabTokenizer, WordTokenizer
from attnmt.errors import CheckpointError, ConfigError
from attnmt.weights import (ARCHITECTURE, DIGEST, INFERENCE_FREE_KEYS, architecture, check_architecture,  # noqa: F401
                            read_weights, tensors_digest)

if TYPE_CHECKING:  # PyTorch is imported by the functions that build or load a model, so that the
    from torch import nn  # engines without it (CTranslate2) read config.yaml and the tokenizers here

    from attnmt.model.transformer import Transformer

CONFIG = "config.yaml"
WEIGHTS = "model.safetensors"
JOINT_SPM, SRC_SPM, TGT_SPM = "spm.model", "src.spm.model", "tgt.spm.model"
SRC_WORDS, TGT_WORDS = "src.vocab.json", "tgt.vocab.json"
VOCAB = "vocab.json"
# The first and last lines :func:`write_config` writes around the YAML (comments to a YAML reader)
CONFIG_FIRST_LINE = "# the configuration of this model, written by attnmt; its last line is '# end'\n"
CONFIG_LAST_LINE = "# end\n"
CTRANSLATE2_MODEL = "model.bin"  # written by CTranslate2's converter (attnmt.interop.ctranslate2)
ONNX_ENCODER = "encoder.onnx"  # the graphs of attnmt.interop.onnx
ONNX_DECODER_STEP = "decoder_step.onnx"
PRECISION_CHOICE = "precision.json"  # a run's train.precision auto: what it chose (attnmt.train.calibration)


def write_config(config: Config, run_dir: str | Path) -> None:
    """Write the validated configuration as ``RUN_DIR/config.yaml``, between the comment lines
    :data:`CONFIG_FIRST_LINE` and :data:`CONFIG_LAST_LINE` (by which :func:`read_config` tells a
    copy cut short)."""
    text = CONFIG_FIRST_LINE + yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False) + CONFIG_LAST_LINE
    atomic_write(Path(run_dir) / CONFIG, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def read_config(run_dir: str | Path) -> Config:
    """The validated ``config.yaml`` of a model directory.

    Raises:
        CheckpointError: the directory or its config.yaml is missing or unreadable, or cut short
            (no final newline, or written by :func:`write_config` and without its last line).
        ConfigError: config.yaml is not YAML (with its line) or does not validate.
    """
    path = Path(run_dir) / CONFIG
    if not Path(run_dir).is_dir():
        what = "not a directory" if Path(run_dir).exists() else "no such model directory"
        raise CheckpointError(f"{run_dir}: {what}")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; is {run_dir} a model directory made by 'attnmt train'?")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: unreadable: {e}") from None
    cut_short = text.startswith(CONFIG_FIRST_LINE) and not text.endswith(CONFIG_LAST_LINE)
    if cut_short or (text and not text.endswith("\n")):
        raise CheckpointError(f"{path}: cut short (it does not end with the line {CONFIG_LAST_LINE.strip()!r} that "
                              "attnmt writes last): a damaged copy? Copy the model directory again")
    config = config_from_yaml(text, path, saved=True)
    return config


def write_tokenizers(run_dir: str | Path, src: Tokenizer | WordTokenizer, tgt: Tokenizer | WordTokenizer) -> None:
    """Write ``spm.model`` when source and target share one SentencePiece model, else
    ``src.spm.model`` and ``tgt.spm.model`` (and ``vocab.json`` for :class:`VocabTokenizer`;
    word vocabularies: ``src.vocab.json`` and ``tgt.vocab.json``)."""
    run_dir = Path(run_dir)
    if isinstance(src, VocabTokenizer):
        text = json.dumps(src.vocab, ensure_ascii=False)
        atomic_write(run_dir / VOCAB, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    if src is tgt and not isinstance(src, VocabTokenizer):
        atomic_write(run_dir / src.FILE, src.save)
    else:
        atomic_write(run_dir / f"src.{src.FILE}", src.save)
        atomic_write(run_dir / f"tgt.{tgt.FILE}", tgt.save)


def read_tokenizers(run_dir: str | Path) -> tuple[Tokenizer | WordTokenizer, Tokenizer | WordTokenizer]:
    """(source, target) tokenizers of a model directory (the same object if joint).

    Raises:
        CheckpointError: ``run_dir`` is not a directory, or neither ``spm.model``,
            ``src.spm.model``/``tgt.spm.model`` nor ``src.vocab.json``/``tgt.vocab.json`` exists.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: {'not a directory' if run_dir.exists() else 'no such model directory'}")
    if (run_dir / VOCAB).is_file():
        try:
            vocab = json.loads((run_dir / VOCAB).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{run_dir / VOCAB}: not JSON: {e}") from None
        if not isinstance(vocab, list) or not all(isinstance(p, str) for p in vocab):
            raise CheckpointError(f"{run_dir / VOCAB}: expected a JSON list of pieces")
        return (VocabTokenizer.load_with_vocab(run_dir / SRC_SPM, vocab),
                VocabTokenizer.load_with_vocab(run_dir / TGT_SPM, vocab))
    if (run_dir / JOINT_SPM).is_file():
        tok = Tokenizer.load(run_dir / JOINT_SPM)
        return tok, tok
    if (run_dir / SRC_SPM).is_file():
        return Tokenizer.load(run_dir / SRC_SPM), Tokenizer.load(run_dir / TGT_SPM)
    if (run_dir / SRC_WORDS).is_file():
        return WordTokenizer.load(run_dir / SRC_WORDS), WordTokenizer.load(run_dir / TGT_WORDS)
    raise CheckpointError(f"{run_dir}: no tokenizer ({JOINT_SPM}, {SRC_SPM} or {SRC_WORDS}) in the model directory")


TOKENIZER_FILES = (JOINT_SPM, SRC_SPM, TGT_SPM, VOCAB, SRC_WORDS, TGT_WORDS)


def copy_tokenizers(model_dir: str | Path, output: str | Path) -> list[str]:
    """Copy the tokenizer files of a model directory (those of :data:`TOKENIZER_FILES` it has)
    byte for byte into ``output``, each atomically; returns their names."""
    names = [name for name in TOKENIZER_FILES if (Path(model_dir) / name).is_file()]
    for name in names:
        atomic_write(Path(output) / name, lambda tmp, name=name: shutil.copyfile(Path(model_dir) / name, tmp))
    return names


def copy_translation_files(model_dir: str | Path, output: str | Path) -> None:
    """Copy what translation needs besides the weights (config.yaml, the SentencePiece models,
    vocab.json, the learned sentence splitter's folder) from a model directory into another
    directory, e.g. an exported model's."""
    for name in (CONFIG, JOINT_SPM, SRC_SPM, TGT_SPM, VOCAB, SRC_WORDS, TGT_WORDS):
        if (Path(model_dir) / name).is_file():
            atomic_write(Path(output) / name, lambda tmp, name=name: shutil.copyfile(Path(model_dir) / name, tmp))
    sentence_model.copy(model_dir, output)


def model_languages(model_dir: str | Path) -> tuple[str | None, str | None]:
    """A model directory's (source, target) language codes, None where unknown: the config's
    ``tokenizer.src_lang``/``tgt_lang`` or ``data.pair``; else, for a model imported from an
    OPUS-MT checkpoint, the pair its name carries (``Helsinki-NLP/opus-mt-de-en``), read from
    the ``imported_from`` metadata of its weights (:func:`save_weights`).

    Raises:
        CheckpointError, ConfigError: no readable config.yaml.
    """
    languages = read_config(model_dir).languages()
    weights = Path(model_dir) / WEIGHTS
    if None not in languages or not weights.is_file():
        return languages
    try:
        with safe_open(str(weights), "pt") as f:
            source = (f.metadata() or {}).get("imported_from", "")
    except (SafetensorError, OSError):
        return languages
    match = re.search(r"opus-mt-([a-z]{2,3})-([a-z]{2,3})/?$", source, re.IGNORECASE)
    return (canonical_language(match.group(1)), canonical_language(match.group(2))) if match else languages


def save_weights(model: nn.Module, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write the model's parameters as safetensors (tied tensors stored once), atomically; for a
    :class:`Transformer`, with its :func:`attnmt.weights.architecture` under the metadata key
    :data:`attnmt.weights.ARCHITECTURE`; and the SHA-256 of the tensors written
    (:data:`attnmt.weights.DIGEST`), by which a file changed since is refused."""
    from safetensors.torch import save_model

    from attnmt.model.transformer import Transformer

    from safetensors.torch import load_file, save_file

    metadata = dict(metadata or {})
    if isinstance(model, Transformer):
        metadata[ARCHITECTURE] = json.dumps(architecture(model.config), sort_keys=True)

    def write(tmp: str) -> None:
        save_model(model, tmp, metadata=metadata)  # tied tensors once, under the names it chooses
        tensors = load_file(tmp)  # the tensors as the file holds them, for their digest
        save_file(tensors, tmp, metadata={**metadata, DIGEST: tensors_digest(tensors)})

    atomic_write(path, write, failures=(SafetensorError,))


def load_weights(model: nn.Module, path: str | Path, config_file: str | Path | None = None) -> None:
    """Load safetensors weights into ``model`` (strict: every parameter must match); for a
    :class:`Transformer`, first :func:`attnmt.weights.check_architecture` of its configuration against the
    record in the file.

    Args:
        config_file: where the model's configuration was read from, for the error
            (default: the config.yaml beside ``path``).
    Raises:
        CheckpointError: missing, empty, truncated or non-safetensors file, tensors changed
            since they were written (``attnmt.weights.read_weights``), a configuration that differs from the
            one the weights record, or names/shapes that do not fit the model.
    """
    from safetensors.torch import load_model

    from attnmt.model.transformer import Transformer

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    if isinstance(model, Transformer):
        check_architecture(model.config, path, config_file)
    read_weights(path)  # readable, and the tensors it recorded
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file (empty, truncated or another format?): "
                              f"{e}") from None
    except (RuntimeError, ValueError) as e:
        raise CheckpointError(f"{path}: weights do not fit the configured model: {e}") from None
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not fit the model (missing {missing}, unexpected {unexpected})")


def check_model_dir(run_dir: str | Path, weights: str | Path | None = None
                    ) -> tuple[Config, Tokenizer | WordTokenizer, Tokenizer | WordTokenizer, Path]:
    """The checks of :func:`load_model_dir` that need no model built: config.yaml, the
    tokenizers, and a weights file whose recorded architecture config.yaml still matches
    (:func:`attnmt.weights.check_architecture`; its header only is read). Returns (config, source tokenizer,
    target tokenizer, weights path); ``attnmt serve`` calls it before starting.

    Raises:
        CheckpointError, ConfigError: missing or incompatible files.
    """
    config = read_config(run_dir)
    src_tok, tgt_tok = read_tokenizers(run_dir)
    path = Path(weights) if weights is not None else Path(run_dir) / WEIGHTS
    if weights is None and not path.exists():
        for name, engine in ((CTRANSLATE2_MODEL, "ctranslate2"), (ONNX_ENCODER, "onnxruntime")):
            if (Path(run_dir) / name).is_file():
                raise CheckpointError(f"{run_dir}: an export for the {engine} engine, without {WEIGHTS}; use "
                                      f"--engine {engine}")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    check_architecture(config.model, path, Path(run_dir) / CONFIG)
    return config, src_tok, tgt_tok, path


def load_model_dir(run_dir: str | Path, weights: str | Path | None = None
                   ) -> tuple[Config, Tokenizer, Tokenizer, Transformer]:
    """Everything translation needs from a model directory: (config, source tokenizer, target
    tokenizer, model with its weights loaded, float32, in training mode as nn.Module builds it).

    Args:
        weights: another safetensors file to load instead of ``RUN_DIR/model.safetensors``.
    Raises:
        CheckpointError, ConfigError: missing or incompatible files (:func:`check_model_dir`,
            then the weights' names and shapes).
    """
    from attnmt.model.transformer import Transformer

    config, src_tok, tgt_tok, path = check_model_dir(run_dir, weights)
    model = Transformer(config.model, len(src_tok), len(tgt_tok))
    load_weights(model, path, Path(run_dir) / CONFIG)
    return config, src_tok, tgt_tok, model
