"""The model against the paper's definitions: positions, masks, attention paths, the cache."""

from __future__ import annotations

import math

import pytest
import torch

from attnmt.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from attnmt.model.attention import MultiHeadAttention, fused_attention, scaled_dot_product_attention
from attnmt.model.dropout import dropout
from attnmt.model.positional import sinusoidal_table
from tests.conftest import tiny_model


def test_sinusoidal_table_matches_formula():
    d = 16
    table = sinusoidal_table(50, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / d)), abs=1e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / d)), abs=1e-5)


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_mask_rate_in_every_lane(p):
    # Four mask elements come from one 64-bit draw; each of the four 16-bit lanes (the top one
    # has a bit fewer) must drop at rate p, within 6 standard deviations.
    torch.manual_seed(0)
    n = 4 * 250_000
    out = dropout(torch.ones(n), p, training=True)
    assert out.shape == (n,)
    mask = out == 0  # dropped
    rate = round(p * 32768) / 32768
    tol = 6 * math.sqrt(rate * (1 - rate) / (n // 4))
    for lane in range(4):
        assert abs(mask[lane::4].float().mean().item() - rate) < tol
    assert 0.0 < mask.view(-1, 4).float().mean(dim=1).var().item()  # lanes are not copies of each other


def test_dropout_scales_kept_values_and_gradients():
    x = torch.randn(7, 5, 33, requires_grad=True)  # 1155 elements: not a multiple of 4
    torch.manual_seed(1)
    y = dropout(x, 0.25, training=True)
    scale = 32768 / (32768 - 8192)
    kept = y != 0
    assert 0 < kept.sum() < x.numel()
    torch.testing.assert_close(y[kept], x[kept] * scale)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, kept.float() * scale)
    torch.manual_seed(1)
    assert torch.equal(dropout(x, 0.25, training=True), y)  # reproducible from the seed
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bfloat16 input (as under autocast)
        torch.manual_seed(1)
        y16 = dropout(x.detach().bfloat16(), 0.25, training=True)
    assert y16.dtype == torch.bfloat16 and torch.equal(y16 != 0, kept)
    assert dropout(x, 0.25, training=False) is x and dropout(x, 0.0, training=True) is x


def test_explicit_attention_hand_computed():
    q = torch.tensor([[[[1.0, 0.0]]]])  # (1, 1, 1, 2)
    k = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]]])
    v = torch.tensor([[[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]]])
    mask = torch.tensor([True, True, False])[None, None, None]
    out, w = scaled_dot_product_attention(q, k, v, mask)
    e = math.exp(1 / math.sqrt(2))
    expected_w = torch.tensor([e / (e + 1), 1 / (e + 1), 0.0])
    assert torch.allclose(w[0, 0, 0], expected_w, atol=1e-6)
    assert torch.allclose(out[0, 0, 0], expected_w[0] * v[0, 0, 0] + expected_w[1] * v[0, 0, 1], atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fully_masked_row_gives_zeros_and_finite_gradients(dtype):
    # The mask is a bias of the dtype's finite minimum: it must not overflow to -inf in bfloat16.
    q = (10 * torch.randn(1, 2, 3, 4)).to(dtype).requires_grad_()
    k = (10 * torch.randn(1, 2, 5, 4)).to(dtype).requires_grad_()
    v = torch.randn(1, 2, 5, 4, dtype=dtype, requires_grad=True)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    mask[..., 1, :] = False  # query 1 may attend to nothing
    mask[..., 0, 3:] = False  # query 0 to keys 0-2 only
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.all(w[:, :, 1] == 0) and torch.all(out[:, :, 1] == 0)
    assert torch.all(w[:, :, 0, 3:] == 0) and torch.allclose(w[:, :, 0].float().sum(-1), torch.ones(1, 2), atol=1e-2)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    fused = fused_attention(q, k, v, mask)
    assert not torch.isnan(fused).any() and torch.all(fused[:, :, 1] == 0)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_equals_explicit(causal):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4).eval()
    x = torch.randn(3, 6, 32)
    mask = torch.ones(3, 1, 1, 6, dtype=torch.bool)
    mask[0, ..., 4:] = False
    k, v = mha.project_kv(x)
    mha.fused = False
    explicit, _ = mha(x, k, v, None if causal else mask, is_causal=causal)
    with_weights, w = mha(x, k, v, None if causal else mask, is_causal=causal, need_weights=True)
    mha.fused = True
    fused, none = mha(x, k, v, None if causal else mask, is_causal=causal)
    assert none is None and w.shape == (3, 4, 6, 6)
    assert torch.allclose(explicit, fused, atol=1e-5)
    assert torch.allclose(explicit, with_weights, atol=1e-6)
    if causal:
        assert torch.all(w.triu(diagonal=1) == 0)


