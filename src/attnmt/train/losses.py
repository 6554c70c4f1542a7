"""Label-smoothed cross-entropy that ignores padding (paper section 5.4; Szegedy et al., 2016).

The target distribution puts 1 - epsilon on the reference token y and spreads epsilon
uniformly over the whole vocabulary of V tokens (so y gets 1 - epsilon + epsilon / V). The
cross-entropy with it is, per position,

    loss = (1 - epsilon) * (-log p(y)) + epsilon * mean_v(-log p(v)),

the same as ``torch.nn.functional.cross_entropy(..., label_smoothing=epsilon)``. Positions whose
label is the padding id contribute nothing. The paper uses epsilon = 0.1.

:func:`label_smoothed_cross_entropy` is that formula on logits. The trainer uses, by default,
:func:`chunked_label_smoothed_cross_entropy`, which gives the same values and gradients with
less memory: the (N, V) logits are the largest tensors of a training step (125 MiB in float32
for a 4096-token batch over 8000 pieces, and their gradient as much again), so it takes the
output projection's input (N, D) and weight (V, D) instead of the logits and works through the
rows in chunks. For each chunk it computes the logits, the loss and, in the same pass, the
closed-form gradient with respect to the logits,

    d loss / d logits = softmax(logits) - (1 - epsilon) * onehot(y) - epsilon / V,

which it multiplies straight into the gradients of the input and of the weight; only those two
small gradients are kept for the backward pass. Memory figures are in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import torch


def label_smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The label-smoothed loss and the plain negative log-likelihood, summed over positions.

    Args:
        logits: (N, V) float, any float dtype (computed in float32).
        target: (N,) int64 labels; ``ignore_index`` entries are skipped.
        epsilon: smoothing mass in [0, 1).
    Returns:
        (loss, nll): float32 scalars, sums over non-ignored positions (divide by their count for
        a mean; exp(nll / count) is the perplexity). ``nll`` is detached: it is reported, not
        trained on.
    """
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    keep = target != ignore_index  # (N,)
    nll = -lprobs.gather(-1, target.masked_fill(~keep, 0)[:, None]).squeeze(-1)  # (N,)
    loss = (1.0 - epsilon) * nll + epsilon * -lprobs.mean(dim=-1)  # (N,)
    return (loss * keep).sum(), (nll * keep).sum().detach()


def per_sentence_label_smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The label-smoothed loss normalised per sentence: each sentence's mean loss over its
    (non-ignored) tokens, summed over the sentences (divide by their number for the batch mean,
    the normalisation of setups that average the loss per sentence, then over the batch).

    Args:
        logits: (B, T, V) float (computed in float32); target: (B, T) int64.
    Returns:
        (objective, loss, nll): float32 scalars; ``objective`` the sum of per-sentence means
        (differentiable), ``loss`` and ``nll`` the sums over tokens as in
        :func:`label_smoothed_cross_entropy` (detached, for reporting). A sentence with no
        token counts 0.
    """
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    keep = (target != ignore_index).float()  # (B, T)
    nll = -lprobs.gather(-1, target.masked_fill(target == ignore_index, 0)[..., None]).squeeze(-1)  # (B, T)
    loss = ((1.0 - epsilon) * nll + epsilon * -lprobs.mean(dim=-1)) * keep  # (B, T)
    per_sentence = loss.sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)  # (B,)
    return per_sentence.sum(), loss.sum().detach(), (nll * keep).sum().detach()


def chunked_label_smoothed_cross_entropy(
    states: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`label_smoothed_cross_entropy` of the logits ``states @ weight.T + bias``, computed
    in chunks of rows without holding all the logits (module docstring).

    Args:
        states: (N, D) float, the output projection's input; under CPU/CUDA autocast the
            projection runs in the autocast dtype, the softmax and loss in float32.
        weight: (V, D) float, the output projection's weight; bias: (V,) or None.
        target: (N,) int64 labels; ``ignore_index`` entries are skipped.
        epsilon: smoothing mass in [0, 1).
    Returns:
        (loss, nll) as :func:`label_smoothed_cross_entropy`. ``loss`` is differentiable with
        respect to ``states``, ``weight`` and ``bias`` (once: no double backward). With
        gradients off, or none of them requiring one, no gradient work is done.
    """
    inputs = (states, weight) if bias is None else (states, weight, bias)
    with_grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    return _ChunkedLoss.apply(states, weight, bias, target, epsilon, ignore_index, with_grad)


