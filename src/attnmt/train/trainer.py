"""The training loop (paper section 5) as a small :class:`Trainer`.

``Trainer(config, run_dir).run()`` does the whole job. Setup reads the corpus, trains the
SentencePiece model(s) (or reloads them on resume), encodes and filters the pairs and builds
the model and Adam with the configured learning-rate schedule. Each update (:meth:`train_step`)
takes ``accum_steps`` length-bucketed token batches, the label-smoothed loss with optional
bfloat16 autocast, and clips the gradient norm. Every ``valid_every`` updates
(:meth:`validate`) it computes validation loss, perplexity and greedy BLEU/chrF, keeps the best
weights as ``model.safetensors`` and writes the resumable state (:meth:`save_checkpoint`). It
stops (:meth:`stop_reason`) after ``max_steps``, ``max_epochs`` or ``max_minutes`` (wall clock,
leaving time for the final validation), or after ``stop_patience`` validations without
improvement; then it validates a last time and may average the last validation checkpoints.
Metrics go to ``train_log.jsonl`` (``attnmt.train.metrics``).

"Best" means higher validation BLEU, then lower perplexity.

Library: torch.optim (Adam, LambdaLR), tqdm.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from attnmt import rundir
from attnmt.config import Config
from attnmt.data.batching import Batch, make_batch, token_batches
from attnmt.data.corpus import EncodedCorpus, dataset_pair_files, encode_corpus, read_parallel
from attnmt.data.tokenizers import PAD_ID, Tokenizer
from attnmt.errors import CheckpointError, ConfigError
from attnmt.evaluate import corpus_scores
from attnmt.memory import peak_rss_mib
from attnmt.model.transformer import Transformer, count_parameters
from attnmt.precision import autocast, effective_precision
from attnmt.search.greedy import greedy_search
from attnmt.train.checkpoint import (LAST_STATE, STEP_WEIGHTS, average_weights, load_state, save_state,
                                     step_checkpoints)
from attnmt.train.losses import chunked_label_smoothed_cross_entropy, label_smoothed_cross_entropy
from attnmt.train.metrics import MetricsLog, Window
from attnmt.train.schedules import learning_rate

log = logging.getLogger(__name__)

CHUNKED_LOSS = True  # speed switch (memory): the loss without holding the (N, V) logits (attnmt.train.losses)


@dataclass
class TrainResult:
    """Summary of a finished run (also in the last line of train_log.jsonl)."""

    steps: int
    epochs_done: float
    minutes: float
    best_valid_bleu: float | None
    best_valid_ppl: float
    tgt_tokens_per_second: float


@dataclass
class Progress:
    """Where a run stands; saved in the resumable state."""

    step: int = 0  # updates done
    epoch: int = 0  # 0-based epoch in progress
    batch_in_epoch: int = 0  # batches of that epoch done
    elapsed_seconds: float = 0.0  # wall clock before this process
    best_bleu: float | None = None
    best_ppl: float = float("inf")
    best_key: tuple[float, float] = (-float("inf"), -float("inf"))  # (BLEU, -perplexity)
    bad_validations: int = 0  # validations since the last improvement


@dataclass
class CorpusData:
    """The encoded training and validation pairs and the tokenizers that made them."""

    src_tok: Tokenizer
    tgt_tok: Tokenizer
    train: EncodedCorpus
    valid: EncodedCorpus | None = None
    valid_refs: list[str] = field(default_factory=list)  # raw target lines of the kept validation pairs


def corpus_files(config: Config, split: str, data_dir: str | None) -> tuple[Path, Path] | None:
    """(source, target) paths of ``split`` ('train' or 'valid'), or None if there is no such split."""
    d = config.data
    if d.dataset is not None:
        name = d.train_split if split == "train" else d.valid_split
        if name is None:
            return None
        return dataset_pair_files(d.dataset, d.pair, name, data_dir or d.data_dir)
    if split == "train":
        return Path(d.train_src), Path(d.train_tgt)
    return (Path(d.valid_src), Path(d.valid_tgt)) if d.valid_src else None


def prepare_corpus(config: Config, run_dir: Path, resume: bool, data_dir: str | None) -> CorpusData:
    """Read the corpus, train the SentencePiece model(s) into ``run_dir`` (reload them on
    resume), encode the pairs and drop those with an empty side or longer than ``data.max_len``.

    Raises:
        DataError: unreadable or misaligned files. ConfigError: no usable training pair.
    """
    train_files, valid_files = corpus_files(config, "train", data_dir), corpus_files(config, "valid", data_dir)
    log.info("reading %s and %s", *train_files)
    train_src, train_tgt = read_parallel(*train_files)
    if resume:
        src_tok, tgt_tok = rundir.read_tokenizers(run_dir)
    else:
        src_tok, tgt_tok = _train_tokenizers(config, train_src, train_tgt)
        rundir.write_tokenizers(run_dir, src_tok, tgt_tok)
    train = encode_corpus(train_src, train_tgt, src_tok.encode_batch, tgt_tok.encode_batch, config.data.max_len)
    log.info("training pairs: %d kept, %d dropped as empty, %d dropped as longer than %d subwords",
             len(train.src), train.dropped_empty, train.dropped_long, config.data.max_len)
    if not train.src:
        raise ConfigError(f"{train_files[0]}: no usable training pairs")
    data = CorpusData(src_tok, tgt_tok, train)
    if valid_files is not None:
        vs, vt = read_parallel(*valid_files)
        if config.data.valid_max_sentences:
            vs, vt = vs[: config.data.valid_max_sentences], vt[: config.data.valid_max_sentences]
        data.valid = encode_corpus(vs, vt, src_tok.encode_batch, tgt_tok.encode_batch)
        data.valid_refs = [t for s, t in zip(vs, vt) if s and t]
    return data


def _train_tokenizers(config: Config, src_lines: list[str], tgt_lines: list[str]) -> tuple[Tokenizer, Tokenizer]:
    tc = config.tokenizer
    options = dict(vocab_size=tc.vocab_size, model_type=tc.model_type, character_coverage=tc.character_coverage,
                   max_sentences=tc.max_sentences, seed=config.train.seed)
    if tc.joint:
        log.info("training a joint SentencePiece %s model (%d pieces)", tc.model_type, tc.vocab_size)
        tok = Tokenizer.train(src_lines + tgt_lines, **options)
        return tok, tok
    log.info("training source and target SentencePiece %s models (%d pieces each)", tc.model_type, tc.vocab_size)
    return Tokenizer.train(src_lines, **options), Tokenizer.train(tgt_lines, **options)


class Trainer:
    """Trains a model into a run directory (module docstring).

    Args:
        config: the validated configuration; on ``resume`` its model and tokenizer sections
            must equal those saved in ``run_dir``.
        run_dir: the model directory to create (or, with ``resume``, to continue).
        resume: continue from ``run_dir``'s ``checkpoints/last.pt``.
        data_dir: local dataset directory (overrides ``data.data_dir`` and ``ATTNMT_DATA``).
        progress: show a tqdm progress bar on a terminal.
    Raises:
        ConfigError, DataError, CheckpointError: bad configuration, corpus or run directory.
    """

    def __init__(self, config: Config, run_dir: str | Path, resume: bool = False, data_dir: str | None = None,
                 progress: bool = True):
        self.start_time = time.monotonic()
        self.config, self.run_dir, self.progress_bar = config, Path(run_dir), progress
        tc = config.train
        state = self._check_run_dir(resume)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if tc.num_threads:
            torch.set_num_threads(tc.num_threads)
        self.precision = effective_precision(tc.precision, "training")
        torch.manual_seed(tc.seed)
        self.data = prepare_corpus(config, self.run_dir, resume, data_dir)
        rundir.write_config(config, self.run_dir)
        self.model = Transformer(config.model, len(self.data.src_tok), len(self.data.tgt_tok), pad_id=PAD_ID)
        log.info("model: %d parameters; vocabulary %d/%d", count_parameters(self.model), len(self.data.src_tok),
                 len(self.data.tgt_tok))
        self.params = list({id(p): p for p in self.model.parameters()}.values())  # tied tensors once
        # The schedule gives the learning rate itself (base rate 1.0, as in the Annotated
        # Transformer); LambdaLR's step i is the (i + 1)-th update. fused=True: speed switch,
        # PyTorch's one-kernel Adam update (same update rule).
        self.optimizer = torch.optim.Adam(self.params, lr=1.0, betas=tc.adam_betas, eps=tc.adam_eps,
                                          weight_decay=tc.weight_decay, fused=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda i: learning_rate(
            tc.schedule, i + 1, d_model=config.model.d_model, lr=tc.lr, lr_factor=tc.lr_factor,
            warmup_steps=tc.warmup_steps))
        self.state = Progress()
        if state is not None:
            self._restore(state)
        self.metrics = MetricsLog(self.run_dir / "train_log.jsonl")
        self.step_ckpts = step_checkpoints(self.run_dir)
        self.valid_seconds = 0.0  # duration of the last validation, reserved at the end of the budget
        self.window = Window()
        self.run_tokens, self.run_seconds = 0, 0.0  # target tokens and update time of this process
        self.bar: tqdm | None = None  # the progress bar, while run() runs
        self._last_lr = 0.0  # the learning rate of the latest update

    def _check_run_dir(self, resume: bool) -> dict | None:
        """The state to resume from (None for a new run); refuses to overwrite a run."""
        if not resume:
            if (self.run_dir / LAST_STATE).exists():
                raise CheckpointError(f"{self.run_dir} already holds a run; pass --resume to continue it "
                                      "or choose another --output")
            return None
        saved = rundir.read_config(self.run_dir)
        if saved.model != self.config.model or saved.tokenizer != self.config.tokenizer:
            raise ConfigError(f"{self.run_dir}/config.yaml: model or tokenizer settings differ from the run "
                              "being resumed")
        return load_state(self.run_dir / LAST_STATE)

    def _restore(self, state: dict) -> None:
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            progress = dict(state["progress"])
        except (KeyError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"{self.run_dir / LAST_STATE}: does not fit this run: {e}") from None
        progress["best_key"] = tuple(progress["best_key"])
        self.state = Progress(**progress)
        torch.set_rng_state(state["torch_rng"])
        log.info("resumed from step %d (epoch %d, batch %d)", self.state.step, self.state.epoch + 1,
                 self.state.batch_in_epoch)

    def elapsed(self) -> float:
        """Wall-clock seconds of the whole run, earlier processes included."""
        return self.state.elapsed_seconds + time.monotonic() - self.start_time

    # ---- one update ---------------------------------------------------------------------------

    def batch_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed label-smoothed loss and summed NLL of one teacher-forced batch (float32 scalars)."""
        eps, target = self.config.train.label_smoothing, batch.tgt_out.flatten()  # (B*T,)
        if not CHUNKED_LOSS:
            logits = self.model(batch.src, batch.tgt_in)  # (B, T, V)
            return label_smoothed_cross_entropy(logits.flatten(0, 1), target, eps, PAD_ID)
        # Speed switch (memory): the loss from the decoder states and the output projection.
        memory, src_mask, _ = self.model.encode(batch.src)
        states, _, _ = self.model.decoder.features(batch.tgt_in, memory, src_mask)  # (B, T, D)
        projection = self.model.decoder.output_projection
        return chunked_label_smoothed_cross_entropy(states.flatten(0, 1), projection.weight, target, eps, PAD_ID,
                                                    projection.bias)

    def train_step(self, batches: list[Batch]) -> tuple[float, float, int]:
        """One update from ``batches`` (gradients accumulated): the loss is summed over their
        target tokens and divided by the total, the gradient norm clipped to ``clip_norm``, then
        Adam and the schedule step. Returns (summed loss, summed NLL, target tokens)."""
        tokens = sum(b.num_tgt_tokens for b in batches)
        loss_sum = nll_sum = 0.0
        for b in batches:
            with autocast(self.precision):
                loss, nll = self.batch_loss(b)
            (loss / tokens).backward()
            loss_sum += loss.item()
            nll_sum += nll.item()
        if self.config.train.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.config.train.clip_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        return loss_sum, nll_sum, tokens

    # ---- validation and checkpoints -----------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation loss and perplexity (teacher forcing) and, with ``train.valid_bleu``, greedy
        BLEU and chrF (sacreBLEU) of the validation set, at the training precision.

        Returns:
            {'valid_loss': label-smoothed loss per token, 'valid_ppl': exp(NLL per token),
             'valid_bleu', 'valid_chrf'} (None for what was not computed).
        """
        data, tc = self.data.valid, self.config.train
        if data is None:
            return {"valid_loss": None, "valid_ppl": None, "valid_bleu": None, "valid_chrf": None}
        self.model.eval()
        loss_sum = nll_sum = 0.0
        tokens = 0
        with autocast(self.precision):
            for idx in token_batches(data.lengths(), tc.batch_tokens):
                batch = make_batch([data.src[i] for i in idx], [data.tgt[i] for i in idx])
                loss, nll = self.batch_loss(batch)
                loss_sum, nll_sum, tokens = loss_sum + loss.item(), nll_sum + nll.item(), tokens + batch.num_tgt_tokens
            scores = corpus_scores(self._greedy_translations(data), self.data.valid_refs) if tc.valid_bleu else {}
        self.model.train()
        return {"valid_loss": loss_sum / max(tokens, 1), "valid_ppl": math.exp(min(nll_sum / max(tokens, 1), 50)),
                "valid_bleu": scores.get("bleu"), "valid_chrf": scores.get("chrf")}

    def _greedy_translations(self, data: EncodedCorpus, batch_size: int = 256) -> list[str]:
        """Detokenized greedy translations of ``data.src``, in order (length-sorted batches)."""
        dc, hyps = self.config.decode, [""] * len(data.src)
        order = sorted(range(len(data.src)), key=lambda i: len(data.src[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start: start + batch_size]
            batch = make_batch([data.src[i] for i in chunk], [[] for _ in chunk])
            for i, h in zip(chunk, greedy_search(self.model, batch.src, dc.max_len_a, dc.max_len_b)):
                hyps[i] = self.data.tgt_tok.decode(h.tokens)
        return hyps

    def validate(self) -> dict:
        """Evaluate, keep the weights if they are the best so far, keep a step checkpoint for
        averaging, write the resumable state and log the result."""
        t0 = time.monotonic()
        result = self.evaluate()
        self.valid_seconds = time.monotonic() - t0
        s, step = self.state, self.state.step
        improved = self._keep_if_best(result, {"step": str(step)})
        s.bad_validations = 0 if improved else s.bad_validations + 1
        if self.config.train.average_last > 1:
            self._keep_step_checkpoint()
        self.save_checkpoint()
        self.metrics.write("valid", step=step, epoch=s.epoch + 1, seconds=round(self.elapsed(), 1), **result,
                           best=improved)
        log.info("step %d valid: loss %.3f ppl %.2f bleu %s chrf %s%s (%.1fs)", step, result["valid_loss"] or 0,
                 result["valid_ppl"] or 0, _fmt(result["valid_bleu"]), _fmt(result["valid_chrf"]),
                 " (best)" if improved else "", self.valid_seconds)
        return result

    def _selection_key(self, result: dict) -> tuple[float, float]:
        """(BLEU, -perplexity); without validation data (step, 0): the latest is the best."""
        if result["valid_ppl"] is None:
            return (float(self.state.step), 0.0)
        return (result["valid_bleu"] if result["valid_bleu"] is not None else 0.0, -result["valid_ppl"])

    def _keep_if_best(self, result: dict, metadata: dict[str, str]) -> bool:
        """If ``result`` is the best so far, record it and save the model as ``model.safetensors``."""
        key = self._selection_key(result)
        if key <= self.state.best_key:
            return False
        s = self.state
        s.best_bleu, s.best_ppl, s.best_key = result["valid_bleu"], result["valid_ppl"] or float("inf"), key
        rundir.save_weights(self.model, self.run_dir / rundir.WEIGHTS, metadata)
        return True

    def _keep_step_checkpoint(self) -> None:
        path = self.run_dir / STEP_WEIGHTS.format(step=self.state.step)
        rundir.save_weights(self.model, path, {"step": str(self.state.step)})
        self.step_ckpts.append(path)
        while len(self.step_ckpts) > self.config.train.average_last:
            self.step_ckpts.pop(0).unlink(missing_ok=True)

    def save_checkpoint(self) -> None:
        """Write ``checkpoints/last.pt``: everything an exact resume needs."""
        progress = asdict(self.state)
        progress.update(elapsed_seconds=self.elapsed(), best_key=list(self.state.best_key))
        save_state({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(), "progress": progress,
                    "torch_rng": torch.get_rng_state()}, self.run_dir / LAST_STATE)

    def average_checkpoints(self) -> None:
        """Average the last validation checkpoints; keep the average as ``model.safetensors`` if
        it validates better than the best so far. The model's own weights are left unchanged."""
        backup = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(average_weights(self.step_ckpts), strict=False)
        result = self.evaluate()
        improved = self._keep_if_best(result, {"step": str(self.state.step), "averaged": str(len(self.step_ckpts))})
        self.metrics.write("average", step=self.state.step, checkpoints=len(self.step_ckpts), **result,
                           best=improved)
        log.info("average of %d checkpoints: ppl %.2f bleu %s%s", len(self.step_ckpts), result["valid_ppl"],
                 _fmt(result["valid_bleu"]), " (kept)" if improved else " (not better; discarded)")
        self.model.load_state_dict(backup)

    # ---- the loop -----------------------------------------------------------------------------

    def stop_reason(self) -> str | None:
        """Why training must stop after the update just done, or None to go on."""
        tc, step = self.config.train, self.state.step
        if tc.max_steps and step >= tc.max_steps:
            return f"reached max_steps {tc.max_steps}"
        if tc.max_minutes and self.elapsed() + 1.5 * self.valid_seconds + 5 >= tc.max_minutes * 60:
            return f"reached the {tc.max_minutes:g}-minute budget"
        return None

    def _log_window(self) -> None:
        s, summary, budget = self.state, self.window.summary(), self.config.train.max_minutes
        eta = f"{(budget * 60 - self.elapsed()) / 60:.0f}m" if budget else "-"
        self.bar.set_postfix(loss=f"{summary['loss']:.3f}", lr=f"{self._last_lr:.2e}",
                             tok_s=f"{summary['tgt_tokens_per_s']:.0f}", ep=s.epoch + 1, eta=eta)
        self.metrics.write("train", step=s.step, epoch=s.epoch + 1, seconds=round(self.elapsed(), 1),
                           loss=summary["loss"], ppl=summary["ppl"], lr=self._last_lr,
                           tgt_tokens_per_s=summary["tgt_tokens_per_s"], peak_rss_mib=peak_rss_mib())
        if self.bar.disable:
            log.info("step %d epoch %d loss %.3f lr %.2e %.0f tgt tok/s elapsed %.1f min", s.step, s.epoch + 1,
                     summary["loss"], self._last_lr, summary["tgt_tokens_per_s"], self.elapsed() / 60)
        self.window.reset()

    def _run_epoch(self, batches: list[list[int]]) -> str | None:
        """Updates over the rest of one epoch's batches; returns a stop reason, or None at its end."""
        tc, s, corpus = self.config.train, self.state, self.data.train
        while s.batch_in_epoch < len(batches):
            group = batches[s.batch_in_epoch: s.batch_in_epoch + tc.accum_steps]
            built = [make_batch([corpus.src[i] for i in idx], [corpus.tgt[i] for i in idx]) for idx in group]
            t0 = time.monotonic()
            self._last_lr = self.scheduler.get_last_lr()[0]  # the rate of this update
            loss, nll, tokens = self.train_step(built)
            s.batch_in_epoch += len(group)
            self.run_tokens, self.run_seconds = self.run_tokens + tokens, self.run_seconds + time.monotonic() - t0
            self.window.add(tokens, loss, nll)
            self.bar.update(1)
            if s.step % tc.log_every == 0:
                self._log_window()
            reason = self.stop_reason()
            if s.step % tc.valid_every == 0 and reason is None:
                self.validate()
                self.window.start = time.monotonic()
                if tc.stop_patience and s.bad_validations >= tc.stop_patience:
                    reason = f"no improvement in {tc.stop_patience} validations"
            if reason:
                return reason
        return None

    def run(self) -> TrainResult:
        """Train until a stop condition, validate a last time, average checkpoints if configured.

        Returns:
            The run's :class:`TrainResult`.
        """
        tc, s = self.config.train, self.state
        self.model.train()
        self.bar = tqdm(total=tc.max_steps, initial=s.step, disable=None if self.progress_bar else True,
                        unit="upd", dynamic_ncols=True, desc="train")
        reason = None
        while reason is None:
            batches = token_batches(self.data.train.lengths(), tc.batch_tokens, seed=tc.seed, epoch=s.epoch)
            reason = self._run_epoch(batches)
            if reason is None:
                s.epoch, s.batch_in_epoch = s.epoch + 1, 0
                if tc.max_epochs and s.epoch >= tc.max_epochs:
                    reason = f"reached max_epochs {tc.max_epochs}"
        self.bar.close()
        log.info("stopping: %s", reason)
        last = self.validate()
        if tc.average_last > 1 and len(self.step_ckpts) > 1 and self.data.valid is not None:
            self.average_checkpoints()
        result = TrainResult(steps=s.step, epochs_done=s.epoch + s.batch_in_epoch / max(len(batches), 1),
                             minutes=self.elapsed() / 60, best_valid_bleu=s.best_bleu, best_valid_ppl=s.best_ppl,
                             tgt_tokens_per_second=self.run_tokens / max(self.run_seconds, 1e-9))
        self.metrics.write("done", **asdict(result), precision=self.precision, stop_reason=reason,
                           last_valid_bleu=last["valid_bleu"])
        log.info("done: %d updates, %.1f epochs, %.1f minutes, best valid BLEU %s, %.0f tgt tok/s", s.step,
                 result.epochs_done, result.minutes, _fmt(s.best_bleu), result.tgt_tokens_per_second)
        return result


def train(config: Config, run_dir: str | Path, resume: bool = False, data_dir: str | None = None,
          progress: bool = True) -> TrainResult:
    """``Trainer(config, run_dir, resume, data_dir, progress).run()``: see :class:`Trainer`."""
    if config.data is None:
        raise ConfigError("the configuration has no data section: nothing to train on")
    return Trainer(config, run_dir, resume, data_dir, progress).run()


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
