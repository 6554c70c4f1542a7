"""The model against the paper's definitions: positions, masks, attention paths, the cache."""

from __future__ import annotations

import math

import pytest
import torch

from attnmt.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from attnmt.model import attention
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
    lanes = mask.view(-1, 4).float()  # (draws, lane)
    for lane in range(4):
        assert abs(lanes[:, lane].mean().item() - rate) < tol
    # The lanes of one draw are independent: drop indicators of any two lanes are uncorrelated
    # (a lane copied or derived from another would give a correlation near 1 or -1).
    corr = torch.corrcoef(lanes.T)  # (4, 4)
    off_diagonal = corr[~torch.eye(4, dtype=torch.bool)]
    assert off_diagonal.abs().max().item() < 6 / math.sqrt(n // 4)


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
    mask = None if causal else torch.ones(3, 1, 1, 6, dtype=torch.bool)
    if mask is not None:
        mask[0, ..., 4:] = False
    mha.fused = False
    explicit, _ = mha(x, x, x, mask, is_causal=causal)
    with_weights, w = mha(x, x, x, mask, is_causal=causal, need_weights=True)
    mha.fused = True
    fused, none = mha(x, x, x, mask, is_causal=causal)
    assert none is None and w.shape == (3, 4, 6, 6)
    assert torch.allclose(explicit, fused, atol=1e-5)
    assert torch.allclose(explicit, with_weights, atol=1e-6)
    if causal:
        assert torch.all(w.triu(diagonal=1) == 0)


def test_multi_head_attention_follows_section_3_2_2():
    """Raw query, key and value in: each head attends with its own slices of W^Q, W^K, W^V
    (equation 1), the heads are concatenated and multiplied by W^O, computed here head by head."""
    torch.manual_seed(1)
    d, h = 12, 3
    mha = MultiHeadAttention(d, h).eval()
    query, key, value = torch.randn(2, 4, d), torch.randn(2, 5, d), torch.randn(2, 5, d)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None, None, :]  # (B, 1, 1, S)
    out, weights = mha(query, key, value, mask, need_weights=True)
    w_k, w_v = mha.kv_proj.weight.chunk(2)
    b_k, b_v = mha.kv_proj.bias.chunk(2)
    dh = d // h
    heads = []
    for i in range(h):
        cols = slice(i * dh, (i + 1) * dh)
        q = query @ mha.q_proj.weight[cols].T + mha.q_proj.bias[cols]  # (B, 4, dh)
        k = key @ w_k[cols].T + b_k[cols]  # (B, 5, dh)
        v = value @ w_v[cols].T + b_v[cols]
        scores = (q @ k.transpose(1, 2) / math.sqrt(dh)).masked_fill(~mask[:, 0], float("-inf"))
        a = torch.softmax(scores, dim=-1)  # (B, 4, 5)
        assert torch.allclose(weights[:, i], a, atol=1e-6)
        heads.append(a @ v)
    expected = torch.cat(heads, dim=-1) @ mha.out_proj.weight.T + mha.out_proj.bias
    assert torch.allclose(out, expected, atol=1e-5)
    same, _ = mha(query, key, key, mask)  # key is value: the one-matmul projection
    assert torch.allclose(same, mha(query, key, key.clone(), mask)[0], atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masks_as_arithmetic_equal_masked_fill(monkeypatch, dtype):
    """The speed switch MASKS_AS_ARITHMETIC computes exactly what the masked_fill code does,
    fully masked rows included."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 3, 4, 8).to(dtype) for _ in range(3))
    mask = torch.rand(2, 1, 4, 4) > 0.4
    mask[0, 0, 2] = False  # a row with no allowed key
    results = []
    for switch in (False, True):
        monkeypatch.setattr(attention, "MASKS_AS_ARITHMETIC", switch)
        results.append(scaled_dot_product_attention(q, k, v, mask))
    (plain_out, plain_w), (fast_out, fast_w) = results
    assert torch.equal(plain_w, fast_w) and torch.equal(plain_out, fast_out)
    assert torch.all(plain_w[0, :, 2] == 0)


@pytest.mark.cuda
def test_decoder_is_causal(device):
    model = tiny_model(device=device)
    src = torch.randint(4, 40, (2, 7)).to(device)
    tgt = torch.randint(4, 40, (2, 6)).to(device)
    changed = tgt.clone()
    changed[:, 3:] = torch.randint(4, 40, (2, 3)).to(device)
    a, b = model(src, tgt), model(src, changed)
    assert torch.allclose(a[:, :3], b[:, :3], atol=1e-5)
    assert not torch.allclose(a[:, 3:], b[:, 3:], atol=1e-3)


@pytest.mark.cuda
def test_padding_does_not_change_real_positions(device):
    model = tiny_model(device=device)
    src = torch.tensor([[5, 6, 7, EOS_ID]], device=device)
    tgt = torch.tensor([[BOS_ID, 8, 9]], device=device)
    padded_src = torch.tensor([[5, 6, 7, EOS_ID, PAD_ID, PAD_ID]], device=device)
    padded_tgt = torch.tensor([[BOS_ID, 8, 9, PAD_ID]], device=device)
    assert torch.allclose(model(src, tgt), model(padded_src, padded_tgt)[:, :3], atol=1e-5)


@pytest.mark.parametrize("options", [{}, {"norm_first": True, "positional": "learned"}])
@pytest.mark.cuda
def test_cached_incremental_decoding_equals_full_forward(options, device):
    model = tiny_model(device=device, **options)
    src = torch.tensor([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, PAD_ID, PAD_ID]], device=device)
    tgt = torch.tensor([[BOS_ID, 11, 12, 13, 14], [BOS_ID, 15, 16, 17, 18]], device=device)
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
    assert shared.layers[0].src_attn.k.size(0) == 2 and repeated.layers[0].src_attn.k.size(0) == 6
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


@pytest.mark.parametrize("activation, expected", [
    ("relu", lambda h: h.clamp(min=0)),
    ("swish", lambda h: h * torch.sigmoid(h)),
    ("gelu", lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))),
])
def test_feed_forward_activation(activation, expected):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, with act chosen by ``model.activation``."""
    model = tiny_model(activation=activation).eval()
    ffn = model.encoder.layers[0].feed_forward
    x = torch.randn(2, 3, 32)
    by_hand = expected(x @ ffn.w_1.weight.T + ffn.w_1.bias) @ ffn.w_2.weight.T + ffn.w_2.bias
    assert torch.allclose(ffn(x), by_hand, atol=1e-5)


def test_output_bias_is_added_to_logits_and_learned():
    """``model.output_bias``: logits = states W^T + b, b a trainable (V,) vector (zero at the
    start); without it there is no bias at all."""
    assert tiny_model().decoder.output_projection.bias is None
    model = tiny_model(output_bias=True).eval()
    projection = model.decoder.output_projection
    assert projection.bias.shape == (projection.weight.size(0),) and not projection.bias.any()
    src, tgt = torch.tensor([[5, 6, EOS_ID]]), torch.tensor([[BOS_ID, 7]])
    before = model(src, tgt)
    with torch.no_grad():
        projection.bias[9] = 3.0
    after = model(src, tgt)
    assert torch.allclose(after[..., 9] - before[..., 9], torch.full((1, 2), 3.0))
    assert torch.allclose(after[..., :9], before[..., :9])
    after.sum().backward()
    assert projection.bias.grad is not None
