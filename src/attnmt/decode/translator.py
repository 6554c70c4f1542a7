"""Raw text in, raw text out: load a model directory and translate sentences with it.

``Translator`` ties the pieces a user should not have to assemble: the SentencePiece
model(s), the Transformer weights, length-sorted batching, greedy or beam search, and
detokenization. Empty input lines give empty translations, so output lines match input lines.

Shapes: B batch, S source length, T output length, L layers, H heads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnmt.config import Config
from attnmt.data.batching import pad_sequences
from attnmt.data.tokenizers import EOS_ID, Tokenizer
from attnmt.device import configure, resolve_device, to_device
from attnmt.model.transformer import Transformer
from attnmt.precision import PRECISIONS, effective_precision
from attnmt.rundir import load_model_dir
from attnmt.search.beam import beam_search
from attnmt.search.greedy import greedy_search
from attnmt.search.hypothesis import Hypothesis

log = logging.getLogger(__name__)


@dataclass
class ScoredHypothesis:
    """One translation candidate.

    text: detokenized output. token_ids: output ids (ending with EOS unless cut at the length
    limit). pieces: their subword strings (EOS shown as '</s>').
    token_log_probs: natural-log probability of each piece. log_prob: their sum.
    score: log_prob / length penalty (beam search) or log_prob (greedy); with
    ``decode.length_penalty_type: average`` log_prob / len(token_ids) in both.
    """

    text: str
    token_ids: list[int]
    pieces: list[str]
    token_log_probs: list[float]
    log_prob: float
    score: float


@dataclass
class Translation:
    """The result for one input sentence.

    hypotheses: best first (``nbest`` of them). src_pieces: source subwords incl. '</s>'.
    attention: when requested, the best hypothesis' encoder-decoder attention, float32
    (L, H, T, S) with T = len(hypotheses[0].pieces) and S = len(src_pieces).
    """

    hypotheses: list[ScoredHypothesis]
    src_pieces: list[str] = field(default_factory=list)
    attention: torch.Tensor | None = None

    @property
    def text(self) -> str:
        """The best translation."""
        return self.hypotheses[0].text if self.hypotheses else ""


def average_log_prob(h: Hypothesis) -> float:
    """The mean log-probability per output token, EOS included: sum / (n + 1) for n words and
    EOS (OpenNMT-py's ``avg`` length normalisation, CTranslate2's default)."""
    return h.log_prob / max(len(h.tokens), 1)


class Translator:
    """Translate raw sentences with a trained model.

    Args:
        model, src_tokenizer, tgt_tokenizer, config: a loaded model directory (:meth:`from_dir`).
        device: 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps' (default ``config.decode.device``);
            the model, search batches and key/value caches live there.

    Example:
        >>> tr = Translator.from_dir("runs/de-en")
        >>> tr.translate(["Ein Mann fährt Fahrrad."])[0].text
    """

    def __init__(self, model: Transformer, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer, config: Config,
                 device: str | None = None):
        self.model = model.eval()
        self.src_tokenizer = src_tokenizer
        self.tgt_tokenizer = tgt_tokenizer
        self.config = config
        self.device = torch.device("cpu")
        self._precision = "fp32"
        self.set_device(device or config.decode.device)
        self.set_precision(config.decode.precision)
        self.set_attention("fused" if self.device.type == "cuda" else config.decode.attention)

    @classmethod
    def from_dir(cls, run_dir: str | Path, weights: str | Path | None = None, device: str | None = None
                 ) -> "Translator":
        """Load a model directory (``attnmt.rundir``: config.yaml, SentencePiece model(s),
        model.safetensors).

        Args:
            weights: another safetensors file to load instead of the directory's model.safetensors.
            device: 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'; default the config's ``decode.device``.
        Raises:
            CheckpointError, ConfigError: missing or incompatible files, or a device this
            machine does not have.
        """
        config, src_tok, tgt_tok, model = load_model_dir(run_dir, weights)
        return cls(model, src_tok, tgt_tok, config, device)

    def set_device(self, name: str) -> None:
        """Move the model to a device ('auto', 'cpu', 'cuda', 'cuda:N', 'mps'; ``attnmt.device``);
        search batches and caches follow it. int8 models stay on the CPU. (A translator created on
        CUDA uses the fused attention kernel unless :meth:`set_attention` says otherwise.)

        Raises:
            ConfigError: an unknown name or a device this machine does not have.
            ValueError: a non-CPU device for an int8-quantised model.
        """
        device = resolve_device(name)
        if device.type != "cpu" and self._precision == "int8":
            raise ValueError("int8 (dynamically quantised) models run on the CPU only")
        configure(device)
        self.model.to(device)
        self.device = device

    @property
    def precision(self) -> str:
        """The precision the model runs at now: 'fp32', 'bf16' or 'int8'."""
        return self._precision

    def set_precision(self, precision: str) -> None:
        """Switch the inference precision: 'fp32'; 'bf16' (weights and activations in bfloat16,
        scores accumulated in float32); or 'int8' (Linear layers dynamically quantised to int8
        with ``torch.ao.quantization.quantize_dynamic``, activations float32; CPU only).

        On a CPU without fast bfloat16 kernels 'bf16' means 'fp32', with a warning
        (``attnmt.precision.effective_precision``).

        Raises:
            ValueError: an unknown precision, or going back from int8.
        """
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; use {', '.join(PRECISIONS)}")
        if self.device.type == "cpu":
            precision = effective_precision(precision, "translation")
        if self._precision == "int8" and precision != "int8":
            raise ValueError("an int8-quantised model cannot be converted back; load it again")
        if precision == "int8" and self.device.type != "cpu":
            raise ValueError("int8 (dynamic quantisation) runs on the CPU only; use --device cpu")
        if precision == "int8" and self._precision != "int8":
            from torch.ao.quantization import quantize_dynamic

            self.model = quantize_dynamic(self.model.float(), {torch.nn.Linear}, dtype=torch.qint8)
        elif precision in ("fp32", "bf16"):
            self.model = self.model.to(torch.bfloat16 if precision == "bf16" else torch.float32)
        self._precision = precision

    def set_attention(self, kind: str) -> None:
        """The attention kernel of translation: 'explicit' (equation 1 as written) or 'fused'
        (PyTorch's ``scaled_dot_product_attention``); the same function, different speed.

        Raises:
            ValueError: another kind.
        """
        if kind not in ("explicit", "fused"):
            raise ValueError(f"unknown attention kind {kind!r}; use explicit or fused")
        self.model.set_fused_attention(encoder=kind == "fused", decoder=kind == "fused")
        self.attention_kind = kind

    def _hypothesis(self, h: Hypothesis) -> ScoredHypothesis:
        body = h.tokens[:-1] if h.tokens and h.tokens[-1] == EOS_ID else h.tokens
        pieces = self.tgt_tokenizer.pieces(body) + (["</s>"] if len(body) < len(h.tokens) else [])
        return ScoredHypothesis(self.tgt_tokenizer.decode(body), list(h.tokens), pieces, h.token_log_probs,
                                h.log_prob, h.score)

    def encode_sources(self, sentences: list[str]) -> list[list[int]]:
        """Source ids + EOS per sentence, truncated to the model's max_positions."""
        limit = self.config.model.max_positions - 1
        ids = self.src_tokenizer.encode_batch(sentences)
        for i, s in enumerate(ids):
            if len(s) > limit:
                log.warning("sentence %d has %d subwords; truncated to %d", i + 1, len(s), limit)
                ids[i] = s[:limit]
        return [s + [EOS_ID] for s in ids]

    @torch.no_grad()
    def translate(
        self, sentences: list[str], beam_size: int | None = None, nbest: int = 1,
        batch_size: int | None = None, length_penalty: float | None = None,
        return_attention: bool = False,
    ) -> list[Translation]:
        """Translate raw sentences.

        Args:
            sentences: raw text, one sentence each; empty strings translate to ``nbest`` empty
                hypotheses (score 0).
            beam_size: K (1 = greedy search); default from the model's decode config.
            nbest: hypotheses per sentence (<= beam_size).
            batch_size: sentences per search batch (sorted by length); default from config.
            length_penalty: alpha; default from config (unused by ``length_penalty_type: average``,
                whose score is always the mean log-probability per token, EOS included).
            return_attention: also compute each best hypothesis' source attention.
        Returns:
            One :class:`Translation` per input sentence, in input order, each with ``nbest``
            hypotheses (with a model whose scores are not finite, empty ones with score -inf).
        """
        dc = self.config.decode
        beam_size = beam_size or dc.beam_size
        batch_size = batch_size or dc.batch_size
        alpha = dc.length_penalty if length_penalty is None else length_penalty
        if nbest > beam_size:
            raise ValueError(f"nbest ({nbest}) cannot exceed beam size ({beam_size})")
        results, src_ids, batches = self._plan(sentences, nbest, batch_size)
        for chunk in batches:
            src = to_device(pad_sequences([src_ids[i] for i in chunk]), self.device)  # (B, S)
            if beam_size == 1 and nbest == 1:
                hyps = [[h] for h in greedy_search(self.model, src, dc.max_len_a, dc.max_len_b)]
                if dc.length_penalty_type == "average":
                    hyps = [[Hypothesis(h.tokens, h.token_log_probs, h.log_prob, average_log_prob(h))]
                            for [h] in hyps]
            elif dc.length_penalty_type == "average":
                # log P / |Y| is the GNMT penalty with alpha 1 and k 0: ((0 + |Y|) / (0 + 1))^1.
                hyps = beam_search(self.model, src, beam_size, 1.0, 0.0, dc.max_len_a, dc.max_len_b, nbest)
            else:
                hyps = beam_search(self.model, src, beam_size, alpha, dc.length_penalty_k, dc.max_len_a,
                                   dc.max_len_b, nbest)
            for i, hs in zip(chunk, hyps):
                results[i] = Translation([self._hypothesis(h) for h in hs],
                                         self.src_tokenizer.pieces(src_ids[i][:-1]) + ["</s>"])
        if return_attention:
            for i in src_ids:
                results[i].attention = self.source_attention(src_ids[i], results[i].hypotheses[0].token_ids)
        return results  # type: ignore[return-value]

    def _plan(self, sentences: list[str], nbest: int, batch_size: int
              ) -> tuple[list[Translation | None], dict[int, list[int]], list[list[int]]]:
        """What every engine does around its search: ``nbest`` empty hypotheses (score 0) for
        each empty sentence, the others' source ids (ending with EOS) by input index, and those
        indices in batches of ``batch_size``, longest sources first."""
        results: list[Translation | None] = [None] * len(sentences)
        todo = [i for i, s in enumerate(sentences) if s.strip()]
        for i, s in enumerate(sentences):
            if not s.strip():
                results[i] = Translation([ScoredHypothesis("", [], [], [], 0.0, 0.0) for _ in range(nbest)])
        src_ids = dict(zip(todo, self.encode_sources([sentences[i] for i in todo])))
        order = sorted(todo, key=lambda i: len(src_ids[i]), reverse=True)
        return results, src_ids, [order[k: k + batch_size] for k in range(0, len(order), batch_size)]

    @torch.no_grad()
    def attention(self, src_ids: list[int], out_ids: list[int]) -> dict[str, torch.Tensor]:
        """All attention weights of a forced output, float32, one tensor per kind:

        'source': encoder-decoder attention (L, H, T, S); 'encoder': encoder self-attention
        (L, H, S, S); 'decoder': decoder self-attention (L, H, T, T).

        Args:
            src_ids: source ids ending with EOS (S of them).
            out_ids: output ids (T of them, usually ending with EOS); row t is the attention
                used to predict ``out_ids[t]``.
        """
        src = torch.tensor([src_ids], device=self.device)  # (1, S)
        start = self.config.model.decoder_start_id  # BOS
        tgt_in = torch.tensor([[start] + out_ids[:-1]] if out_ids else [[start]], device=self.device)  # (1, T)
        memory, src_mask, enc_w = self.model.encode(src, need_weights=True)
        out = self.model.decode(tgt_in, memory, src_mask, need_weights=True)
        stack = lambda ws: torch.stack([w[0].float().cpu() for w in ws])  # noqa: E731  (L, H, ., .)
        return {"source": stack(out.src_attn), "encoder": stack(enc_w), "decoder": stack(out.self_attn)}

    def source_attention(self, src_ids: list[int], out_ids: list[int]) -> torch.Tensor:
        """Encoder-decoder attention of a forced output: float32 (L, H, T, S) (see :meth:`attention`)."""
        return self.attention(src_ids, out_ids)["source"]

    @torch.no_grad()
    def score(self, sources: list[str], targets: list[str], batch_size: int | None = None) -> list[ScoredHypothesis]:
        """Forced decoding: the log-probability of given translations under the model.

        Args:
            sources, targets: raw sentences, pairwise (an empty target scores only its EOS).
            batch_size: sentences per forward pass; default from the decode config.
        Returns:
            One :class:`ScoredHypothesis` per pair: ``token_ids`` are the target ids + EOS,
            ``token_log_probs`` their natural-log probabilities, ``log_prob`` = ``score`` = their sum.
        Raises:
            ValueError: different numbers of sources and targets.
        """
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        batch_size = batch_size or self.config.decode.batch_size
        src_ids = self.encode_sources(sources)
        tgt_ids = [t + [EOS_ID] for t in self.tgt_tokenizer.encode_batch(targets)]
        results: list[ScoredHypothesis | None] = [None] * len(sources)
        for start in range(0, len(sources), batch_size):
            idx = list(range(start, min(start + batch_size, len(sources))))
            src = to_device(pad_sequences([src_ids[i] for i in idx]), self.device)  # (B, S)
            start = self.config.model.decoder_start_id  # BOS
            tgt_in = to_device(pad_sequences([[start] + tgt_ids[i][:-1] for i in idx]), self.device)  # (B, T)
            memory, src_mask, _ = self.model.encode(src)
            logits = self.model.decode(tgt_in, memory, src_mask).logits.float().cpu()
            logp = torch.log_softmax(logits, dim=-1)  # (B, T, V)
            for row, i in enumerate(idx):
                ids = tgt_ids[i]
                lps = logp[row, torch.arange(len(ids)), torch.tensor(ids)].tolist()
                results[i] = self._hypothesis(Hypothesis(ids, lps, sum(lps), sum(lps)))
        return results  # type: ignore[return-value]
