"""Import a Hugging Face MarianMT model (the OPUS-MT family) as an attnmt model directory.

A MarianMT checkpoint is the paper's post-norm encoder-decoder with these differences, each an
attnmt model option (``attnmt.config.ModelConfig``): the swish feed-forward activation
(``activation``), a final logits bias (``output_bias``), sinusoids laid out in halves
(``positional_layout``), decoding started from the pad token (``decoder_start_id``) whose logit
is forbidden (``forbidden_ids``), and separate source and target SentencePiece models over one
shared ``vocab.json`` (``attnmt.data.tokenizers.VocabTokenizer``).

attnmt's special ids are fixed (PAD 0, UNK 1, BOS 2, EOS 3), so the vocabulary is reordered on
import: MarianMT's pad, unk and eos move to 0, 1 and 3, every other piece keeps its relative
order in the free ids, and the embedding rows and the logits bias are permuted the same way.
MarianMT has no BOS: id 2 is an ordinary piece.

An OPUS-MT model into several languages (opus-mt-en-mul, opus-mt-en-ROMANCE) asks for one with a
token at the start of the source, ``>>fra<<``, held whole in its vocabulary (transformers'
MarianTokenizer splits it off the text before SentencePiece). The import makes such a model an
attnmt multilingual model (``attnmt.languages``): ``tokenizer.target_languages`` the codes of the
vocabulary's ``>>xx<<`` pieces, ``tokenizer.language_tag`` ``>>{}<<``, so that ``attnmt translate
--tgt-lang fra`` puts the id of ``>>fra<<`` first, as transformers does for ``>>fra<< text``.

The source is a local directory (config.json, model.safetensors or pytorch_model.bin,
source.spm, target.spm, vocab.json) or a Hub model id (``Helsinki-NLP/opus-mt-de-en``),
fetched with huggingface_hub. Loading never executes pickled code: safetensors, or
``torch.load(weights_only=True)``.

Library: safetensors, torch, huggingface_hub (Hub ids only). Source of the architecture:
transformers' ``modeling_marian.py`` (MarianMTModel).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch

from pydantic import ValidationError

from attnmt import ranges, rundir
from attnmt.config import (LANGUAGE, Config, DecodeConfig, ModelConfig, TokenizerConfig, canonical_language,
                           known_as)
from attnmt.data.shards import staging_dir
from attnmt.data.tokenizers import EOS_ID, PAD_ID, UNK_ID, VocabTokenizer
from attnmt.errors import CheckpointError
from attnmt.interop.extras import require
from attnmt.interop.marian_config import MarianConfig, read_beam_size, read_marian_config
from attnmt.model.positional import sinusoidal_table
from attnmt.model.transformer import Transformer

log = logging.getLogger(__name__)

MARIAN_FILES = ["config.json", "source.spm", "target.spm", "vocab.json", "generation_config.json",
                "model.safetensors", "pytorch_model.bin"]
ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}
OPUS_TAG = ">>{}<<"  # OPUS-MT's target-language token, e.g. >>fra<<


def resolve_source(source: str) -> Path:
    """A local MarianMT directory, or the snapshot directory of a Hub model id.

    Raises:
        CheckpointError: neither a directory nor a fetchable Hub id.
        AttnmtError: a Hub id without huggingface_hub installed (the ``hf`` extra).
    """
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists() or source.count("/") != 1 or source.startswith((".", "/", "~")):
        raise CheckpointError(f"{source}: no such MarianMT directory (nor a Hub id such as Helsinki-NLP/opus-mt-de-en)")
    hub = require("huggingface_hub")
    try:
        return Path(hub.snapshot_download(source, allow_patterns=MARIAN_FILES))
    except Exception as e:  # network, unknown repository, gated model: one line for the user
        raise CheckpointError(f"{source}: cannot fetch from the Hugging Face Hub: {type(e).__name__}: {e}") from None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; is {path.parent} a MarianMT model directory?") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not JSON: {e}") from None


def read_weights(source: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors by name, float32: model.safetensors, else pytorch_model.bin read
    with ``torch.load(weights_only=True)`` (tensors only, no code executed).

    Raises:
        CheckpointError: neither file, or an unreadable one.
    """
    if (source / "model.safetensors").is_file():
        from safetensors.torch import load_file

        tensors = load_file(str(source / "model.safetensors"))
    elif (source / "pytorch_model.bin").is_file():
        try:
            tensors = torch.load(source / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as e:  # pickle errors: refused code, truncated file
            raise CheckpointError(f"{source / 'pytorch_model.bin'}: cannot load safely: {e}") from None
    else:
        raise CheckpointError(f"{source}: no model.safetensors or pytorch_model.bin")
    return {k: v.float() for k, v in tensors.items()}


def vocabulary_order(vocab: dict[str, int], size: int, pad_id: int, eos_id: int) -> tuple[list[int], list[str]]:
    """MarianMT's ids reordered for attnmt's fixed special ids (module docstring).

    Args:
        vocab: vocab.json, piece -> MarianMT id.
        size: the model's vocabulary size V.
        pad_id, eos_id: MarianMT's pad and eos ids (its unk is the piece ``<unk>``).
    Returns:
        (order, pieces): ``order[a]`` is the MarianMT id of attnmt id ``a``, and ``pieces[a]`` its
        piece; ids missing from vocab.json get the placeholder piece ``<unused-ID>``.
    Raises:
        CheckpointError: no ``<unk>`` piece, or ids outside [0, V).
    """
    if not isinstance(vocab, dict):
        raise CheckpointError("vocab.json is not a JSON object of piece -> id")
    if "<unk>" not in vocab:
        raise CheckpointError("vocab.json has no '<unk>' piece")
    ids = ranges.Range(0, size - 1, integer=True)
    if not all(ids.contains(i) for i in vocab.values()):
        raise CheckpointError(f"vocab.json has ids outside the model's vocabulary of {size}")
    specials = {PAD_ID: pad_id, UNK_ID: vocab["<unk>"], EOS_ID: eos_id}
    taken = set(specials.values())
    rest = iter(i for i in range(size) if i not in taken)
    order = [specials[a] if a in specials else next(rest) for a in range(size)]
    piece_of = {i: p for p, i in vocab.items()}
    return order, [piece_of.get(m, f"<unused-{m}>") for m in order]


def target_languages(pieces: list[str]) -> list[str]:
    """The codes of a vocabulary's OPUS-MT target-language tokens (``>>fra<<`` -> 'fra'), sorted;
    [] for a model into one language. Codes attnmt cannot name (``tokenizer.target_languages``'
    pattern) are left out, with a warning."""
    tagged = [p[2:-2] for p in pieces if len(p) > 4 and p.startswith(">>") and p.endswith("<<")]
    skipped = [code for code in tagged if not re.fullmatch(LANGUAGE, code)]
    if skipped:
        log.warning("left out %d target-language tokens whose codes are not language codes: %s", len(skipped),
                    " ".join(OPUS_TAG.format(code) for code in skipped[:5]))
    codes = sorted(set(tagged) - set(skipped))
    kept = [code for code in codes
            if canonical_language(code) == code or known_as(code, codes, canonical_language) == code]
    if len(kept) < len(codes):  # >>pt_br<< beside >>pt_BR<<: one language, asked for by its canonical tag
        log.warning("left out target-language tokens that spell a code kept in another case: %s",
                    " ".join(OPUS_TAG.format(code) for code in sorted(set(codes) - set(kept))))
    return kept


def model_config(hf: MarianConfig, order: list[int]) -> ModelConfig:
    """attnmt's ModelConfig of a MarianMT config.json (``order`` from :func:`vocabulary_order`).

    Raises:
        CheckpointError: a MarianMT variant attnmt cannot represent, or a value the model
            section refuses.
    """
    if hf.model_type != "marian":
        raise CheckpointError(f"config.json: model_type is {hf.model_type!r}, not 'marian'")
    if hf.encoder_attention_heads != hf.decoder_attention_heads or hf.encoder_ffn_dim != hf.decoder_ffn_dim:
        raise CheckpointError("config.json: encoder and decoder with different heads or d_ff are not supported")
    if hf.activation_function not in ACTIVATIONS:
        raise CheckpointError(f"config.json: activation {hf.activation_function!r} is not supported")
    if hf.decoder_vocab_size not in (None, hf.vocab_size):
        raise CheckpointError("config.json: separate source and target vocabularies are not supported")
    new_id = {m: a for a, m in enumerate(order)}
    start = hf.pad_token_id if hf.decoder_start_token_id is None else hf.decoder_start_token_id
    try:
        return ModelConfig(
            d_model=hf.d_model, num_heads=hf.encoder_attention_heads, d_ff=hf.encoder_ffn_dim,
            num_encoder_layers=hf.encoder_layers, num_decoder_layers=hf.decoder_layers,
            dropout=hf.dropout, attention_dropout=hf.attention_dropout,
            activation_dropout=hf.activation_dropout, norm_first=False, positional="sinusoidal",
            positional_layout="halves", max_positions=hf.max_position_embeddings,
            share_embeddings=hf.share_encoder_decoder_embeddings,
            tie_output=hf.tie_word_embeddings, output_bias=True,
            activation=ACTIVATIONS[hf.activation_function],
            scale_embeddings=hf.scale_embedding,
            decoder_start_id=new_id[start],
            forbidden_ids=[PAD_ID],
        )
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise CheckpointError(f"config.json: a model attnmt cannot build ({problems})") from None


def _attention(out: dict, hf: dict, src: str, dst: str) -> None:
    """q, k, v, out projections of one MarianMT attention -> attnmt's q_proj, kv_proj, out_proj."""
    out[dst + "q_proj.weight"], out[dst + "q_proj.bias"] = hf[src + "q_proj.weight"], hf[src + "q_proj.bias"]
    out[dst + "kv_proj.weight"] = torch.cat([hf[src + "k_proj.weight"], hf[src + "v_proj.weight"]])  # (2D, D)
    out[dst + "kv_proj.bias"] = torch.cat([hf[src + "k_proj.bias"], hf[src + "v_proj.bias"]])  # (2D,)
    out[dst + "out_proj.weight"], out[dst + "out_proj.bias"] = hf[src + "out_proj.weight"], hf[src + "out_proj.bias"]


def _copy(out: dict, hf: dict, src: str, dst: str) -> None:
    out[dst + ".weight"], out[dst + ".bias"] = hf[src + ".weight"], hf[src + ".bias"]


# Per layer side: (copier, Marian's tensor name, attnmt's) of each tensor of one layer.
_LAYER_TENSORS = {
    "encoder": [(_attention, "self_attn.", "self_attn."), (_copy, "self_attn_layer_norm", "sublayers.0.norm"),
                (_copy, "fc1", "feed_forward.w_1"), (_copy, "fc2", "feed_forward.w_2"),
                (_copy, "final_layer_norm", "sublayers.1.norm")],
    "decoder": [(_attention, "self_attn.", "self_attn."), (_copy, "self_attn_layer_norm", "sublayers.0.norm"),
                (_attention, "encoder_attn.", "src_attn."), (_copy, "encoder_attn_layer_norm", "sublayers.1.norm"),
                (_copy, "fc1", "feed_forward.w_1"), (_copy, "fc2", "feed_forward.w_2"),
                (_copy, "final_layer_norm", "sublayers.2.norm")],
}


def _first(hf: dict, names: list[str]) -> torch.Tensor:
    for name in names:
        if name in hf:
            return hf[name]
    raise CheckpointError(f"the checkpoint has none of {names}")


def state_dict(hf: dict[str, torch.Tensor], cfg: ModelConfig, order: list[int]) -> dict[str, torch.Tensor]:
    """attnmt's parameters (``Transformer.state_dict`` names) from MarianMT's tensors, with the
    vocabulary rows permuted by ``order``.

    Raises:
        CheckpointError: a tensor is missing.
    """
    idx = torch.tensor(order)
    try:
        shared = _first(hf, ["model.shared.weight", "model.encoder.embed_tokens.weight"])  # (V, D)
        out = {"encoder.embedding.weight": shared[idx]}
        decoder_embedding = shared if cfg.share_embeddings else hf["model.decoder.embed_tokens.weight"]
        out["decoder.embedding.weight"] = decoder_embedding[idx]
        output = decoder_embedding if cfg.tie_output else hf["lm_head.weight"]
        out["decoder.output_projection.weight"] = output[idx]
        bias = hf.get("final_logits_bias", torch.zeros(1, len(order)))
        out["decoder.output_projection.bias"] = bias[0, idx]
        for side, layers in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
            for i in range(layers):
                src, dst = f"model.{side}.layers.{i}.", f"{side}.layers.{i}."
                for copy, hf_name, name in _LAYER_TENSORS[side]:
                    copy(out, hf, src + hf_name, dst + name)
    except KeyError as e:
        raise CheckpointError(f"the checkpoint lacks the tensor {e.args[0]}") from None
    return out


def _check_positions(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    """Where the checkpoint stores its sinusoid table, it must be the 'halves' one attnmt computes."""
    table = sinusoidal_table(cfg.max_positions, cfg.d_model, "halves")
    for name in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
        if name in hf and not torch.allclose(hf[name], table, atol=1e-4):
            raise CheckpointError(f"{name}: not the sinusoid table of MarianMT; learned positions are not supported")


def import_marian(source: str, output: str | Path) -> Path:
    """Write an attnmt model directory from a MarianMT model (module docstring).

    The decode section takes the checkpoint's beam size (generation_config.json, else 4) and
    transformers' length normalisation, log P / |Y| (``length_penalty`` 1 with
    ``length_penalty_k`` 0; |Y| counts EOS, as transformers' does). A vocabulary with
    ``>>xx<<`` tokens makes a multilingual model (module docstring, :func:`target_languages`).

    Returns:
        The model directory.
    Raises:
        CheckpointError: missing or unsupported files, or ``output`` not empty (it is written whole or not
            at all).
        AttnmtError: a Hub id without the ``hf`` extra.
    """
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise CheckpointError(f"{output}: exists and is not empty; choose a new directory")
    path = resolve_source(source)
    hf = read_marian_config(_read_json(path / "config.json"), path / "config.json")
    vocab = _read_json(path / "vocab.json")
    order, pieces = vocabulary_order(vocab, hf.vocab_size, hf.pad_token_id, hf.eos_token_id)
    cfg = model_config(hf, order)
    weights = read_weights(path)
    _check_positions(weights, cfg)
    model = Transformer(cfg, len(order), len(order), PAD_ID)
    try:
        model.load_state_dict(state_dict(weights, cfg, order), strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit config.json: {e}") from None
    generation = _read_json(path / "generation_config.json") if (path / "generation_config.json").is_file() else {}
    beam_size = read_beam_size(generation, path / "generation_config.json")
    decode = DecodeConfig(beam_size=beam_size or 4, length_penalty=1.0, length_penalty_k=0.0)
    tokenizers = [VocabTokenizer.load_with_vocab(path / name, pieces) for name in ("source.spm", "target.spm")]
    targets = target_languages(pieces)  # none: a bilingual model, its tokenizer section the default
    tokenizer = TokenizerConfig(target_languages=targets, language_tag=OPUS_TAG) if targets else TokenizerConfig()
    config = Config(model=cfg, tokenizer=tokenizer, decode=decode)
    with staging_dir(output, empty_ok=True) as staging:  # complete or absent
        rundir.write_tokenizers(staging, *tokenizers)
        rundir.save_weights(model, staging / rundir.WEIGHTS, metadata={"imported_from": str(source)})
        rundir.write_config(config, staging)
    log.info("imported %s (%d + %d layers, d_model %d, vocabulary %d) into %s", source, cfg.num_encoder_layers,
             cfg.num_decoder_layers, cfg.d_model, len(order), output)
    return output