def test_decoder_is_causal():
    model = tiny_model()
    src = torch.randint(4, 40, (2, 7))
    tgt = torch.randint(4, 40, (2, 6))
    changed = tgt.clone()
    changed[:, 3:] = torch.randint(4, 40, (2, 3))
    a, b = model(src, tgt), model(src, changed)
    assert torch.allclose(a[:, :3], b[:, :3], atol=1e-5)
    assert not torch.allclose(a[:, 3:], b[:, 3:], atol=1e-3)


def test_padding_does_not_change_real_positions():
    model = tiny_model()
    src = torch.tensor([[5, 6, 7, EOS_ID]])
    tgt = torch.tensor([[BOS_ID, 8, 9]])
    padded_src = torch.tensor([[5, 6, 7, EOS_ID, PAD_ID, PAD_ID]])
    padded_tgt = torch.tensor([[BOS_ID, 8, 9, PAD_ID]])
    assert torch.allclose(model(src, tgt), model(padded_src, padded_tgt)[:, :3], atol=1e-5)


@pytest.mark.parametrize("options", [{}, {"norm_first": True, "positional": "learned"}])
def test_cached_incremental_decoding_equals_full_forward(options):
    model = tiny_model(**options)
    src = torch.tensor([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[BOS_ID, 11, 12, 13, 14], [BOS_ID, 15, 16, 17, 18]])
    memory, src_mask, _ = model.encode(src)
    full = torch.log_softmax(model.decode(tgt, memory, src_mask).logits, dim=-1)  # (B, T, V)
    cache = model.init_cache()
    for t in range(tgt.size(1)):
        step = model.decode_step(tgt[:, t: t + 1], memory, src_mask, cache)
        assert torch.allclose(step, full[:, t], atol=1e-5), t
    assert cache.step == tgt.size(1)


def test_beams_sharing_one_source_row_equal_repeated_sources():
    """K consecutive target rows per sentence against one source row (beam search's layout)
    give the same log-probabilities and source attention as repeating each source K times."""
    model = tiny_model().eval()
    K = 3
    src = torch.tensor([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[BOS_ID, 11, 12], [BOS_ID, 13, 14], [BOS_ID, 15, 16],
                        [BOS_ID, 17, 18], [BOS_ID, 19, 20], [BOS_ID, 21, 22]])  # (B*K, T)
    memory, src_mask, _ = model.encode(src)
    shared, repeated = model.init_cache(), model.init_cache()
    mem_rep, mask_rep = memory.repeat_interleave(K, 0), src_mask.repeat_interleave(K, 0)
    for t in range(tgt.size(1)):
        a = model.decode_step(tgt[:, t: t + 1], memory if t == 0 else None, src_mask, shared)
        b = model.decode_step(tgt[:, t: t + 1], mem_rep if t == 0 else None, mask_rep, repeated)
        assert torch.allclose(a, b, atol=1e-5), t
    assert shared.layers[0].cross_k.size(0) == 2 and repeated.layers[0].cross_k.size(0) == 6
    # attention weights in the shared layout come back per target row: (B*K, H, T, S)
    layer = model.decoder.layers[0]
    x = torch.randn(6, 2, 32)
    _, _, w_shared = layer(x, memory, src_mask, need_weights=True)
    _, _, w_rep = layer(x, mem_rep, mask_rep, need_weights=True)
    assert w_shared.shape == w_rep.shape == (6, layer.src_attn.num_heads, 2, 5)
    assert torch.allclose(w_shared, w_rep, atol=1e-6)


def test_embeddings_shared_and_scaled():
    model = tiny_model(share_embeddings=True, tie_output=True)
    emb = model.encoder.embedding
    assert model.decoder.embedding is emb
    assert model.decoder.output_projection.weight is emb.weight
    tokens = torch.tensor([[5]])
    assert torch.allclose(emb(tokens)[0, 0], emb.weight[5] * math.sqrt(32))
