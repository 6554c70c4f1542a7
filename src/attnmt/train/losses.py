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


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, epsilon, ignore_index):
        x = logits.float()  # (N, V)
        keep = (target != ignore_index).float()  # (N,)
        safe_target = target.masked_fill(target == ignore_index, 0)
        lse = torch.logsumexp(x, dim=-1)  # (N,)
        nll = lse - x.gather(-1, safe_target[:, None]).squeeze(-1)  # (N,)
        smooth = lse - x.mean(dim=-1)  # (N,)
        loss = ((1.0 - epsilon) * nll + epsilon * smooth) * keep
        ctx.save_for_backward(logits, lse, safe_target, keep)
        ctx.epsilon = epsilon
        return loss.sum(), (nll * keep).sum()

    @staticmethod
    def backward(ctx, g_loss, g_nll):
        logits, lse, target, keep = ctx.saved_tensors
        eps, vocab = ctx.epsilon, logits.size(-1)
        g_loss = g_loss if g_loss is not None else torch.zeros((), device=logits.device)
        g_nll = g_nll if g_nll is not None else torch.zeros((), device=logits.device)
        row = keep[:, None]  # (N, 1)
        grad = torch.exp(logits.float() - lse[:, None])  # softmax, (N, V)
        grad.mul_(row * (g_loss + g_nll)).sub_(row * (g_loss * eps / vocab))
        grad.scatter_add_(-1, target[:, None], -row * (g_loss * (1.0 - eps) + g_nll))
        return grad.to(logits.dtype), None, None, None


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
