"""``decode.precision: auto`` (``--precision auto``): the translation precision chosen before
the first batch.

On a CPU, :func:`translation_choice` times beam searches of the model itself (``attnmt.search``,
the native engine's own search) over batches of the decoder's shapes, in float32 and with the
weights in bfloat16, as the native engine runs each, and keeps the faster
(``attnmt.autoprecision``: the rule, the margin, never int8, and the cache per CPU model). The
batches are :data:`SENTENCES` sources of 12 to 20 random ids from the model's vocabulary, drawn
with a fixed seed from a generator of their own, searched with beam 4 and early stopping; the
rate is source tokens per second (the same sources at each precision, so the rates compare the
time a translation takes, longer outputs included). On a
CUDA GPU, bfloat16 where it has it; elsewhere float32.

Library: torch.
"""

from __future__ import annotations

import copy
import logging

import torch

from attnmt import autoprecision
from attnmt.autoprecision import Choice
from attnmt.data.tokenizers import EOS_ID
from attnmt.model.transformer import Transformer
from attnmt.search.batched import search_batch
from attnmt.search.options import SearchOptions

log = logging.getLogger(__name__)

SENTENCES = 16  # sources per timed search batch
BATCHES = 3  # one warm-up batch and two timed, for each precision
BEAM = 4  # the paper's beam size


def translation_choice(model: Transformer, device: torch.device) -> Choice:
    """The precision ``auto`` translates at on ``device`` with ``model`` (float32, in eval mode):
    module docstring."""
    if device.type != "cpu":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        choice = Choice("bf16" if bf16 else "fp32", how=f"the {device.type} rule")
        log.info("%s", choice.line())
        return choice
    vocab = len(model.decoder.embedding.weight)
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(BATCHES):
        lengths = torch.randint(12, 21, (SENTENCES,), generator=generator).tolist()
        batches.append([torch.randint(EOS_ID + 1, vocab, (n,), generator=generator).tolist() + [EOS_ID]
                        for n in lengths])
    models = {"fp32": model}
    options = SearchOptions(beam_size=BEAM, early_stopping=True, return_token_log_probs=False)

    def step(precision: str, i: int) -> int:
        if precision not in models:  # made on first use, only when the timing is not cached
            models[precision] = copy.deepcopy(model).to(torch.bfloat16)
        search_batch(models[precision], batches[i], options, device)
        return sum(map(len, batches[i]))  # source tokens: the same work for both precisions

    c = model.config
    shapes = (f"d_model {c.d_model} heads {c.num_heads} d_ff {c.d_ff} layers {c.num_encoder_layers}+"
              f"{c.num_decoder_layers} vocabulary {vocab} beam {BEAM} sentences {SENTENCES}")
    with torch.no_grad():
        return autoprecision.choose("translate", shapes, step, BATCHES)
