"""Returned attention weights: rows sum to 1 over real source positions and are 0 on padding."""

from __future__ import annotations

import torch

from attnmt.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from tests.conftest import tiny_model


def test_source_attention_rows_sum_to_one_over_real_positions():
    model = tiny_model(seed=2)
    src = torch.tensor([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[BOS_ID, 11, 12], [BOS_ID, 13, 14]])
    memory, src_mask, enc = model.encode(src, need_weights=True)
    out = model.decode(tgt, memory, src_mask, need_weights=True)
    assert len(out.src_attn) == 2 and len(enc) == 2
    for w in out.src_attn:  # (B, H, T, S)
        assert torch.allclose(w.sum(dim=-1), torch.ones(2, 4, 3), atol=1e-5)
        assert torch.all(w[1, :, :, 3:] == 0)
    for w in enc:  # (B, H, S, S): padding keys get 0
        assert torch.all(w[1, :, :, 3:] == 0)
    for w in out.self_attn:  # causal: no weight on the future
        assert torch.all(w.triu(diagonal=1) == 0)
