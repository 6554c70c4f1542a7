"""A model directory: what translation needs, read and written in one place.

    RUN_DIR/config.yaml        the validated configuration (``attnmt.config.Config``)
    RUN_DIR/spm.model          joint SentencePiece model, or src.spm.model and tgt.spm.model
    RUN_DIR/vocab.json         with src.spm.model and tgt.spm.model: the shared vocabulary of an
                               imported MarianMT model (a JSON list, the piece of each id)
    RUN_DIR/model.safetensors  the weights translation uses

Training adds its resumable state under ``RUN_DIR/checkpoints/`` (``attnmt.train.checkpoint``),
which translation never reads. Every file is written to a temporary name in the same directory
and renamed into place (:func:`atomic_write`), so a crash leaves the old file or the new one,
never a torn one. Loading never executes code from a file: weights are safetensors and YAML is
read with ``yaml.safe_load``.

Library: safetensors, PyYAML.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import yaml
from safetensors.torch import load_model, save_model
from torch import nn

from attnmt.config import Config, config_from_dict
from attnmt.data.tokenizers import Tokenizer, VocabTokenizer
from attnmt.errors import CheckpointError
from attnmt.model.transformer import Transformer

CONFIG = "config.yaml"
WEIGHTS = "model.safetensors"
JOINT_SPM, SRC_SPM, TGT_SPM = "spm.model", "src.spm.model", "tgt.spm.model"
VOCAB = "vocab.json"


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)``, flush it to disk and rename it onto ``path`` (atomic on one
    filesystem). The temporary file is removed if ``write`` fails; the parent directory is
    created if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_config(config: Config, run_dir: str | Path) -> None:
    """Write the validated configuration as ``RUN_DIR/config.yaml``."""
    text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    atomic_write(Path(run_dir) / CONFIG, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def read_config(run_dir: str | Path) -> Config:
    """The validated ``config.yaml`` of a model directory.

    Raises:
        CheckpointError: the directory or its config.yaml is missing.
        ConfigError: config.yaml does not validate.
    """
    path = Path(run_dir) / CONFIG
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"{run_dir}: no such model directory")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; is {run_dir} a model directory made by 'attnmt train'?")
    return config_from_dict(yaml.safe_load(path.read_text(encoding="utf-8")), origin=str(path))


def write_tokenizers(run_dir: str | Path, src: Tokenizer, tgt: Tokenizer) -> None:
    """Write ``spm.model`` when source and target share one model, else ``src.spm.model`` and
    ``tgt.spm.model`` (and ``vocab.json`` for :class:`VocabTokenizer`)."""
    run_dir = Path(run_dir)
    if isinstance(src, VocabTokenizer):
        text = json.dumps(src.vocab, ensure_ascii=False)
        atomic_write(run_dir / VOCAB, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    if src is tgt and not isinstance(src, VocabTokenizer):
        atomic_write(run_dir / JOINT_SPM, src.save)
    else:
        atomic_write(run_dir / SRC_SPM, src.save)
        atomic_write(run_dir / TGT_SPM, tgt.save)


def read_tokenizers(run_dir: str | Path) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) SentencePiece models of a model directory (the same object if joint).

    Raises:
        CheckpointError: neither ``spm.model`` nor ``src.spm.model``/``tgt.spm.model`` exists.
    """
    run_dir = Path(run_dir)
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
    raise CheckpointError(f"{run_dir}: no SentencePiece model ({JOINT_SPM} or {SRC_SPM}) in the model directory")


def copy_translation_files(model_dir: str | Path, output: str | Path) -> None:
    """Copy what translation needs besides the weights (config.yaml, the SentencePiece models,
    vocab.json) from a model directory into another directory, e.g. an exported model's."""
    for name in (CONFIG, JOINT_SPM, SRC_SPM, TGT_SPM, VOCAB):
        if (Path(model_dir) / name).is_file():
            atomic_write(Path(output) / name, lambda tmp, name=name: shutil.copyfile(Path(model_dir) / name, tmp))


def save_weights(model: nn.Module, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write the model's parameters as safetensors (tied tensors stored once), atomically."""
    atomic_write(path, lambda tmp: save_model(model, tmp, metadata=metadata))


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load safetensors weights into ``model`` (strict: every parameter must match).

    Raises:
        CheckpointError: missing file, or names/shapes that do not fit the model.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except (RuntimeError, ValueError) as e:
        raise CheckpointError(f"{path}: weights do not fit the configured model: {e}") from None
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not fit the model (missing {missing}, unexpected {unexpected})")


def load_model_dir(run_dir: str | Path, weights: str | Path | None = None
                   ) -> tuple[Config, Tokenizer, Tokenizer, Transformer]:
    """Everything translation needs from a model directory: (config, source tokenizer, target
    tokenizer, model with its weights loaded, float32, in training mode as nn.Module builds it).

    Args:
        weights: another safetensors file to load instead of ``RUN_DIR/model.safetensors``.
    Raises:
        CheckpointError, ConfigError: missing or incompatible files.
    """
    config = read_config(run_dir)
    src_tok, tgt_tok = read_tokenizers(run_dir)
    model = Transformer(config.model, len(src_tok), len(tgt_tok))
    load_weights(model, weights if weights is not None else Path(run_dir) / WEIGHTS)
    return config, src_tok, tgt_tok, model
