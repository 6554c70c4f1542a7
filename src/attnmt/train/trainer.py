"""The training loop (paper section 5): data, optimisation, validation, checkpoints, resume.

``train(config, run_dir)`` does the whole job: resolve and read the corpus, train (or on
``resume`` reload) the SentencePiece model(s), encode and filter the pairs, then update the
model on length-bucketed token batches with Adam and the configured schedule, label-smoothed
loss, gradient accumulation, optional bfloat16 autocast and gradient-norm clipping. Every
``valid_every`` updates it computes validation loss, perplexity and (greedy) BLEU, keeps the
best weights as ``model.safetensors`` and writes the resumable state ``checkpoints/last.pt``.
It stops after ``max_steps``, ``max_epochs`` or ``max_minutes`` (wall clock, leaving time for
the final validation), whichever comes first. Metrics go to ``train_log.jsonl``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from attnmt.config import Config, save_config
from attnmt.data.batching import Batch, make_batch, token_batches
from attnmt.data.corpus import EncodedCorpus, dataset_pair_files, encode_corpus, read_parallel
from attnmt.data.tokenizers import PAD_ID, Tokenizer
from attnmt.decode.greedy import greedy_search
from attnmt.decode.translator import load_run_config, load_tokenizers
from attnmt.errors import CheckpointError, ConfigError
from attnmt.evaluate import corpus_scores
from attnmt.model.transformer import Transformer, count_parameters
from attnmt.runtime import effective_precision, peak_rss_mib
from attnmt.train.checkpoint import (LAST_STATE, WEIGHTS, average_weights, load_state, load_weights,
                                     save_state, save_weights)
from attnmt.train.losses import label_smoothed_nll_loss
from attnmt.train.schedules import learning_rate

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """Summary of a finished run (also the last line of train_log.jsonl)."""

    steps: int
    epochs_done: float
    minutes: float
    best_valid_bleu: float | None
    best_valid_ppl: float
    tgt_tokens_per_second: float


def corpus_files(config: Config, split: str, data_dir: str | None) -> tuple[Path, Path] | None:
    """(source, target) paths of ``split`` ('train' or 'valid'), or None if no such split."""
    d = config.data
    if d.dataset is not None:
        name = d.train_split if split == "train" else d.valid_split
        if name is None:
            return None
        return dataset_pair_files(d.dataset, d.pair, name, data_dir or d.data_dir)
    if split == "train":
        return Path(d.train_src), Path(d.train_tgt)
    return (Path(d.valid_src), Path(d.valid_tgt)) if d.valid_src else None


def autocast(precision: str):
    """bfloat16 autocast on CPU when ``precision == 'bf16'``, else a no-op context."""
    if precision == "bf16":
        return torch.autocast(device_type="cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class _Log:
    """Metrics: an append-only JSON-lines file (one object per line) and, when the
    ``tensorboard`` package is installed, the same numbers as TensorBoard scalars
    (``RUN_DIR/tensorboard``, tags ``train/loss``, ``valid/valid_bleu``, ...)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            self.tensorboard = None
        else:
            self.tensorboard = SummaryWriter(log_dir=str(path.parent / "tensorboard"))

    def write(self, **record) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None and "step" in record:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                    self.tensorboard.add_scalar(f"{record['kind']}/{key}", value, record["step"])
            self.tensorboard.flush()


def _prepare_tokenizers(config: Config, run_dir: Path, src_lines: list[str], tgt_lines: list[str],
                        resume: bool) -> tuple[Tokenizer, Tokenizer]:
    if resume:
        return load_tokenizers(run_dir)
    tc = config.tokenizer
    kwargs = dict(vocab_size=tc.vocab_size, model_type=tc.model_type, character_coverage=tc.character_coverage,
                  max_sentences=tc.max_sentences, seed=config.train.seed)
    if tc.joint:
        log.info("training a joint SentencePiece %s model (%d pieces)", tc.model_type, tc.vocab_size)
        tok = Tokenizer.train(src_lines + tgt_lines, **kwargs)
        tok.save(run_dir / "spm.model")
        return tok, tok
    log.info("training source and target SentencePiece %s models (%d pieces each)", tc.model_type, tc.vocab_size)
    src_tok, tgt_tok = Tokenizer.train(src_lines, **kwargs), Tokenizer.train(tgt_lines, **kwargs)
    src_tok.save(run_dir / "src.spm.model")
    tgt_tok.save(run_dir / "tgt.spm.model")
    return src_tok, tgt_tok


