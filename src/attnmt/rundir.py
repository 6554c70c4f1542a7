"""A model directory: what translation needs, read and written in one place.

    RUN_DIR/config.yaml        the validated configuration (``attnmt.config.Config``)
    RUN_DIR/spm.model          joint SentencePiece model, or src.spm.model and tgt.spm.model,
                               or the word vocabularies src.vocab.json and tgt.vocab.json
    RUN_DIR/vocab.json         with src.spm.model and tgt.spm.model: the shared vocabulary of an
                               imported MarianMT model (a JSON list, the piece of each id)
    RUN_DIR/model.safetensors  the weights translation uses, with the model section they were
                               trained as in their metadata (:data:`ARCHITECTURE`)

An export for another engine keeps config.yaml and the tokenizers and holds, in place of the
weights, CTranslate2's model.bin (:data:`CTRANSLATE2_MODEL`) or the ONNX graphs encoder.onnx
and decoder_step.onnx (:data:`ONNX_ENCODER`, :data:`ONNX_DECODER_STEP`); their names are
written here only, for the exporters, the engines and the checks that tell them apart.

Training adds its resumable state under ``RUN_DIR/checkpoints/`` (``attnmt.train.checkpoint``),
which translation never reads. Every file is written to a temporary name in the same directory
and renamed into place (:func:`atomic_write`), so a crash leaves the old file or the new one,
never a torn one. Loading never executes code from a file: weights are safetensors and YAML is
read with ``yaml.safe_load``. Loading weights refuses a config.yaml whose model section no longer
says what they were trained as (a hand edit such as num_heads 8 -> 4 keeps every weight shape
and would otherwise load as another function): :func:`check_architecture`.

Library: safetensors, PyYAML.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import yaml
from safetensors import SafetensorError, safe_open

from attnmt.config import Config, ModelConfig, canonical_language, config_from_yaml
from attnmt.data.tokenizers import Tokenizer, VocabTokenizer, WordTokenizer
from attnmt.errors import CheckpointError, ConfigError, write_error

if TYPE_CHECKING:  # PyTorch is imported by the functions that build or load a model, so that the
    from torch import nn  # engines without it (CTranslate2) read config.yaml and the tokenizers here

    from attnmt.model.transformer import Transformer

CONFIG = "config.yaml"
WEIGHTS = "model.safetensors"
JOINT_SPM, SRC_SPM, TGT_SPM = "spm.model", "src.spm.model", "tgt.spm.model"
SRC_WORDS, TGT_WORDS = "src.vocab.json", "tgt.vocab.json"
VOCAB = "vocab.json"
CTRANSLATE2_MODEL = "model.bin"  # written by CTranslate2's converter (attnmt.interop.ctranslate2)
ONNX_ENCODER = "encoder.onnx"  # the graphs of attnmt.interop.onnx
ONNX_DECODER_STEP = "decoder_step.onnx"
PRECISION_CHOICE = "precision.json"  # a run's train.precision auto: what it chose (attnmt.train.calibration)

# The safetensors metadata key under which :func:`save_weights` records the model section a
# Transformer's weights were trained as (JSON, the keys of :func:`architecture`).
ARCHITECTURE = "attnmt_model"

# Model keys that do not change the function a trained model computes at inference, so that a
# model directory's config.yaml may change them: the dropout rates act in training only; init,
# the pretrained vectors and freeze_embeddings act when training starts.
INFERENCE_FREE_KEYS = frozenset({"dropout", "attention_dropout", "activation_dropout", "time_shared_dropout",
                                 "init", "src_vectors", "tgt_vectors", "freeze_embeddings"})


def writes_in_place(path: str | Path) -> bool:
    """Whether ``path`` names an existing device, pipe or socket (``/dev/null``, ``/dev/stdout``
    on a pipe or a terminal, a FIFO), which :func:`atomic_write` writes in place: renaming a
    file onto it would replace the device node (as root) or fail (in a directory such as /dev
    that only root may write)."""
    path = Path(path)
    if not path.exists() or path.is_dir():
        return False
    target = path.resolve()
    return not target.exists() or not target.is_file()  # /proc/self/fd/1 of a pipe resolves to 'pipe:[N]'


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` for a temporary file in ``path``'s directory, fsync it, rename it
    onto ``path`` (atomic on one filesystem) and fsync the directory, so that after a crash or a
    full disk ``path`` holds the old content or the new, never a torn file. The temporary file is
    removed if anything fails; the parent directory is created if needed. A symbolic link is
    followed (the file it names is replaced, the link kept); a device, pipe or socket
    (:func:`writes_in_place`) is written directly, ``write(path)``.

    Raises:
        WriteError: the file cannot be written (no permission, ...; :class:`attnmt.errors.DiskFull`
            for a full disk); ``path`` is unchanged.
    """
    path = Path(path)
    if writes_in_place(path):
        try:
            write(str(path))
        except (OSError, RuntimeError, SafetensorError) as e:
            reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
            raise write_error(f"{path}: cannot write: {reason}", e) from e
        return
    if path.is_symlink():  # replace the file a link names, never the link itself
        path = path.resolve()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except (OSError, RuntimeError, SafetensorError) as e:  # torch.save reports a failed write as RuntimeError
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise write_error(f"{path}: cannot write: {reason}{_free_space(path.parent)}", e) from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _free_space(directory: Path) -> str:
    """' (N MiB free on the disk)', a hint when a write failed; '' if unknown."""
    try:
        return f" ({shutil.disk_usage(directory).free / 2**20:.0f} MiB free on the disk)"
    except OSError:
        return ""


