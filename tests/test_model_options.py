"""The model options of the reference presets, one test each: LayerNorm eps, pre+post norm,
shift-only LayerNorm, embedding scaling, trainable positional scale, head size, bias-free
attention, the activation on both feed-forward layers, time-shared dropout, pretrained frozen
embeddings and Xavier initialisation of every matrix."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnmt.config import ModelConfig, config_from_dict
from attnmt.errors import ConfigError
from attnmt.model.dropout import dropout
from attnmt.model.layers import PositionwiseFeedForward, ResidualSublayer, ShiftLayerNorm
from attnmt.model.transformer import load_pretrained_embeddings

from .conftest import tiny_model


def _cfg(**overrides) -> ModelConfig:
    base = dict(d_model=32, num_heads=4, d_ff=64, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0)
    base.update(overrides)
    return ModelConfig(**base)


def _identity_sublayer(h):
    return h * 2.0 + 1.0, None


def test_layer_norm_eps_reaches_every_layer_norm():
    model = tiny_model(layer_norm_eps=1e-6, norm_first=True)
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * 2 + 2 * 3 + 2  # sub-layers of both stacks and the two final norms
    assert {m.eps for m in norms} == {1e-6}


def test_pre_post_norm_normalises_before_the_sublayer_and_after_the_residual():
    torch.manual_seed(0)
    block = ResidualSublayer(_cfg(pre_post_norm=True))
    for p in block.parameters():
        nn.init.normal_(p)
    x = torch.randn(2, 5, 32)
    y, _ = block(x, _identity_sublayer)
    inner = block.pre_norm(x) * 2.0 + 1.0
    assert torch.allclose(y, block.norm(x + inner), atol=1e-6)
    post, _ = ResidualSublayer(_cfg())(x, _identity_sublayer)  # one LayerNorm only: differs
    assert not torch.allclose(y, post, atol=1e-3)
    with pytest.raises(ValueError, match="exclude each other"):
        _cfg(pre_post_norm=True, norm_first=True)


def test_shift_only_layer_norm_has_a_bias_and_no_scale():
    norm = ShiftLayerNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.bias.copy_(torch.arange(8.0))
    x = torch.randn(3, 8) * 5 + 2
    expected = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-6)
    assert torch.allclose(norm(x), expected + torch.arange(8.0), atol=1e-5)
    model = tiny_model(layer_norm_scale=False)
    names = [n for n, _ in model.named_parameters() if ".norm." in n]
    assert names and all(n.endswith(".bias") for n in names)


def test_scale_embeddings_off_leaves_the_vectors_unscaled():
    for scale, factor in ((True, math.sqrt(32)), (False, 1.0)):
        model = tiny_model(scale_embeddings=scale)
        emb = model.encoder.embedding
        tokens = torch.tensor([[5, 6]])
        assert torch.allclose(emb(tokens), emb.weight[[5, 6]][None] * factor)


def test_positional_scale_is_trainable_starts_at_one_and_scales_positions():
    model = tiny_model(positional_scale=True)
    scales = [model.encoder.position_scale, model.decoder.position_scale]
    assert all(s.requires_grad and s.item() == 1.0 for s in scales) and scales[0] is not scales[1]
    src = torch.tensor([[5, 6, 7, 8, 3]])
    with torch.no_grad():
        model.encoder.position_scale.zero_()  # no positional information: order does not matter
    memory, _, _ = model.encode(src)
    memory_reversed, _, _ = model.encode(src.flip(1))
    assert torch.allclose(memory, memory_reversed.flip(1), atol=1e-5)
    with torch.no_grad():
        model.encoder.position_scale.fill_(1.0)
    memory, _, _ = model.encode(src)
    memory_reversed, _, _ = model.encode(src.flip(1))
    assert not torch.allclose(memory, memory_reversed.flip(1), atol=1e-3)
    model.train()
    model(src, torch.tensor([[2, 5, 6]])).sum().backward()
    assert model.encoder.position_scale.grad is not None and model.encoder.position_scale.grad != 0


def test_head_dim_sets_the_projection_width_apart_from_d_model():
    model = tiny_model(d_model=30, num_heads=4, head_dim=5)  # 30 is not divisible by 4
    attn = model.encoder.layers[0].self_attn
    assert attn.q_proj.weight.shape == (20, 30) and attn.kv_proj.weight.shape == (40, 30)
    assert attn.out_proj.weight.shape == (30, 20)
    logits = model(torch.tensor([[5, 6, 7, 3]]), torch.tensor([[2, 5, 6]]))
    assert logits.shape == (1, 3, 40)
    with pytest.raises(ValueError, match="divisible"):
        _cfg(d_model=30, num_heads=4)


def test_attention_bias_off_has_no_bias_and_maps_zero_to_zero():
    model = tiny_model(attention_bias=False)
    attn = model.decoder.layers[0].src_attn
    assert attn.q_proj.bias is None and attn.kv_proj.bias is None and attn.out_proj.bias is None
    out, _ = attn(torch.zeros(1, 3, 32), torch.zeros(1, 4, 32), torch.randn(1, 4, 32) * 0)
    assert torch.equal(out, torch.zeros(1, 3, 32))
    assert tiny_model().decoder.layers[0].src_attn.q_proj.bias is not None  # the paper's default


def test_ffn_output_activation_applies_the_activation_twice():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(8, 16, activation="relu", output_activation=True)
    x = torch.randn(2, 3, 8)
    expected = F.relu(ffn.w_2(F.relu(ffn.w_1(x))))
    assert torch.equal(ffn(x), expected)
    ffn.output_activation = False
    assert (ffn(x) < 0).any()  # the paper's FFN is linear at its output


def test_time_shared_dropout_uses_one_mask_for_all_time_steps():
    torch.manual_seed(0)
    x = torch.ones(4, 50, 64)
    y = dropout(x, 0.5, training=True, time_shared=True)
    assert torch.equal(y, y[:, :1].expand_as(y))  # the same mask at every time step
    kept = (y[:, 0] != 0).float().mean().item()
    assert 0.35 < kept < 0.65 and set(y.unique().tolist()) <= {0.0, 2.0}
    per_element = dropout(x, 0.5, training=True)
    assert not torch.equal(per_element, per_element[:, :1].expand_as(per_element))
    model = tiny_model(time_shared_dropout=True, dropout=0.3)
    assert model.encoder.dropout.time_shared and model.encoder.layers[0].sublayers[0].dropout.time_shared


def test_pretrained_embeddings_fill_rows_and_freeze():
    model = tiny_model(freeze_embeddings=True, tie_output=False)
    emb = model.encoder.embedding
    unk_before = emb.weight[1].clone()
    vectors = {"haus": torch.full((32,), 0.5), "katze": torch.full((32,), -1.0)}
    filled = load_pretrained_embeddings(emb, ["haus", "baum", "katze"], vectors, first_word_id=4)
    assert filled == 2
    assert torch.equal(emb.weight[4], vectors["haus"]) and torch.equal(emb.weight[6], vectors["katze"])
    assert torch.equal(emb.weight[1], unk_before)  # the shared OOV vector keeps its initialisation
    assert not emb.weight.requires_grad and not model.decoder.embedding.weight.requires_grad
    with pytest.raises(ValueError, match="dimension 3"):
        load_pretrained_embeddings(emb, ["haus"], {"haus": torch.zeros(3)}, first_word_id=4)
    with pytest.raises(ConfigError, match="tie_output"):
        config_from_dict({"data": {"train_src": "a", "train_tgt": "b"}, "model": {"freeze_embeddings": True}})


def test_xavier_uniform_init_covers_embeddings_and_output_layer():
    vocab, d = 40, 32
    bound = math.sqrt(6.0 / (vocab + d))
    default = tiny_model(tie_output=False)
    xavier = tiny_model(tie_output=False, init="xavier_uniform")
    for model, uniform in ((default, False), (xavier, True)):
        for w in (model.encoder.embedding.weight, model.decoder.output_projection.weight):
            inside = w.abs().max().item() <= bound
            assert inside == uniform
            if uniform:
                assert w.abs().max().item() > 0.9 * bound  # spread over the whole interval
