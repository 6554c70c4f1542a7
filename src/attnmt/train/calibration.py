"""``train.precision: auto``: the training precision chosen before the first update.

On a CPU, :func:`training_choice` times the training step's work itself, the forward and
backward passes of the run's model (its label-smoothed loss, as ``attnmt.train.trainer.BatchLoss``
computes it) on the first batches of the run's first epoch, in float32 and under bfloat16
autocast, and keeps the faster (``attnmt.autoprecision``: the rule, the margin and the cache per
CPU model). Nothing of the run changes: no optimiser step, the gradients dropped, the random
state as it was. The timing happens inside the setup, so its seconds count against
``max_minutes`` and the ``time_budget`` schedule's budget like the rest of the setup.

The choice is kept in the run directory (``rundir.PRECISION_CHOICE``): a resumed run trains at
the precision it started with, whatever this CPU would pick. On a GPU the rule of
``attnmt.precision.training_precision`` for 'bf16' stays (bfloat16 where the GPU has it, else
float16 with loss scaling); on MPS, float32. Under torchrun rank 0 times and every rank takes
its choice.

Library: torch (autocast, autograd).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from attnmt import autoprecision, rundir
from attnmt.autoprecision import Choice
from attnmt.config import Config
from attnmt.data.batching import Batch, batch_from_arrays
from attnmt.errors import CheckpointError, EnvironmentFailure
from attnmt.model.transformer import Transformer
from attnmt.oneline import one_line
from attnmt.precision import autocast, training_precision
from attnmt.train import distributed
from attnmt.train.data import CorpusData, epoch_share
from attnmt.train.trainer import BatchLoss

log = logging.getLogger(__name__)

BATCHES = 5  # the first batches of epoch 1: one warm-up and up to four timed, for each precision


def training_choice(config: Config, run_dir: Path, resume: bool, model: Transformer, data: CorpusData,
                    ranks: distributed.Ranks, device: torch.device) -> Choice:
    """The precision ``auto`` trains at (module docstring): the run's own earlier choice on
    ``resume``, the GPU's rule off the CPU, else timed (or cached). Rank 0 alone reads the run
    directory and times; every rank gets its choice."""
    choice = None
    if ranks.is_main:
        choice = kept_choice(run_dir) if resume else None
        if choice is None and device.type != "cpu":
            choice = Choice(training_precision("bf16", device.type) if device.type == "cuda" else "fp32",
                            how=f"the {device.type} rule")
        if choice is None:
            choice = calibrate(model, first_batches(config, data, ranks), config, device)  # logs its line
        else:
            log.info("%s", choice.line())
    return distributed.broadcast(choice, device)


def kept_choice(run_dir: Path) -> Choice | None:
    """The choice a run directory keeps (``rundir.PRECISION_CHOICE``), or None where it keeps none.

    Raises:
        CheckpointError: the file is not the record :func:`keep_choice` writes (cut short, emptied,
            a precision other than fp32 or bf16): the run's precision is not guessed again.
        EnvironmentFailure: the file cannot be read.
    """
    path = run_dir / rundir.PRECISION_CHOICE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise EnvironmentFailure(f"{path}: cannot read: {e.strerror}") from None
    try:
        kept = json.loads(data.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError and json's errors among them
        kept, wrong = None, one_line(str(e))
    else:
        rates = kept.get("rates") if isinstance(kept, dict) else None
        if not isinstance(kept, dict) or kept.get("precision") not in autoprecision.CANDIDATES:
            wrong = f"no precision of {', '.join(autoprecision.CANDIDATES)}"
        elif not isinstance(rates, dict) or not all(isinstance(r, (int, float)) for r in rates.values()):
            wrong = "no rates of tokens per second"
        else:
            return Choice(kept["precision"], {str(p): float(r) for p, r in rates.items()}, how="run")
    raise CheckpointError(f"{path}: not the precision this run chose ({wrong}); restore it, or delete it to time "
                          "the precision again")


def keep_choice(run_dir: Path, choice: Choice) -> None:
    """Write the choice into the run directory, atomically (rank 0, with the run's first files)."""
    text = json.dumps(choice.record(), indent=1) + "\n"
    rundir.atomic_write(run_dir / rundir.PRECISION_CHOICE, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def first_batches(config: Config, data: CorpusData, ranks: distributed.Ranks, count: int = BATCHES) -> list[Batch]:
    """This process's first ``count`` batches of epoch 1 (fewer in a smaller epoch), on the CPU:
    the batches the run starts with, as ``attnmt.train.loop`` builds them."""
    share = epoch_share(config, data, 0, ranks)
    start = config.model.decoder_start_id
    batches = []
    for k in range(min(count, len(share))):
        idx = share[k]
        src, tgt = data.train.pairs(idx)
        batches.append(batch_from_arrays(src, tgt, start))
    return batches


def shape_signature(config: Config, model: Transformer) -> str:
    """What the cache key holds of a training job: the model's sizes and the batch size."""
    m, tc = config.model, config.train
    return (f"d_model {m.d_model} heads {m.num_heads} d_ff {m.d_ff} layers {m.num_encoder_layers}+"
            f"{m.num_decoder_layers} vocabulary {len(model.encoder.embedding.weight)}/"
            f"{len(model.decoder.embedding.weight)} batch_tokens {tc.batch_tokens} "
            f"batch_sentences {tc.batch_sentences} loss {tc.loss_normalization}")


def calibrate(model: Transformer, batches: list[Batch], config: Config, device: torch.device) -> Choice:
    """Time forward and backward passes of ``model`` on ``batches`` in fp32 and bf16
    (``attnmt.autoprecision.choose``: cached, or measured): the first batch warms up each
    precision, the other batches are timed. The
    model's weights, gradients and the random state are left as they were.

    Args:
        batches: at least two, on the CPU (moved to ``device`` here).
    """
    loss = BatchLoss(model, config.train.label_smoothing, per_sentence=config.train.loss_normalization == "sentences")
    params = [p for p in model.parameters() if p.requires_grad]
    # the warm-up is a whole batch: a first pass at the real shapes (allocations, the kernels' first calls)
    # is slower in float32 as in bfloat16, and a small one leaves part of that in the first timed step
    on_device = [b.to(device) for b in batches]

    def step(precision: str, i: int) -> int:
        batch = on_device[i % len(on_device)]
        with autocast(precision, device.type):
            objective = loss(batch.src, batch.tgt_in, batch.tgt_out)[0]
        objective.backward()
        for p in params:
            p.grad = None
        return batch.num_tgt_tokens

    was_training = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=[]):  # dropout's draws leave the run's random state alone
            return autoprecision.choose("train", shape_signature(config, model), step, len(on_device))
    finally:
        model.train(was_training)
