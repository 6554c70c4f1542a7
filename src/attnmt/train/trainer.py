"""The model, its optimiser and one update (paper section 5): :class:`Trainer`.

A :class:`Trainer` holds what an update changes: the Transformer, Adam (or SGD) with the
configured learning-rate schedule, the loss scaler (float16 only) and the run's
:class:`Progress`. :meth:`Trainer.train_step` makes one update from ``accum_steps``
length-bucketed token batches: the label-smoothed loss with optional autocast (and, with
``train.dropout_curriculum``, dropout rates that grow with the update count), the gradients
averaged over torchrun's processes, the gradient norm clipped. An update whose loss or gradient
norm is not finite is skipped: the weights and Adam's moments stay as they were, and
:class:`Progress` counts it. :meth:`Trainer.evaluate` gives validation loss, perplexity and
greedy BLEU/chrF; :meth:`Trainer.state_dict` and :meth:`Trainer.load_state_dict` carry the
weights, the optimiser, the schedule, the scaler and the progress in and out of a checkpoint.

The trainer writes no file and no log line: the run around it (``attnmt.train.loop``) does,
through ``attnmt.train.checkpoint`` and ``attnmt.train.report``; ``attnmt.train.setup`` builds
the model it is given.

Compiled training step (``train.compile``, a speed switch): the encoder and decoder stacks of
the loss go through ``torch.compile`` (``attnmt.train.compiling.compiled``); how many graphs the
process compiled is ``attnmt.train.compiling.compiled_graphs``.

Library: torch.optim (Adam, SGD, LambdaLR), torch.compile.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field, fields

import torch
from torch.nn.parallel import DistributedDataParallel

from attnmt.config import Config
from attnmt.data.batching import Batch, make_batch, token_batches
from attnmt.data.corpus import EncodedCorpus
from attnmt.data.tokenizers import EOS_ID, PAD_ID
from attnmt.evaluate import corpus_scores
from attnmt.model.dropout import set_rates
from attnmt.model.transformer import Transformer
from attnmt.precision import autocast, grad_scaler
from attnmt.ranges import Range, check_record
from attnmt.search.batched import native_search
from attnmt.search.options import SearchOptions
from attnmt.train import distributed
from attnmt.train.compiling import compiled
from attnmt.train.data import CorpusData
from attnmt.train.losses import (chunked_label_smoothed_cross_entropy, label_smoothed_cross_entropy,
                                 per_sentence_label_smoothed_cross_entropy)
from attnmt.train.schedules import curriculum_dropout, expected_updates, learning_rate

CHUNKED_LOSS = True  # speed switch (memory): the loss without holding the (N, V) logits (attnmt.train.losses)


# the ranges of the recorded scores a resumed state is checked against
BLEU = Range(0.0, 100.0)
PERPLEXITY = Range(0.0, float("inf"), infinite=True)  # inf: none yet
SELECTION_KEY = Range(-float("inf"), float("inf"), infinite=True)  # (BLEU, -perplexity); -inf: none yet


@dataclass
class Progress:
    """Where a run stands; saved in the resumable state."""

    step: int = 0  # updates done
    epoch: int = 0  # 0-based epoch in progress
    batch_in_epoch: int = 0  # batches of that epoch done, by all processes together
    elapsed_seconds: float = 0.0  # wall clock before this process
    best_bleu: float | None = field(default=None, metadata={"range": BLEU})
    best_ppl: float = field(default=float("inf"), metadata={"range": PERPLEXITY})
    best_key: tuple[float, float] = field(default=(-float("inf"), -float("inf")),
                                          metadata={"range": SELECTION_KEY})  # (BLEU, -perplexity)
    bad_validations: int = 0  # validations since the last improvement
    nonfinite_in_a_row: int = 0  # updates skipped in a row: loss or gradient norm not finite
    nonfinite_total: int = 0  # all updates skipped so far
    last_valid_bleu: float | None = field(default=None, metadata={"range": BLEU})  # of the latest validation
    stop_reason: str | None = None  # set when training stopped; the final validation is then done
    finished: bool = False  # the final validation, averaging and the 'done' record are written
    log_bytes: int | None = None  # length of train_log.jsonl when the state was saved
    # updates the time budget is expected to hold (schedule time_budget)
    expected_steps: float = field(default=float("inf"), metadata={"range": PERPLEXITY})

    @classmethod
    def from_dict(cls, saved: dict, where: str) -> Progress:
        """The progress a saved state holds (:meth:`Trainer.state_dict`), every field checked
        (:func:`attnmt.ranges.check_record`).

        Raises:
            ValueError: a field missing, unknown or outside its range ('{where}progress.step ...').
        """
        if not isinstance(saved, dict):
            raise ValueError(f"{where}progress {saved!r} is not a record")
        names = {f.name for f in fields(cls)}
        if set(saved) - names or "step" not in saved:
            raise ValueError(f"{where}progress has the fields {sorted(saved)}, expected {sorted(names)}")
        progress = cls(**{k: tuple(v) if k == "best_key" and isinstance(v, list) else v for k, v in saved.items()})
        check_record(progress, f"{where}progress.")
        return progress


class BatchLoss(torch.nn.Module):
    """The summed label-smoothed loss and NLL of one teacher-forced batch, as a module's
    forward: ``DistributedDataParallel`` synchronises the gradients of what the forward of the
    module it wraps computed, so the loss, not only the Transformer, is what it wraps.

    Args:
        model: the Transformer.
        label_smoothing: epsilon_ls (paper section 5.4).
        per_sentence: the objective is the sum of each sentence's mean loss per token
            (``train.loss_normalization: sentences``), else the summed loss.
        compile: the stacks through ``attnmt.train.compiling.compiled`` (``train.compile``).
    """

    def __init__(self, model: Transformer, label_smoothing: float, per_sentence: bool = False,
                 compile: bool = False):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.per_sentence = per_sentence
        self.features = self._features
        if compile:  # speed switch (train.compile): the stacks through inductor; the plain eager method otherwise
            self.features = compiled(self._features)

    def _features(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """The decoder's final states (B, T, D) of teacher-forced decoding: (B, S), (B, T) int64 ids."""
        memory, src_mask, _ = self.model.encode(src)
        return self.model.decoder.features(tgt_in, memory, src_mask)[0]

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, S), (B, T), (B, T) int64 ids -> (objective, summed label-smoothed loss, summed
        NLL) over the non-pad targets (float32 scalars); the objective is what is minimised."""
        eps = self.label_smoothing
        target = tgt_out.flatten()  # (B*T,)
        if self.per_sentence and torch.is_grad_enabled():
            return per_sentence_label_smoothed_cross_entropy(self.model(src, tgt_in), tgt_out, eps, PAD_ID)
        if not CHUNKED_LOSS:
            logits = self.model(src, tgt_in)  # (B, T, V)
            loss, nll = label_smoothed_cross_entropy(logits.flatten(0, 1), target, eps, PAD_ID)
            return loss, loss, nll
        # Speed switch (memory): the loss from the decoder states and the output projection.
        states = self.features(src, tgt_in)  # (B, T, D)
        projection = self.model.decoder.output_projection
        loss, nll = chunked_label_smoothed_cross_entropy(states.flatten(0, 1), projection.weight, target, eps, PAD_ID,
                                                         projection.bias)
        return loss, loss, nll


class Trainer:
    """The model, the optimiser, the schedule and the update (module docstring).

    Args:
        config: the run's configuration (``train`` and ``model`` sections; ``decode`` for the
            greedy validation translations).
        model: the Transformer, on ``device``, its frozen parameters (``train.freeze``) with
            ``requires_grad`` off.
        data: the run's prepared data: validation sets and target tokenizer for :meth:`evaluate`.
        ranks: this process's place among torchrun's processes.
        device, precision: where and at which precision it trains (``attnmt.precision``).
        compile: the loss's stacks through ``torch.compile`` (``train.compile``, when it can run).
        frozen: ``train.freeze`` fixed some parameters: they stay out of the optimiser.
        saved: a checkpoint's state to continue from (:meth:`load_state_dict`), else None.
        start_time: ``time.monotonic()`` at the start of this process's run, for :meth:`elapsed`.
    Raises:
        CheckpointError: (with ``saved``) the state does not fit this model.
    """

    def __init__(self, config: Config, model: Transformer, data: CorpusData, ranks: distributed.Ranks,
                 device: torch.device, precision: str, compile: bool = False, frozen: bool = False,
                 saved: dict | None = None, start_time: float | None = None):
        tc = config.train
        self.config = config
        self.model = model
        self.data = data
        self.ranks = ranks
        self.device = device
        self.precision = precision
        self.start_time = time.monotonic() if start_time is None else start_time
        self.setup_seconds = 0.0  # wall clock before the first update of this process (the loop sets it)
        self.compiles = compile  # the loss's stacks go through torch.compile
        self.skipped: tuple[float, float] | None = None  # (loss per token, gradient norm) of the last skipped update
        self.params = list({id(p): p for p in model.parameters()}.values())  # tied tensors once
        if frozen:  # train.freeze: fixed parameters stay out of the optimizer
            self.params = [p for p in self.params if p.requires_grad]
        # The schedule gives the learning rate itself (base rate 1.0, as in the Annotated
        # Transformer); LambdaLR's step i is the (i + 1)-th update. fused: speed switch,
        # PyTorch's one-kernel Adam update (same update rule), on CPUs and CUDA GPUs.
        self.optimizer = torch.optim.Adam(self.params, lr=1.0, betas=tc.adam_betas, eps=tc.adam_eps,
                                          weight_decay=tc.weight_decay, fused=device.type in ("cpu", "cuda"))
        if tc.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.params, lr=1.0, momentum=tc.momentum, nesterov=tc.nesterov,
                                             weight_decay=tc.weight_decay)
        self.progress = Progress()
        # a lambda, not the bound method: LambdaLR's state dict then holds no lr_lambdas entry
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda i: self._learning_rate(i))
        self.scaler = grad_scaler(precision, device.type)
        self.loss = BatchLoss(model, tc.label_smoothing, per_sentence=tc.loss_normalization == "sentences",
                              compile=compile)
        if saved is not None:
            self.load_state_dict(saved)
        self.ddp_loss = distributed.wrap(self.loss, ranks, device, tc.ddp_overlap)  # the loss the updates use

    def _learning_rate(self, index: int) -> float:
        """LambdaLR's factor for its step ``index``: the schedule's rate of update ``index + 1``."""
        tc = self.config.train
        return learning_rate(tc.schedule, index + 1, d_model=self.config.model.d_model, lr=tc.lr,
                             lr_factor=tc.lr_factor, warmup_steps=tc.warmup_steps,
                             first_decay_steps=tc.first_decay_steps, t_mul=tc.t_mul, m_mul=tc.m_mul, alpha=tc.alpha,
                             expected_steps=self.progress.expected_steps, warmup_fraction=tc.warmup_fraction,
                             budget_decay=tc.budget_decay)

    def elapsed(self) -> float:
        """Wall-clock seconds of the whole run, earlier processes included."""
        return self.progress.elapsed_seconds + time.monotonic() - self.start_time

    def learning_rate(self) -> float:
        """The learning rate the next update uses."""
        return self.scheduler.get_last_lr()[0]

    # ---- state in and out -------------------------------------------------------------------

    def state_dict(self) -> dict:
        """{'model', 'optimizer', 'scheduler', 'scaler': their state dicts, 'progress': the
        :class:`Progress` as a dict (``elapsed_seconds`` as of now, ``best_key`` a list)}."""
        progress = asdict(self.progress)
        progress.update(elapsed_seconds=self.elapsed(), best_key=list(self.progress.best_key))
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(), "progress": progress}

    def load_state_dict(self, state: dict) -> None:
        """Load what :meth:`state_dict` gave (the scaler's state only where a scaler is in use).

        Raises:
            KeyError, RuntimeError, ValueError: the state does not fit this model or optimiser.
        """
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress.from_dict(state["progress"], "")

    # ---- one update -------------------------------------------------------------------------

    def batch_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed label-smoothed loss and summed NLL of one teacher-forced batch (float32
        scalars), by the model itself (not through DistributedDataParallel): for validation."""
        return self.loss(batch.src, batch.tgt_in, batch.tgt_out)[1:]

    def train_step(self, batches: list[Batch], tokens: int | None = None, sentences: int | None = None
                   ) -> tuple[float, float, int] | None:
        """One update from this process's ``batches`` (on the device; gradients accumulated).

        Each batch's summed loss is divided by ``tokens``, the target tokens of the whole update
        (all processes; default: those of ``batches``), and multiplied by the number of
        processes, whose gradients are then averaged (``distributed.average_gradients``, or
        DistributedDataParallel during the last batch's backward pass: the inner batches skip
        its synchronisation, ``no_sync``). With ``loss_normalization: sentences`` each
        sentence's mean loss is summed instead and divided by ``sentences`` (all processes).
        Then the loss scaler (fp16 only) unscales the gradients, their norm is clipped to
        ``clip_norm``, and the optimizer and the schedule step (``time_budget`` first refits
        the expected number of updates).

        Returns:
            (summed loss, summed NLL, target tokens) of this process's batches, or None when
            the loss or the gradient norm is not finite: then nothing is updated, the
            progress counts the skip and :attr:`skipped` holds (loss per token, gradient
            norm). Under torchrun the gradient norm is that of the averaged gradients, the
            same on every process, so all skip together.
        """
        tc = self.config.train
        model_config = self.config.model
        progress = self.progress
        local_tokens = sum(b.num_tgt_tokens for b in batches)
        tokens = tokens or local_tokens
        sentences = sentences or sum(b.tgt_out.size(0) for b in batches)
        per_sentence = tc.loss_normalization == "sentences"
        scale = self.ranks.world_size / (sentences if per_sentence else tokens)
        if tc.dropout_curriculum:  # curriculum dropout: the configured rates times this step's share
            share = curriculum_dropout(progress.step, tc.dropout_curriculum)
            set_rates(self.model, model_config.dropout * share, model_config.attention_dropout * share,
                      model_config.activation_dropout * share)
        loss_sum = nll_sum = 0.0
        for i, b in enumerate(batches):
            # dropout masks from a seed of (update, batch's place in the whole update): the same
            # masks for any split of the update over processes and accumulation steps
            place = self.ranks.rank + i * self.ranks.world_size
            torch.manual_seed(distributed.batch_seed(tc.seed, progress.step, place))
            inner = self.ranks.distributed and i < len(batches) - 1
            with distributed.no_sync(self.ddp_loss) if inner else contextlib.nullcontext():
                with autocast(self.precision, self.device.type):
                    objective, loss, nll = self.ddp_loss(b.src, b.tgt_in, b.tgt_out)
                self.scaler.scale(objective * scale).backward()
            loss_sum += loss.item()
            nll_sum += nll.item()
        distributed.average_gradients(self.ddp_loss, self.ranks)
        self.scaler.unscale_(self.optimizer)
        if tc.clip_norm:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, tc.clip_norm))
        else:
            grad_norm = float(torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None]))
        # fp16: an infinite gradient is the loss scaler's business (it skips the step and lowers the scale)
        finite_grad = math.isfinite(grad_norm) or self.scaler.is_enabled()
        if not finite_grad or (not self.ranks.distributed and not math.isfinite(loss_sum)):
            self.zero_grad()
            self.scaler.update()
            progress.nonfinite_in_a_row += 1
            progress.nonfinite_total += 1
            self.skipped = (loss_sum / tokens, grad_norm)
            return None
        progress.nonfinite_in_a_row = 0
        self.scaler.step(self.optimizer)  # skipped (fp16) when a gradient is inf or NaN
        self.scaler.update()
        progress.step += 1
        if tc.schedule == "time_budget":  # refit to the update rate measured so far
            progress.expected_steps = expected_updates(progress.step, self.elapsed() - self.setup_seconds,
                                                       tc.max_minutes * 60 - self.setup_seconds)
            if tc.max_steps:  # the budget is whichever ends first: the minutes or the updates
                progress.expected_steps = min(progress.expected_steps, tc.max_steps)
        self.scheduler.step()
        self.zero_grad()
        return loss_sum, nll_sum, local_tokens

    def zero_grad(self) -> None:
        """Clear the gradients for the next update: set to None, except under
        DistributedDataParallel, whose gradients are views into its all-reduce buckets
        (``distributed.wrap``): zeroed in place they stay views, where None would make each
        backward allocate them anew."""
        self.optimizer.zero_grad(set_to_none=not isinstance(self.ddp_loss, DistributedDataParallel))

    # ---- validation -------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation loss and perplexity (teacher forcing) and, with ``train.valid_bleu``, greedy
        BLEU and chrF (sacreBLEU) of the validation set, at the training precision. A
        multilingual model has a set per direction: the loss and perplexity are over all their
        tokens, BLEU and chrF the mean of the directions', each direction's in 'valid_directions'.
        The model is back in training mode afterwards, also when a stop signal ends it.

        Returns:
            {'valid_loss': label-smoothed loss per token, 'valid_ppl': exp(NLL per token),
             'valid_bleu', 'valid_chrf'} (None for what was not computed), and with several
            sets 'valid_directions': {name: {'bleu', 'chrf'}}.
        """
        sets = self.data.valid_sets
        if not sets:
            return {"valid_loss": None, "valid_ppl": None, "valid_bleu": None, "valid_chrf": None}
        self.model.eval()
        try:
            loss_sum, nll_sum, tokens, scores = self._valid_sums()
        finally:
            self.model.train()
        result = {"valid_loss": loss_sum / max(tokens, 1), "valid_ppl": math.exp(min(nll_sum / max(tokens, 1), 50)),
                  "valid_bleu": None, "valid_chrf": None}
        if scores:
            result["valid_bleu"] = sum(v["bleu"] for v in scores.values()) / len(scores)
            result["valid_chrf"] = sum(v["chrf"] for v in scores.values()) / len(scores)
        if len(sets) > 1:
            result["valid_directions"] = {name: {"bleu": v["bleu"], "chrf": v["chrf"]} for name, v in scores.items()}
        return result

    def _valid_sums(self) -> tuple[float, float, int, dict[str, dict]]:
        """(summed loss, summed NLL, target tokens) over every validation set, and each set's
        {'bleu', 'chrf'} by name (with ``train.valid_bleu``)."""
        tc = self.config.train
        start = self.config.model.decoder_start_id
        loss_sum = nll_sum = 0.0
        tokens = 0
        scores = {}
        with autocast(self.precision, self.device.type):
            for valid in self.data.valid_sets:
                data = valid.pairs
                for idx in token_batches(data.lengths(), tc.batch_tokens):
                    batch = make_batch([data.src[i] for i in idx], [data.tgt[i] for i in idx], start)
                    loss, nll = self.batch_loss(batch.to(self.device))
                    loss_sum += loss.item()
                    nll_sum += nll.item()
                    tokens += batch.num_tgt_tokens
                if tc.valid_bleu:
                    scores[valid.name] = corpus_scores(self._greedy_translations(data), valid.refs)
        return loss_sum, nll_sum, tokens, scores

    def _greedy_translations(self, data: EncodedCorpus, batch_size: int = 256) -> list[str]:
        """Detokenized greedy translations of ``data.src``, in order: the batch routine of
        ``attnmt translate`` (``attnmt.search.batched.native_search``), with the decode config's
        length limits and a beam of 1."""
        options = SearchOptions.from_config(self.config.decode, beam_size=1, nbest=1)
        hyps = native_search(self.model, [s + [EOS_ID] for s in data.src], options, batch_size, self.device)
        return [self.data.tgt_tok.decode([t for t in h.tokens if t != EOS_ID]) for [h] in hyps]
