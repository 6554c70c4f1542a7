"""Label-smoothed cross-entropy that ignores padding (paper section 5.4; Szegedy et al., 2016).

The target distribution puts 1 - epsilon on the reference token and spreads epsilon uniformly
over the whole vocabulary V (so the reference gets 1 - epsilon + epsilon / V):

    loss = (1 - epsilon) * (-log p(y)) + epsilon * mean_v(-log p(v))

Positions whose label is the padding id contribute nothing. The paper uses epsilon = 0.1.

The gradient with respect to the logits has a closed form,
    d loss / d logits = softmax(logits) - (1 - epsilon) * onehot(y) - epsilon / V,
which a custom autograd function computes in one pass instead of autograd's chain of
log-softmax, gather and mean backward passes over the (N, V) logits (the largest tensor of a
training step). A test checks it against autograd on the plain formula.
"""

from __future__ import annotations

import torch


def label_smoothed_nll_loss_reference(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula above with plain autograd (the reference the fast version is tested against)."""
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    keep = target != ignore_index  # (N,)
    nll = -lprobs.gather(-1, target.masked_fill(~keep, 0)[:, None]).squeeze(-1)  # (N,)
    loss = (1.0 - epsilon) * nll + epsilon * -lprobs.mean(dim=-1)
    return (loss * keep).sum(), (nll * keep).sum()


_CHUNK_ROWS = 1024  # rows of logits processed at once: float32 temporaries stay <= 1024 x V


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Forward and closed-form backward, over row chunks so that float32 temporaries stay small
    and equally sized from step to step (the allocator then reuses them instead of growing)."""

    @staticmethod
    def forward(ctx, logits, target, epsilon, ignore_index):
        keep = (target != ignore_index).float()  # (N,)
        safe_target = target.masked_fill(target == ignore_index, 0)
        lse = torch.empty(logits.size(0), dtype=torch.float32, device=logits.device)  # (N,)
        loss_sum = torch.zeros((), dtype=torch.float32, device=logits.device)
        nll_sum = torch.zeros((), dtype=torch.float32, device=logits.device)
        for i in range(0, logits.size(0), _CHUNK_ROWS):
            x = logits[i: i + _CHUNK_ROWS].float()  # (n, V)
            lse_c = torch.logsumexp(x, dim=-1)  # (n,)
            nll = lse_c - x.gather(-1, safe_target[i: i + _CHUNK_ROWS, None]).squeeze(-1)  # (n,)
            smooth = lse_c - x.mean(dim=-1)  # (n,)
            k = keep[i: i + _CHUNK_ROWS]
            loss_sum += (((1.0 - epsilon) * nll + epsilon * smooth) * k).sum()
            nll_sum += (nll * k).sum()
            lse[i: i + _CHUNK_ROWS] = lse_c
        ctx.save_for_backward(logits, lse, safe_target, keep)
        ctx.epsilon = epsilon
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss, g_nll):
        logits, lse, target, keep = ctx.saved_tensors
        eps, vocab = ctx.epsilon, logits.size(-1)
        g_loss = g_loss if g_loss is not None else torch.zeros((), device=logits.device)
        g_nll = g_nll if g_nll is not None else torch.zeros((), device=logits.device)
        grad_logits = torch.empty_like(logits)  # (N, V)
        for i in range(0, logits.size(0), _CHUNK_ROWS):
            row = keep[i: i + _CHUNK_ROWS, None]  # (n, 1)
            g = torch.exp(logits[i: i + _CHUNK_ROWS].float() - lse[i: i + _CHUNK_ROWS, None])  # softmax (n, V)
            g.mul_(row * (g_loss + g_nll)).sub_(row * (g_loss * eps / vocab))
            g.scatter_add_(-1, target[i: i + _CHUNK_ROWS, None], -row * (g_loss * (1.0 - eps) + g_nll))
            grad_logits[i: i + _CHUNK_ROWS] = g
        return grad_logits, None, None, None


def label_smoothed_nll_loss(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss and summed plain negative log-likelihood.

    Args:
        logits: (N, V) any float dtype (computed in float32).
        target: (N,) int64 labels; ``ignore_index`` entries are skipped.
        epsilon: smoothing mass in [0, 1).
    Returns:
        (loss, nll): float32 scalars, sums over non-ignored positions (divide by their count
        for a mean; exp(nll / count) is the perplexity). Both are differentiable.
    """
    return _LabelSmoothedCrossEntropy.apply(logits, target, epsilon, ignore_index)