def fsync_dir(directory: str | Path) -> None:
    """fsync a directory, so that a rename or a new file in it survives a crash (POSIX)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_config(config: Config, run_dir: str | Path) -> None:
    """Write the validated configuration as ``RUN_DIR/config.yaml``."""
    text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    atomic_write(Path(run_dir) / CONFIG, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def read_config(run_dir: str | Path) -> Config:
    """The validated ``config.yaml`` of a model directory.

    Raises:
        CheckpointError: the directory or its config.yaml is missing or unreadable.
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
    return config_from_yaml(text, path, saved=True)


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
    vocab.json) from a model directory into another directory, e.g. an exported model's."""
    for name in (CONFIG, JOINT_SPM, SRC_SPM, TGT_SPM, VOCAB, SRC_WORDS, TGT_WORDS):
        if (Path(model_dir) / name).is_file():
            atomic_write(Path(output) / name, lambda tmp, name=name: shutil.copyfile(Path(model_dir) / name, tmp))


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


def architecture(cfg: ModelConfig) -> dict:
    """The keys of a model section that fix what its weights compute (all but
    :data:`INFERENCE_FREE_KEYS`), as JSON values: what :func:`save_weights` records."""
    return {k: v for k, v in cfg.model_dump(mode="json").items() if k not in INFERENCE_FREE_KEYS}


def save_weights(model: nn.Module, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write the model's parameters as safetensors (tied tensors stored once), atomically; for a
    :class:`Transformer`, with its :func:`architecture` under the metadata key :data:`ARCHITECTURE`."""
    from safetensors.torch import save_model

    from attnmt.model.transformer import Transformer

    if isinstance(model, Transformer):
        metadata = {**(metadata or {}), ARCHITECTURE: json.dumps(architecture(model.config), sort_keys=True)}
    atomic_write(path, lambda tmp: save_model(model, tmp, metadata=metadata))


def check_architecture(cfg: ModelConfig, path: str | Path, config_file: str | Path | None = None) -> None:
    """Refuse a model section that differs from the one the weights file ``path`` records
    (:data:`ARCHITECTURE`) in a key that changes the function (not :data:`INFERENCE_FREE_KEYS`).
    Weights written before the record existed, or by other tools, have none and pass (their
    shapes are still checked by :func:`load_weights`); keys only one side knows are skipped, so
    a key added to ModelConfig later does not refuse older weights.

    Args:
        config_file: the configuration ``cfg`` was read from, named in the error (default: the
            config.yaml beside ``path``).
    Raises:
        CheckpointError: naming ``config_file``, each differing key with both values, and ``path``;
            or ``path`` is not a readable safetensors file.
    """
    path = Path(path)
    config_file = config_file if config_file is not None else path.with_name(CONFIG)
    try:
        with safe_open(str(path), "pt") as f:
            recorded = (f.metadata() or {}).get(ARCHITECTURE)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file (empty, truncated or another format?): "
                              f"{e}") from None
    if recorded is None:
        return
    try:
        trained = json.loads(recorded)
    except json.JSONDecodeError:
        raise CheckpointError(f"{path}: its {ARCHITECTURE} metadata is not JSON") from None
    now = architecture(cfg)
    differing = [f"model.{k} is {json.dumps(now[k])} but the weights were trained with {json.dumps(trained[k])}"
                 for k in sorted(now) if k in trained and now[k] != trained[k]]
    if differing:
        raise CheckpointError(f"{config_file}: does not match the weights {path}: {'; '.join(differing)}; was it "
                              "edited after training? Restore these values (only the dropout rates, init, "
                              "src_vectors, tgt_vectors and freeze_embeddings may change)")


def load_weights(model: nn.Module, path: str | Path, config_file: str | Path | None = None) -> None:
    """Load safetensors weights into ``model`` (strict: every parameter must match); for a
    :class:`Transformer`, first :func:`check_architecture` of its configuration against the
    record in the file.

    Args:
        config_file: where the model's configuration was read from, for the error
            (default: the config.yaml beside ``path``).
    Raises:
        CheckpointError: missing, empty, truncated or non-safetensors file, a configuration that
            differs from the one the weights record, or names/shapes that do not fit the model.
    """
    from safetensors.torch import load_model

    from attnmt.model.transformer import Transformer

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    if isinstance(model, Transformer):
        check_architecture(model.config, path, config_file)
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
    (:func:`check_architecture`; its header only is read). Returns (config, source tokenizer,
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