_CHUNK_ROWS = 1024  # rows of logits computed at once: float32 temporaries stay <= 1024 x V


class _ChunkedLoss(torch.autograd.Function):
    """Forward and, when asked, the gradients in one chunked pass (see the module docstring)."""

    @staticmethod
    def forward(ctx, states, weight, bias, target, epsilon, ignore_index, with_grad):
        device = states.device
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else states.dtype
        with torch.autocast(device.type, enabled=False):
            h, w = states.to(dtype), weight.to(dtype)  # (N, D), (V, D)
            b = bias.to(dtype) if bias is not None else None  # (V,)
            keep = (target != ignore_index).float()  # (N,)
            safe_target = target.masked_fill(target == ignore_index, 0)[:, None]  # (N, 1)
            vocab = w.size(0)
            loss_sum = torch.zeros((), dtype=torch.float32, device=device)
            nll_sum = torch.zeros((), dtype=torch.float32, device=device)
            grads = (None, None, None)
            if with_grad:
                grad_b = torch.zeros(vocab, dtype=torch.float32, device=device) if b is not None else None
                grads = (torch.empty(h.shape, dtype=torch.float32, device=device),
                         torch.zeros(w.shape, dtype=torch.float32, device=device), grad_b)
            for i in range(0, h.size(0), _CHUNK_ROWS):
                rows = slice(i, i + _CHUNK_ROWS)
                x = (h[rows] @ w.T if b is None else torch.addmm(b, h[rows], w.T)).float()  # logits (n, V)
                target_logit = x.gather(-1, safe_target[rows]).squeeze(-1)  # (n,)
                mean_logit = x.mean(dim=-1)  # (n,)
                # log-sum-exp with the row maximum subtracted; exp(x - max) is computed once, in
                # place of the logits, and gives the softmax for the gradient below.
                row_max = x.amax(dim=-1, keepdim=True)  # (n, 1)
                e = x.sub_(row_max).exp_()  # (n, V)
                row_sum = e.sum(dim=-1)  # (n,)
                lse = row_max.squeeze(-1) + row_sum.log()  # (n,)
                nll = lse - target_logit  # (n,) -log p(y)
                smooth = lse - mean_logit  # (n,) mean over v of -log p(v)
                k = keep[rows]  # (n,)
                loss_sum += (((1.0 - epsilon) * nll + epsilon * smooth) * k).sum()
                nll_sum += (nll * k).sum()
                if with_grad:
                    # d loss / d logits = (softmax - epsilon / V - (1 - epsilon) onehot(y)) * keep
                    g = e.mul_((k / row_sum)[:, None]).sub_(k[:, None] * (epsilon / vocab))
                    g.scatter_add_(-1, safe_target[rows], k[:, None] * -(1.0 - epsilon))
                    _accumulate(grads, g.to(dtype), h[rows], w, rows)
        ctx.save_for_backward(*(g for g in grads if g is not None))
        ctx.dtypes = (states.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss, g_nll):
        saved = ctx.saved_tensors
        grad_states, grad_weight = (saved[0] * g_loss).to(ctx.dtypes[0]), (saved[1] * g_loss).to(ctx.dtypes[1])
        grad_bias = (saved[2] * g_loss).to(ctx.dtypes[2]) if ctx.dtypes[2] is not None else None
        return grad_states, grad_weight, grad_bias, None, None, None, None


def _accumulate(grads: tuple, g: torch.Tensor, h: torch.Tensor, w: torch.Tensor, rows: slice) -> None:
    """Add one chunk's logit gradient g (n, V) into the gradients of the states (N, D), the
    weight (V, D) and the bias (V,) (None when there is none)."""
    grad_states, grad_weight, grad_bias = grads
    grad_states[rows] = g @ w  # (n, D)
    grad_weight.add_(g.T @ h)  # (V, D)
    if grad_bias is not None:
        grad_bias.add_(g.sum(dim=0, dtype=torch.float32))