def batch_loss(model: Transformer, batch: Batch, label_smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss and summed NLL of one teacher-forced batch (float32 scalars,
    ``attnmt.train.losses.label_smoothed_nll_loss`` on the decoder states and output weight)."""
    states = model.decoder_states(batch.src, batch.tgt_in)  # (B, T, D)
    return label_smoothed_nll_loss(states.flatten(0, 1), model.decoder.output_projection.weight,
                                   batch.tgt_out.flatten(), label_smoothing, PAD_ID)


@torch.no_grad()
def validate(model: Transformer, data: EncodedCorpus, refs: list[str], tgt_tok: Tokenizer, config: Config,
             with_bleu: bool) -> dict:
    """Validation loss and perplexity (teacher forcing) and, with ``with_bleu``, greedy BLEU/chrF.

    Runs at ``config.train.precision`` as ``attnmt.runtime.effective_precision`` resolves it on
    this CPU (as training does).

    Returns:
        {'valid_loss': label-smoothed loss per token, 'valid_ppl': exp(nll per token),
         'valid_bleu': float or None, 'valid_chrf': float or None}.
    """
    model.eval()
    total_loss = total_nll = 0.0
    tokens = 0
    with autocast(effective_precision(config.train.precision, "training")):
        for idx in token_batches(data.lengths(), config.train.batch_tokens):
            batch = make_batch([data.src[i] for i in idx], [data.tgt[i] for i in idx])
            loss, nll = batch_loss(model, batch, config.train.label_smoothing)
            total_loss += loss.item()
            total_nll += nll.item()
            tokens += batch.num_tgt_tokens
        bleu = chrf = None
        if with_bleu:
            hyps = [""] * len(data.src)
            dc = config.decode
            order = sorted(range(len(data.src)), key=lambda i: len(data.src[i]))
            for start in range(0, len(order), 256):
                chunk = order[start: start + 256]
                batch = make_batch([data.src[i] for i in chunk], [[] for _ in chunk])
                for i, h in zip(chunk, greedy_search(model, batch.src, dc.max_len_a, dc.max_len_b)):
                    hyps[i] = tgt_tok.decode(h.tokens)
            scores = corpus_scores(hyps, refs)
            bleu, chrf = scores["bleu"], scores["chrf"]
    model.train()
    return {"valid_loss": total_loss / max(tokens, 1), "valid_ppl": math.exp(min(total_nll / max(tokens, 1), 50)),
            "valid_bleu": bleu, "valid_chrf": chrf}


def train(config: Config, run_dir: str | Path, resume: bool = False, data_dir: str | None = None,
          progress: bool = True) -> TrainResult:
    """Train a model into ``run_dir`` (see the module docstring).

    Args:
        config: the validated configuration; on ``resume``, its model and tokenizer sections
            must equal those saved in ``run_dir``.
        data_dir: local dataset directory (overrides ``data.data_dir`` and ``ATTNMT_DATA``).
        progress: show a tqdm progress bar on a terminal.
    Raises:
        ConfigError, DataError, CheckpointError: bad configuration, corpus or run directory.
    """
    start_time = time.monotonic()
    run_dir = Path(run_dir)
    tc = config.train
    if resume:
        saved = load_run_config(run_dir)
        if saved.model != config.model or saved.tokenizer != config.tokenizer:
            raise ConfigError(f"{run_dir}/config.yaml: model or tokenizer settings differ from the run being resumed")
        state = load_state(run_dir / LAST_STATE)
    else:
        if (run_dir / LAST_STATE).exists():
            raise CheckpointError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --output")
        state = None
    run_dir.mkdir(parents=True, exist_ok=True)
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    precision = effective_precision(tc.precision, "training")
    torch.manual_seed(tc.seed)

    train_files = corpus_files(config, "train", data_dir)
    valid_files = corpus_files(config, "valid", data_dir)
    log.info("reading %s and %s", *train_files)
    train_src, train_tgt = read_parallel(*train_files)
    src_tok, tgt_tok = _prepare_tokenizers(config, run_dir, train_src, train_tgt, resume)
    save_config(config, run_dir / "config.yaml")
    train_data = encode_corpus(train_src, train_tgt, src_tok.encode_batch, tgt_tok.encode_batch,
                               config.data.max_len)
    log.info("training pairs: %d kept, %d dropped as empty, %d dropped as longer than %d subwords",
             len(train_data.src), train_data.dropped_empty, train_data.dropped_long, config.data.max_len)
    if not train_data.src:
        raise ConfigError(f"{train_files[0]}: no usable training pairs")
    valid_data, valid_refs = None, []
    if valid_files is not None:
        vs, vt = read_parallel(*valid_files)
        if config.data.valid_max_sentences:
            vs, vt = vs[: config.data.valid_max_sentences], vt[: config.data.valid_max_sentences]
        valid_data = encode_corpus(vs, vt, src_tok.encode_batch, tgt_tok.encode_batch)
        valid_refs = [t for s, t in zip(vs, vt) if s and t]

    model = Transformer(config.model, len(src_tok), len(tgt_tok))
    log.info("model: %d parameters; vocabulary %d/%d", count_parameters(model), len(src_tok), len(tgt_tok))
    params = list({id(p): p for p in model.parameters()}.values())
    # fused=True: PyTorch's one-kernel Adam update (same update rule and results); for the
    # benchmark's 6M-parameter model it took 6 ms instead of 25 ms per update (2-core AVX2 CPU).
    optimizer = torch.optim.Adam(params, lr=0.0, betas=tc.adam_betas, eps=tc.adam_eps, weight_decay=tc.weight_decay,
                                 fused=True)
    step, epoch, batch_in_epoch, elapsed_before = 0, 0, 0, 0.0
    best = {"bleu": None, "ppl": float("inf"), "key": (-float("inf"), -float("inf"))}
    bad_validations = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        elapsed_before = state["elapsed_seconds"]
        best = {"bleu": state["best_bleu"], "ppl": state["best_ppl"], "key": tuple(state["best_key"])}
        bad_validations = state["bad_validations"]
        torch.set_rng_state(state["torch_rng"])
        log.info("resumed from step %d (epoch %d, batch %d)", step, epoch + 1, batch_in_epoch)

    metrics = _Log(run_dir / "train_log.jsonl")
    lengths = train_data.lengths()
    budget_s = tc.max_minutes * 60 if tc.max_minutes else None
    valid_seconds = 0.0  # duration of the last validation, reserved at the end of the budget
    step_ckpts: list[Path] = sorted((run_dir / "checkpoints").glob("step_*.safetensors"),
                                    key=lambda p: int(p.stem.split("_")[1]))

    def elapsed() -> float:
        return elapsed_before + time.monotonic() - start_time

    def save_last() -> None:
        save_state({
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "epoch": epoch,
            "batch_in_epoch": batch_in_epoch, "elapsed_seconds": elapsed(), "best_bleu": best["bleu"],
            "best_ppl": best["ppl"], "best_key": list(best["key"]), "bad_validations": bad_validations,
            "torch_rng": torch.get_rng_state(),
        }, run_dir / LAST_STATE)

    def run_validation() -> dict:
        nonlocal valid_seconds, bad_validations
        t0 = time.monotonic()
        if valid_data is None:
            result = {"valid_loss": None, "valid_ppl": None, "valid_bleu": None, "valid_chrf": None}
        else:
            result = validate(model, valid_data, valid_refs, tgt_tok, config, tc.valid_bleu)
        valid_seconds = time.monotonic() - t0
        key = _selection_key(result, step)
        improved = key > best["key"]
        if improved:
            best.update(bleu=result["valid_bleu"], ppl=result["valid_ppl"] or float("inf"), key=key)
            save_weights(model, run_dir / WEIGHTS, {"step": str(step)})
            bad_validations = 0
        else:
            bad_validations += 1
        if tc.average_last > 1:
            path = run_dir / "checkpoints" / f"step_{step}.safetensors"
            save_weights(model, path, {"step": str(step)})
            step_ckpts.append(path)
            while len(step_ckpts) > tc.average_last:
                step_ckpts.pop(0).unlink(missing_ok=True)
        save_last()
        metrics.write(kind="valid", step=step, epoch=epoch + 1, seconds=round(elapsed(), 1),
                      **{k: v for k, v in result.items()}, best=improved)
        log.info("step %d valid: loss %.3f ppl %.2f bleu %s chrf %s%s (%.1fs)", step, result["valid_loss"] or 0,
                 result["valid_ppl"] or 0, _fmt(result["valid_bleu"]), _fmt(result["valid_chrf"]),
                 " (best)" if improved else "", valid_seconds)
        return result

    model.train()
    bar = tqdm(total=tc.max_steps, initial=step, disable=None if progress else True, unit="upd",
               dynamic_ncols=True, desc="train")
    window_tokens, window_start, window_loss, window_nll = 0, time.monotonic(), 0.0, 0.0
    run_tokens, run_train_seconds = 0, 0.0
    stop_reason = None
    while stop_reason is None:
        batches = token_batches(lengths, tc.batch_tokens, seed=tc.seed, epoch=epoch)
        while batch_in_epoch < len(batches):
            group = batches[batch_in_epoch: batch_in_epoch + tc.accum_steps]
            built = [make_batch([train_data.src[i] for i in idx], [train_data.tgt[i] for i in idx]) for idx in group]
            n_tokens = sum(b.num_tgt_tokens for b in built)
            step_start = time.monotonic()
            lr = learning_rate(tc.schedule, step + 1, d_model=config.model.d_model, lr=tc.lr,
                               lr_factor=tc.lr_factor, warmup_steps=tc.warmup_steps)
            for g in optimizer.param_groups:
                g["lr"] = lr
            step_loss = step_nll = 0.0
            for b in built:
                with autocast(precision):
                    loss, nll = batch_loss(model, b, tc.label_smoothing)
                (loss / n_tokens).backward()
                step_loss += loss.item()
                step_nll += nll.item()
            if tc.clip_norm:
                torch.nn.utils.clip_grad_norm_(params, tc.clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            batch_in_epoch += len(group)
            run_tokens += n_tokens
            run_train_seconds += time.monotonic() - step_start
            window_tokens += n_tokens
            window_loss += step_loss
            window_nll += step_nll
            bar.update(1)
            if step % tc.log_every == 0:
                now = time.monotonic()
                tok_s = window_tokens / max(now - window_start, 1e-9)
                loss_tok = window_loss / max(window_tokens, 1)
                bar.set_postfix(loss=f"{loss_tok:.3f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:.0f}", ep=epoch + 1,
                                eta=f"{(budget_s - elapsed()) / 60:.0f}m" if budget_s else "-")
                metrics.write(kind="train", step=step, epoch=epoch + 1, seconds=round(elapsed(), 1), loss=loss_tok,
                              ppl=math.exp(min(window_nll / max(window_tokens, 1), 50)), lr=lr, tgt_tokens_per_s=tok_s,
                              peak_rss_mib=peak_rss_mib())
                if bar.disable:
                    log.info("step %d epoch %d loss %.3f lr %.2e %.0f tgt tok/s elapsed %.1f min", step, epoch + 1,
                             loss_tok, lr, tok_s, elapsed() / 60)
                window_tokens, window_start, window_loss, window_nll = 0, now, 0.0, 0.0
            if tc.max_steps and step >= tc.max_steps:
                stop_reason = f"reached max_steps {tc.max_steps}"
            elif budget_s and elapsed() + 1.5 * valid_seconds + 5 >= budget_s:
                stop_reason = f"reached the {tc.max_minutes:g}-minute budget"
            if step % tc.valid_every == 0 and stop_reason is None:
                run_validation()
                window_start = time.monotonic()
                if tc.stop_patience and bad_validations >= tc.stop_patience:
                    stop_reason = f"no improvement in {tc.stop_patience} validations"
            if stop_reason:
                break
        else:
            epoch += 1
            batch_in_epoch = 0
            if tc.max_epochs and epoch >= tc.max_epochs:
                stop_reason = f"reached max_epochs {tc.max_epochs}"
    bar.close()
    log.info("stopping: %s", stop_reason)
    last = run_validation()
    if tc.average_last > 1 and len(step_ckpts) > 1 and valid_data is not None:
        _try_average(model, step_ckpts, run_dir, valid_data, valid_refs, tgt_tok, config, best, metrics, step)
    minutes = elapsed() / 60
    result = TrainResult(steps=step, epochs_done=epoch + batch_in_epoch / max(len(batches), 1), minutes=minutes,
                         best_valid_bleu=best["bleu"], best_valid_ppl=best["ppl"],
                         tgt_tokens_per_second=run_tokens / max(run_train_seconds, 1e-9))
    metrics.write(kind="done", **result.__dict__, precision=precision, stop_reason=stop_reason,
                  last_valid_bleu=last["valid_bleu"])
    log.info("done: %d updates, %.1f epochs, %.1f minutes, best valid BLEU %s, %.0f tgt tok/s",
             step, result.epochs_done, minutes, _fmt(best["bleu"]), result.tgt_tokens_per_second)
    return result


def _try_average(model, step_ckpts, run_dir, valid_data, valid_refs, tgt_tok, config, best, metrics, step) -> None:
    """Average the last validation checkpoints; keep the average if it validates better."""
    backup = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(average_weights(step_ckpts), strict=False)
    result = validate(model, valid_data, valid_refs, tgt_tok, config, config.train.valid_bleu)
    key = _selection_key(result, step)
    improved = key > best["key"]
    metrics.write(kind="average", step=step, checkpoints=len(step_ckpts), **result, best=improved)
    log.info("average of %d checkpoints: ppl %.2f bleu %s%s", len(step_ckpts), result["valid_ppl"],
             _fmt(result["valid_bleu"]), " (kept)" if improved else " (not better; discarded)")
    if improved:
        best.update(bleu=result["valid_bleu"], ppl=result["valid_ppl"], key=key)
        save_weights(model, run_dir / WEIGHTS, {"step": str(step), "averaged": str(len(step_ckpts))})
    model.load_state_dict(backup)


def _selection_key(result: dict, step: int) -> tuple[float, float]:
    """What 'best' means: higher validation BLEU, then lower perplexity (without validation
    data, the latest step)."""
    if result["valid_ppl"] is None:
        return (float(step), 0.0)
    bleu = result["valid_bleu"] if result["valid_bleu"] is not None else 0.0
    return (bleu, -result["valid_ppl"])


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
