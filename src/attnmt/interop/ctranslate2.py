"""Export a model directory to CTranslate2 (translating with the export: ``attnmt.interop.ctranslate2_engine``).

The export fills CTranslate2's own ``TransformerSpec`` through its converter API (a
``ctranslate2.converters.Converter`` whose ``_load`` returns the spec): embeddings, the
sinusoid (or learned) position table as stored encodings, per layer the fused query/key/value
projection of self-attention, the query and fused key/value projections of source attention,
the feed-forward network and the layer norms, and the output projection with its bias. The
vocabulary is the model's SentencePiece pieces in id order; the decoder starts from the piece of
``decoder_start_id`` and the source gets EOS appended (``add_source_eos``), as attnmt does. The
export directory also receives config.yaml and the SentencePiece models (and vocab.json), so
``attnmt translate --engine ctranslate2 --model CT2_DIR`` needs nothing else.

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
from attnmt.config import DEFAULT_ALIGNMENT_LAYER, ModelConfig, canonical_name
from attnmt.data.shards import staging_dir
from attnmt.data.tokenizers import BOS_ID, EOS_ID, UNK_ID
from attnmt.errors import CheckpointError, OptionError, library_call
from attnmt.interop.ctranslate2_engine import all_pieces
from attnmt.interop.extras import require
from attnmt.model.transformer import Transformer

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
        activation=ACTIVATIONS[cfg.activation],
        # return_attention gives the layer and heads attnmt aligns words with (attnmt.decode.alignment)
        alignment_layer=min(DEFAULT_ALIGNMENT_LAYER, cfg.num_decoder_layers) - 1, alignment_heads=cfg.num_heads)
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
        raise OptionError(f"int8 weights take 7 or 8 bits, not {bits}")
    qmax = np.float32(2 ** (bits - 1) - 1)
    amax = np.abs(weight).max(axis=1).astype(np.float32)
    # a zero row (e.g. the padding id's embedding) divides qmax by itself: scale 1, no overflow
    scale = qmax / np.where(amax > 0, np.maximum(amax, qmax / np.finfo(np.float32).max), qmax)
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
        spec = transformer_spec_of(model.eval(), all_pieces(src_tok), all_pieces(tgt_tok))
        if self.int8_bits is not None:
            _quantize_weights(spec, self.int8_bits)
        return spec


def export_ctranslate2(model_dir: str | Path, output: str | Path, quantization: str | None = None,
                       int8_weight_bits: int | None = None) -> Path:
    """Convert a model directory into a CTranslate2 model directory ``output`` (module docstring).

    Args:
        quantization: CTranslate2's weight type (:data:`QUANTIZATIONS`), None = float32.
        int8_weight_bits: for the int8 quantizations only (None elsewhere): 7 (attnmt's quantizer,
            no 16-bit saturation on CPUs without VNNI; the default of int8 and int8_float32, the only
            ones it applies to) or 8 (CTranslate2's own quantizer, the other int8 types' only one).
    Raises:
        CheckpointError: ``output`` exists and is not empty, or the model directory is incomplete.
        OptionError: an unknown quantization, int8_weight_bits not 7 or 8, or given with
            another quantization (where it would change nothing).
        EnvironmentFailure: the converter raised; ``output`` is left as it was.
    """
    output = Path(output)
    quantization = None if quantization is None else canonical_name(quantization)
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise OptionError(f"unknown quantization {quantization!r}; use one of {', '.join(QUANTIZATIONS)}")
    if int8_weight_bits is not None and not (quantization or "").startswith("int8"):
        raise OptionError(f"--int8-weight-bits applies to the int8 quantizations, not {quantization or 'float32'}")
    if int8_weight_bits == 7 and quantization not in INT8_CPU_TYPES:
        raise OptionError(f"7-bit int8 weights are made for {' and '.join(INT8_CPU_TYPES)}; {quantization} takes "
                          "CTranslate2's own 8-bit weights")
    int8_weight_bits = 7 if int8_weight_bits is None else int8_weight_bits
    if int8_weight_bits not in (7, 8):
        raise OptionError(f"int8 weights take 7 or 8 bits, not {int8_weight_bits}")
    if output.exists() and any(output.iterdir()):
        raise CheckpointError(f"{output}: exists and is not empty; choose a new directory")
    rundir.read_config(model_dir)  # a missing or invalid model directory fails before any writing
    if quantization in INT8_CPU_TYPES and int8_weight_bits == 7:  # int8 weights quantized here, the rest float32
        converter, quantization = AttnmtConverter(model_dir, int8_bits=7), None
        kind = "int8 with 7-bit weights"
    else:
        converter, kind = AttnmtConverter(model_dir), quantization or "float32"
    with staging_dir(output, empty_ok=True) as staged:  # complete or absent
        with library_call("the CTranslate2 converter", "translate with the native engine, or export without "
                          "--quantization", (RuntimeError, ValueError)):
            converter.convert(str(staged), quantization=quantization, force=True)
        rundir.copy_translation_files(model_dir, staged)
    log.info("wrote CTranslate2 model %s (%s)", output, kind)
    return output
