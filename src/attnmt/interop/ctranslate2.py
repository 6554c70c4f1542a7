"""Export a model directory to CTranslate2, and translate with the exported model.

The export fills CTranslate2's own ``TransformerSpec`` through its converter API (a
``ctranslate2.converters.Converter`` whose ``_load`` returns the spec): embeddings, the
sinusoid (or learned) position table as stored encodings, per layer the fused query/key/value
projection of self-attention, the query and fused key/value projections of source attention,
the feed-forward network and the layer norms, and the output projection with its bias. The
vocabulary is the model's SentencePiece pieces in id order; the decoder starts from the piece of
``decoder_start_id`` and the source gets EOS appended (``add_source_eos``), as attnmt does. The
export directory also receives config.yaml and the SentencePiece models (and vocab.json), so
``attnmt translate --engine ctranslate2 --model CT2_DIR`` needs nothing else.

:class:`CTranslate2Engine` runs the exported model behind attnmt's engine interface
(``attnmt.decode.engine``), with the native search's stopping rules, length limits, length
penalties and token log-probabilities (its docstring says how each is obtained); ``attnmt
translate --engine ctranslate2`` and ``attnmt serve --engine ctranslate2`` put it under the same
``Translator``.

int8 weights are stored in 7 bits by default (:func:`quantize_int8_rows`, |q| <= 63, one float32
scale per row, CTranslate2's layout). On CPUs without VNNI instructions (AVX2, AVX-512 before
Cascade Lake) CTranslate2's int8 GEMM runs through oneDNN's u8 x s8 kernels, whose pairwise
products are summed in 16 bits and saturate when both operands are large: 255 x 127 x 2 >
32767. oneDNN's guide ("Nuances of int8 computations") names 7-bit weights as the remedy; with
them the sum stays below 255 x 63 x 2 = 32130. The saving in BLEU is measured in
``benchmarks/RESULTS.md``; ``int8_weight_bits=8`` gives CTranslate2's own 8-bit quantizer (finer
where nothing saturates: CPUs with VNNI, GPUs). The GPU types (int8_float16,
int8_bfloat16) always take CTranslate2's quantizer: cuBLAS's int8 GEMM has no 16-bit step.

Library: ctranslate2 (``pip install 'attnmt[export]'``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from attnmt import rundir
from attnmt.config import ModelConfig
from attnmt.data.batching import pad_sequences
from attnmt.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from attnmt.decode.engine import CORE_OPTIONS, Hypothesis, SearchOptions
from attnmt.errors import CheckpointError, ConfigError
from attnmt.interop.extras import require
from attnmt.model.transformer import Transformer
from attnmt.search.beam import length_penalty
from attnmt.search.hypothesis import max_output_lengths

ctranslate2 = require("ctranslate2")
from ctranslate2.specs import common_spec, model_spec, transformer_spec  # noqa: E402

log = logging.getLogger(__name__)

QUANTIZATIONS = ["int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32"]
INT8_CPU_TYPES = ("int8", "int8_float32")  # quantizations that int8_weight_bits applies to
ACTIVATIONS = {"relu": common_spec.Activation.RELU, "swish": common_spec.Activation.SWISH,
               "gelu": common_spec.Activation.GELU}


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().contiguous().numpy()


def _linear(spec, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _self_attention(spec, attn) -> None:
    """Fused (3D, D) query/key/value projection (attnmt's kv_proj is keys then values), then W^O."""
    _linear(spec.linear[0], torch.cat([attn.q_proj.weight, attn.kv_proj.weight]),
            torch.cat([attn.q_proj.bias, attn.kv_proj.bias]))
    _linear(spec.linear[1], attn.out_proj.weight, attn.out_proj.bias)


def _source_attention(spec, attn) -> None:
    _linear(spec.linear[0], attn.q_proj.weight, attn.q_proj.bias)
    _linear(spec.linear[1], attn.kv_proj.weight, attn.kv_proj.bias)
    _linear(spec.linear[2], attn.out_proj.weight, attn.out_proj.bias)


def _feed_forward(spec, ffn, norm) -> None:
    _linear(spec.linear_0, ffn.w_1.weight, ffn.w_1.bias)
    _linear(spec.linear_1, ffn.w_2.weight, ffn.w_2.bias)
    _norm(spec.layer_norm, norm)


def _inputs(spec, part, cfg: ModelConfig) -> None:
    """Embedding, its scaling and the position table (sinusoids or learned) of one stack."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _np(part.embedding.weight)
    spec.scale_embeddings = cfg.scale_embeddings
    spec.position_encodings.encodings = _np(part.positions(cfg.max_positions)[0])  # (P, D)
    if cfg.norm_first:
        _norm(spec.layer_norm, part.final_norm)


def transformer_spec_of(model: Transformer, src_pieces: list[str], tgt_pieces: list[str]):
    """CTranslate2's ``TransformerSpec`` holding an attnmt Transformer's weights (module docstring).

    Args:
        model: the Transformer, float32.
        src_pieces, tgt_pieces: the piece of every source / target id.
    """
    cfg = model.config
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.num_encoder_layers, cfg.num_decoder_layers), cfg.num_heads, pre_norm=cfg.norm_first,
        activation=ACTIVATIONS[cfg.activation])
    _inputs(spec.encoder, model.encoder, cfg)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.layers):
        _self_attention(layer_spec.self_attention, layer.self_attn)
        _norm(layer_spec.self_attention.layer_norm, layer.sublayers[0].norm)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.sublayers[1].norm)
    _inputs(spec.decoder, model.decoder, cfg)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.layers):
        _self_attention(layer_spec.self_attention, layer.self_attn)
        _norm(layer_spec.self_attention.layer_norm, layer.sublayers[0].norm)
        _source_attention(layer_spec.attention, layer.src_attn)
        _norm(layer_spec.attention.layer_norm, layer.sublayers[1].norm)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.sublayers[2].norm)
    projection = model.decoder.output_projection
    _linear(spec.decoder.projection, projection.weight, projection.bias)
    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(tgt_pieces)
    spec.config.unk_token, spec.config.bos_token = tgt_pieces[UNK_ID], tgt_pieces[BOS_ID]
    spec.config.eos_token, spec.config.decoder_start_token = tgt_pieces[EOS_ID], tgt_pieces[cfg.decoder_start_id]
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = model.encoder.layers[0].sublayers[0].norm.eps
    return spec


def _all_pieces(tokenizer: Tokenizer) -> list[str]:
    return tokenizer.pieces(list(range(len(tokenizer))))


def quantize_int8_rows(weight: np.ndarray, bits: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8 quantization, CTranslate2's layout: ``weight ~ q / scale[:, None]``.

    Args:
        weight: float32 (rows, cols).
        bits: 7 (|q| <= 63, see the module docstring) or 8 (|q| <= 127, CTranslate2's own).
    Returns:
        q: int8 (rows, cols); scale: float32 (rows,), (2^(bits-1) - 1) / max|row| (1 for a zero row).
    Raises:
        ValueError: bits not 7 or 8.
    """
    if bits not in (7, 8):
        raise ValueError(f"int8 weights take 7 or 8 bits, not {bits}")
    qmax = np.float32(2 ** (bits - 1) - 1)
    amax = np.abs(weight).max(axis=1).astype(np.float32)
    scale = np.where(amax > 0, qmax / np.maximum(amax, np.finfo(np.float32).tiny), np.float32(1))
    q = np.clip(np.rint(weight * scale[:, None]), -qmax, qmax).astype(np.int8)
    return q, scale.astype(np.float32)


def _quantize_weights(spec, bits: int) -> None:
    """Replace every weight that CTranslate2 quantizes (those with a ``*_scale`` slot: linear
    layers and embeddings) by :func:`quantize_int8_rows` of it."""

    def visit(layer, name: str, value) -> None:
        key = name.rsplit("/", 1)[-1]
        if isinstance(value, np.ndarray) and value.ndim == 2 and hasattr(layer, f"{key}_scale"):
            q, scale = quantize_int8_rows(value, bits)  # float32: _np
            setattr(layer, key, q)
            setattr(layer, f"{key}_scale", scale)

    model_spec.visit_spec(spec, visit)


class AttnmtConverter(ctranslate2.converters.Converter):
    """CTranslate2 converter of an attnmt model directory (``Converter.convert`` writes it).

    Args:
        int8_bits: quantize the weights to int8 with this many bits here (module docstring);
            then ``convert`` must be called with ``quantization=None``. None: leave them float32.
    """

    def __init__(self, model_dir: str | Path, int8_bits: int | None = None):
        self.model_dir = Path(model_dir)
        self.int8_bits = int8_bits

    def _load(self):
        _, src_tok, tgt_tok, model = rundir.load_model_dir(self.model_dir)
        spec = transformer_spec_of(model.eval(), _all_pieces(src_tok), _all_pieces(tgt_tok))
        if self.int8_bits is not None:
            _quantize_weights(spec, self.int8_bits)
        return spec


def export_ctranslate2(model_dir: str | Path, output: str | Path, quantization: str | None = None,
                       int8_weight_bits: int = 7) -> Path:
    """Convert a model directory into a CTranslate2 model directory ``output`` (module docstring).

    Args:
        quantization: CTranslate2's weight type (:data:`QUANTIZATIONS`), None = float32.
        int8_weight_bits: for int8 and int8_float32, 7 (attnmt's quantizer, no 16-bit
            saturation on CPUs without VNNI) or 8 (CTranslate2's own quantizer).
    Raises:
        CheckpointError: ``output`` exists and is not empty, or the model directory is incomplete.
        ValueError: an unknown quantization, or int8_weight_bits not 7 or 8.
    """
    output = Path(output)
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; use one of {', '.join(QUANTIZATIONS)}")
    if int8_weight_bits not in (7, 8):
        raise ValueError(f"int8 weights take 7 or 8 bits, not {int8_weight_bits}")
    if output.exists() and any(output.iterdir()):
        raise CheckpointError(f"{output}: exists and is not empty; choose a new directory")
    rundir.read_config(model_dir)  # a missing or invalid model directory fails before any writing
    if quantization in INT8_CPU_TYPES and int8_weight_bits == 7:  # int8 weights quantized here, the rest float32
        converter, quantization = AttnmtConverter(model_dir, int8_bits=7), None
        kind = "int8 with 7-bit weights"
    else:
        converter, kind = AttnmtConverter(model_dir), quantization or "float32"
    converter.convert(str(output), quantization=quantization, force=output.exists())
    rundir.copy_translation_files(model_dir, output)
    log.info("wrote CTranslate2 model %s (%s)", output, kind)
    return output


def _device_of(name: str) -> tuple[str, int]:
    """CTranslate2's (device, device_index) for an attnmt device name ('auto', 'cpu', 'cuda',
    'cuda:N'); 'auto' is CUDA when CTranslate2 sees a GPU, else the CPU.

    Raises:
        ConfigError: 'mps' or another name CTranslate2 cannot run on, or CUDA without a GPU.
    """
    gpus = ctranslate2.get_cuda_device_count()
    if name == "auto":
        return ("cuda", 0) if gpus else ("cpu", 0)
    if name == "cpu":
        return "cpu", 0
    if name == "cuda" or name.startswith("cuda:"):
        index = int(name.partition(":")[2] or 0)
        if index >= gpus:
            raise ConfigError(f"device {name}: CTranslate2 sees {gpus} CUDA device(s)")
        return "cuda", index
    raise ConfigError(f"the ctranslate2 engine runs on cpu or cuda[:N], not {name}")


class CTranslate2Engine:
    """An ``attnmt.decode.engine.Engine`` over a CTranslate2 export: CTranslate2 searches, the
    results are made to match the native search (module docstring of ``attnmt.decode.engine``).

    Beam search with early stopping (``SearchOptions.early_stopping``) is CTranslate2's own
    search: the native rule is CTranslate2's (``attnmt.search.beam``), so each batch is one
    ``translate_batch`` call with ``patience``, ``num_hypotheses = round(K x patience)``, no
    minimum length, and no re-scoring (:meth:`_translate_early`):

    - Length limit: one ``max_decoding_length`` per call, the batch's longest limit M. A
      sentence with a shorter limit L is searched exactly as with its own limit unless its
      search was still going at step L (both searches are the same up to there); then one of
      the ``round(K x patience)`` hypotheses returned is at least L tokens long (fewer than
      that many had finished before step L). Those sentences, and only those, are searched again
      with ``max_decoding_length = L`` (one call per distinct limit). At its limit CTranslate2
      finishes the last step's K best as they are, as the native rule does.
    - Length penalty: CTranslate2 ranks by log P / |Y|^alpha (|Y| with EOS: ``return_end_token``);
      ``average`` is alpha = 1, the native score exactly. For GNMT, log P is recovered from each
      returned score (score x |Y|^alpha) and the hypotheses are ranked by the native
      log P / ((k + |Y|) / (k + 1))^alpha (the same ranking when k = 0). alpha = 0 is passed as
      1e-6: at 0 CTranslate2 switches to another stopping rule (stop when the best candidate ends).
    - Token log-probabilities: forced decoding (``score_batch``) of the ``nbest`` kept
      hypotheses, only when ``return_token_log_probs``; ``log_prob`` and ``score`` never need it.
    - Forbidden ids: ``suppress_sequences``, which CTranslate2 applies before its softmax (the
      others renormalised; the native search sets them to -inf after it); none in attnmt's own
      models.

    Greedy search, and beam search with exact stopping, are obtained as follows:

    - Length limit: each sentence's own ``floor(a * source length + b)``; sentences are grouped
      by limit and each group is one ``translate_batch`` call (CTranslate2 takes one
      ``max_decoding_length`` per call).
    - At its limit the native search gives every open hypothesis EOS. CTranslate2 stops a
      hypothesis there with whatever token it chose, so it runs to ``limit - 1`` tokens and a
      hypothesis cut there gets EOS appended (its probability scored as below); a truncated
      hypothesis never shows a ``</s>`` it did not produce.
    - Token log-probabilities: every returned hypothesis (EOS included) is scored by forced
      decoding with ``score_batch``, so ``token_log_probs`` and ``log_prob`` are the model's,
      without CTranslate2's renormalisation over non-forbidden tokens.
    - Length penalty: CTranslate2's own is log P / |Y|^alpha. Greedy search needs none.
      ``average`` is alpha = 1 exactly (|Y| counts EOS: ``return_end_token``). GNMT with k is
      done by rescoring: CTranslate2 searches with alpha as its penalty and returns all K
      finished hypotheses, which are re-ranked by log P / ((k + |Y|) / (k + 1))^alpha. The
      finished hypotheses of a beam search do not depend on the penalty (only the ranking and
      the stopping do), so the result is the native one unless the native search, with its
      exact stopping rule, finds a better hypothesis after CTranslate2 has K finished ones
      (``patience`` finds more).

    Args:
        export_dir: written by :func:`export_ctranslate2`.
        device: 'auto', 'cpu', 'cuda' or 'cuda:N' (CTranslate2's CUDA build for a GPU).
        compute_type: CTranslate2's compute type ('default': the stored weights' type).
        threads: intra-op threads, 0 = CTranslate2's default.
        patience: CTranslate2's beam search stops after ``patience * K`` finished hypotheses.
    Raises:
        CheckpointError: no model.bin in ``export_dir``, or files CTranslate2 cannot load.
        ConfigError: a device it cannot use.
    """

    name = "ctranslate2"
    supports = CORE_OPTIONS
    capabilities = frozenset({"score"})

    def __init__(self, export_dir: str | Path, device: str = "cpu", compute_type: str = "default",
                 threads: int = 0, patience: float = 1.0):
        if not (Path(export_dir) / "model.bin").is_file():
            raise CheckpointError(f"{export_dir}: no model.bin; export it with 'attnmt export ctranslate2'")
        self.config = rundir.read_config(export_dir)
        self.src_tokenizer, self.tgt_tokenizer = rundir.read_tokenizers(export_dir)
        kind, index = _device_of(device)
        try:
            self.translator = ctranslate2.Translator(str(export_dir), device=kind, device_index=index,
                                                     compute_type=compute_type, inter_threads=1,
                                                     intra_threads=threads)
        except RuntimeError as e:  # a truncated model.bin, a broken config.json or vocabulary
            raise CheckpointError(f"{export_dir}: CTranslate2 cannot load this export ({str(e).splitlines()[0]}); "
                                  "export it again with 'attnmt export ctranslate2'") from None
        self.patience = patience
        self._forbidden = [self.tgt_tokenizer.pieces([i]) for i in self.config.model.forbidden_ids]
        self._src_pieces = _all_pieces(self.src_tokenizer)
        self._eos_piece = self.tgt_tokenizer.pieces([EOS_ID])[0]

    @property
    def device(self) -> str:
        return f"{self.translator.device}:{self.translator.device_index}" if self.translator.device == "cuda" else "cpu"

    @property
    def precision(self) -> str:
        """CTranslate2's compute type, e.g. 'float32', 'int8_float32'."""
        return self.translator.compute_type

    def _pieces(self, ids: list[int]) -> list[str]:
        return [self._src_pieces[i] for i in ids]

    def translate(self, sources: list[list[int]], options: SearchOptions) -> list[list[Hypothesis]]:
        """Search ``sources`` (ids ending with EOS) with CTranslate2 (class docstring; the caller
        has refused return_attention, constraints and streaming)."""
        src = pad_sequences(sources)  # (B, S)
        limits = max_output_lengths(src, PAD_ID, options.max_len_a, options.max_len_b,
                                    self.config.model.max_positions - 1).tolist()
        src_pieces = [self._pieces(s[:-1]) for s in sources]
        if options.early_stopping and not options.is_greedy:
            return self._translate_early(src_pieces, limits, options)
        # Per sentence: (output pieces without EOS, log P incl. EOS, or None where the search
        # stopped at limit - 1 and EOS is still to be scored).
        found: list[list[tuple[list[str], float | None]]] = [[([], None)] for _ in sources]  # limit 1: EOS only
        groups: dict[int, list[int]] = {}
        for i, limit in enumerate(limits):
            if limit > 1:  # a limit of 1 leaves EOS as the only output
                groups.setdefault(limit, []).append(i)
        eos = self._eos_piece
        for limit, idx in groups.items():
            out = self.translator.translate_batch(
                [src_pieces[i] for i in idx], **self._search_args(options, limit),
                max_decoding_length=limit - 1, min_decoding_length=0, return_end_token=True, return_scores=True,
                max_input_length=0, suppress_sequences=self._forbidden or None)
            for i, result in zip(idx, out):
                found[i] = [(pieces[:-1], score) if pieces and pieces[-1] == eos else (pieces, None)
                            for pieces, score in zip(result.hypotheses, result.scores)]
        return self._ranked(src_pieces, found, options)

    def _translate_early(self, src_pieces: list[list[str]], limits: list[int], options: SearchOptions
                         ) -> list[list[Hypothesis]]:
        """Beam search with early stopping: CTranslate2's own search, one call per batch, plus
        one per distinct limit for the sentences whose limit binds (class docstring)."""
        wanted = options.finished_wanted
        alpha = 1.0 if options.length_penalty_type == "average" else options.length_penalty or 1e-6
        args = dict(beam_size=options.beam_size, patience=options.patience, num_hypotheses=wanted,
                    length_penalty=alpha, min_decoding_length=0, return_end_token=True, return_scores=True,
                    max_input_length=0, suppress_sequences=self._forbidden or None)
        longest = max(limits)
        found = list(self.translator.translate_batch(src_pieces, max_decoding_length=longest, **args))
        again: dict[int, list[int]] = {}  # limit -> sentences whose search reached it
        for i, (result, limit) in enumerate(zip(found, limits)):
            if limit < longest and any(len(h) >= limit for h in result.hypotheses):
                again.setdefault(limit, []).append(i)
        for limit, idx in again.items():
            out = self.translator.translate_batch([src_pieces[i] for i in idx], max_decoding_length=limit, **args)
            for i, result in zip(idx, out):
                found[i] = result
        eos = self._eos_piece
        kept: list[list[tuple[list[str], float]]] = []  # per sentence: (pieces with </s> if it ended, log P)
        for result in found:
            hyps = [(pieces, score * len(pieces) ** alpha) for pieces, score in zip(result.hypotheses, result.scores)]
            hyps.sort(key=lambda h: _native_score(h[1], len(h[0]), options), reverse=True)
            kept.append(hyps[:options.nbest])
        todo = [(i, j) for i, hyps in enumerate(kept) for j in range(len(hyps))] if options.return_token_log_probs \
            else []
        token_lps = dict(zip(todo, self._score([src_pieces[i] for i, _ in todo],
                                               [_body(kept[i][j][0], eos) for i, j in todo])))
        results: list[list[Hypothesis]] = []
        for i, hyps in enumerate(kept):
            out = []
            for j, (pieces, log_prob) in enumerate(hyps):
                ids = self.tgt_tokenizer.piece_ids(_body(pieces, eos)) + ([EOS_ID] if pieces[-1:] == [eos] else [])
                lps = token_lps.get((i, j), [])[:len(ids)]  # score_batch adds EOS to a hypothesis cut without it
                out.append(Hypothesis(ids, lps, log_prob, _native_score(log_prob, len(ids), options)))
            results.append(_top(out, options.nbest))
        return results

    def _search_args(self, options: SearchOptions, limit: int) -> dict:
        """CTranslate2's search options. Greedy search as it is. Beam search ranked by
        log-probability alone (alpha 0): CTranslate2's own early stop, n-best by log P. Any
        other ranking: the search runs to the length limit and returns every finished
        hypothesis (patience ``limit``: at most K finish per step) with its log-probability
        (CTranslate2's alpha 0), to be ranked here by the native score."""
        beam = options.beam_size
        if beam == 1:
            return {"beam_size": 1, "num_hypotheses": 1, "length_penalty": 0.0}
        if options.length_penalty_type == "gnmt" and options.length_penalty == 0:
            return {"beam_size": beam, "num_hypotheses": options.nbest, "length_penalty": 0.0}
        return {"beam_size": beam, "patience": float(limit), "num_hypotheses": beam * limit, "length_penalty": 0.0}

    def _ranked(self, src_pieces: list[list[str]], found: list[list[tuple[list[str], float | None]]],
                options: SearchOptions) -> list[list[Hypothesis]]:
        """Rank each sentence's hypotheses by the native score and keep ``nbest``. Log P and
        the per-token log-probabilities come from forced decoding (``score_batch``): first of
        the hypotheses whose log P the search did not give (those cut at the limit), then of
        the kept ones."""
        cut = [(i, j) for i, hyps in enumerate(found) for j, (_, lp) in enumerate(hyps) if lp is None]
        known = dict(zip(cut, self._score([src_pieces[i] for i, _ in cut], [found[i][j][0] for i, j in cut])))
        kept = []
        for i, hyps in enumerate(found):
            logp = [sum(known[(i, j)]) if lp is None else lp for j, (_, lp) in enumerate(hyps)]
            order = sorted(range(len(hyps)), key=lambda j: _native_score(logp[j], len(hyps[j][0]) + 1, options),
                           reverse=True)
            kept += [(i, j) for j in order[:options.nbest]]
        todo = [(i, j) for i, j in kept if (i, j) not in known]
        known.update(zip(todo, self._score([src_pieces[i] for i, _ in todo], [found[i][j][0] for i, j in todo])))
        results: list[list[Hypothesis]] = [[] for _ in found]
        for i, j in kept:
            lps = known[(i, j)]
            ids = self.tgt_tokenizer.piece_ids(found[i][j][0]) + [EOS_ID]
            results[i].append(Hypothesis(ids, lps, sum(lps), _native_score(sum(lps), len(ids), options)))
        return [_top(hs, options.nbest) for hs in results]

    def forced_log_probs(self, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        """Forced decoding (capability 'score', ``score_batch``): per pair, the natural-log
        probability of each target id, as ``NativeEngine.forced_log_probs`` gives them.

        Args:
            sources: source ids ending with EOS; targets: output ids ending with EOS, pairwise.
        """
        pieces = self.tgt_tokenizer.pieces
        scored = self._score([self._pieces(s[:-1]) for s in sources],
                             [pieces(t[:-1] if t[-1:] == [EOS_ID] else t) for t in targets])
        return [lps[:len(t)] for lps, t in zip(scored, targets)]  # score_batch adds EOS to a target without it

    def _score(self, sources: list[list[str]], targets: list[list[str]]) -> list[list[float]]:
        """Forced decoding: per pair, the natural-log probability of each target piece and of
        the EOS after them."""
        if not targets:
            return []
        return [list(r.log_probs) for r in self.translator.score_batch(sources, targets, max_input_length=0)]


def _body(pieces: list[str], eos: str) -> list[str]:
    """``pieces`` without a final ``eos``."""
    return pieces[:-1] if pieces[-1:] == [eos] else pieces


def _native_score(log_prob: float, length: int, options: SearchOptions) -> float:
    """The score the native search ranks by (``attnmt.search.options.SearchOptions``)."""
    if options.length_penalty_type == "average":
        return log_prob / max(length, 1)
    if options.is_greedy:
        return log_prob
    return log_prob / length_penalty(length, options.length_penalty, options.length_penalty_k)


def _top(hyps: list[Hypothesis], nbest: int) -> list[Hypothesis]:
    """The ``nbest`` best, filled up with empty ones (score -inf) as the native search does."""
    ranked = sorted(hyps, key=lambda h: h.score, reverse=True)[:nbest]
    return ranked + [Hypothesis([EOS_ID], [float("-inf")], float("-inf"), float("-inf"))
                     for _ in range(nbest - len(ranked))]
