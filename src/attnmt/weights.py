"""What a weights file records about itself, and the checks that trust it when it is read back
(``attnmt.rundir.save_weights`` writes both records into the safetensors metadata):

* the model section the weights were trained as (:data:`ARCHITECTURE`), so that a config.yaml
  edited since in a key that changes the function is refused (:func:`check_architecture`);
* the SHA-256 of the tensors the file holds (:data:`DIGEST`), so that a file changed since (a
  flipped bit, a damaged copy) is refused rather than translated with (:func:`read_weights`).

Files written without the records (by other tools, or before they existed) are read as they are.

Library: safetensors, torch, hashlib (standard library).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from safetensors import SafetensorError, safe_open

from attnmt.config import ModelConfig
from attnmt.errors import CheckpointError

# The metadata key under which attnmt.rundir.save_weights records :func:`tensors_digest`.
DIGEST = "attnmt_sha256"
# The safetensors metadata key under which ``attnmt.rundir.save_weights`` records the model section a
# Transformer's weights were trained as (JSON, the keys of :func:`architecture`).
ARCHITECTURE = "attnmt_model"

# Model keys that do not change the function a trained model computes at inference, so that a
# model directory's config.yaml may change them: the dropout rates act in training only; init,
# the pretrained vectors and freeze_embeddings act when training starts.
INFERENCE_FREE_KEYS = frozenset({"dropout", "attention_dropout", "activation_dropout", "time_shared_dropout",
                                 "init", "src_vectors", "tgt_vectors", "freeze_embeddings"})




def tensors_digest(tensors: dict) -> str:
    """The hex SHA-256 of named tensors (name, dtype, shape and bytes of each, by name): what
    :func:`save_weights` records under :data:`DIGEST`."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def read_weights(path: str | Path) -> tuple[dict, dict[str, str]]:
    """The tensors (name -> CPU tensor) and metadata of a safetensors weights file, refused where
    it is not one or where its tensors are no longer those :func:`save_weights` recorded
    (:data:`DIGEST`; files written without the record pass).

    Raises:
        CheckpointError: naming ``path``: missing, empty, truncated, not safetensors, or changed
            since it was written.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    try:
        with safe_open(str(path), "pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file (empty, truncated or another format?): "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    recorded = metadata.get(DIGEST)
    if recorded is not None and recorded != tensors_digest(tensors):
        raise CheckpointError(f"{path}: the weights changed since attnmt wrote them (their SHA-256 differs from the "
                              "one recorded): a damaged copy? Copy or train the model again")
    return tensors, metadata


def architecture(cfg: ModelConfig) -> dict:
    """The keys of a model section that fix what its weights compute (all but
    :data:`INFERENCE_FREE_KEYS`), as JSON values: what ``attnmt.rundir.save_weights`` records."""
    return {k: v for k, v in cfg.model_dump(mode="json").items() if k not in INFERENCE_FREE_KEYS}


def check_architecture(cfg: ModelConfig, path: str | Path, config_file: str | Path | None = None) -> None:
    """Refuse a model section that differs from the one the weights file ``path`` records
    (:data:`ARCHITECTURE`) in a key that changes the function (not :data:`INFERENCE_FREE_KEYS`).
    Weights written before the record existed, or by other tools, have none and pass (their
    shapes are still checked by ``attnmt.rundir.load_weights``); keys only one side knows are skipped, so
    a key added to ModelConfig later does not refuse older weights.

    Args:
        config_file: the configuration ``cfg`` was read from, named in the error (default: the
            config.yaml beside ``path``).
    Raises:
        CheckpointError: naming ``config_file``, each differing key with both values, and ``path``;
            or ``path`` is not a readable safetensors file.
    """
    path = Path(path)
    config_file = config_file if config_file is not None else path.with_name("config.yaml")
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
