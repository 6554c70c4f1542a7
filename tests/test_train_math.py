"""Label-smoothed loss and learning-rate schedules against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

import torch.nn.functional as F

from attnmt.train.losses import chunked_label_smoothed_cross_entropy, label_smoothed_cross_entropy
from attnmt.train.schedules import constant_lr, inverse_sqrt_lr, learning_rate, noam_lr


def test_label_smoothed_loss_hand_computed():
    logits = torch.tensor([[0.0, math.log(2.0), math.log(5.0)], [1.0, 1.0, 1.0]])  # (N, V)
    target = torch.tensor([2, 0])
    eps = 0.1
    # Row 0: p = (1, 2, 5) / 8; row 1: uniform 1/3. The pad id 0 is ignored below.
    lp0 = [math.log(1 / 8), math.log(2 / 8), math.log(5 / 8)]
    lp1 = [math.log(1 / 3)] * 3
    expected = sum((1 - eps) * -lp[y] + eps * -sum(lp) / 3 for lp, y in ((lp0, 2), (lp1, 0)))
    loss, nll = label_smoothed_cross_entropy(logits, target, eps, ignore_index=-100)
    assert nll.item() == pytest.approx(-lp0[2] - lp1[0], abs=1e-6)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss_pad, nll_pad = label_smoothed_cross_entropy(logits, target, eps, ignore_index=0)  # row 1 is padding
    assert nll_pad.item() == pytest.approx(-lp0[2], abs=1e-6)
    assert loss_pad.item() == pytest.approx((1 - eps) * -lp0[2] + eps * -sum(lp0) / 3, abs=1e-6)
    # The smoothing is PyTorch's: epsilon spread over all V classes, the target included.
    torch_loss = F.cross_entropy(logits, target, ignore_index=0, reduction="sum", label_smoothing=eps)
    assert loss_pad.item() == pytest.approx(torch_loss.item(), abs=1e-6)


@pytest.mark.parametrize("autocast,with_bias", [(False, False), (False, True), (True, False)])
def test_chunked_loss_and_gradients_equal_the_plain_formula(autocast, with_bias):
    torch.manual_seed(0)
    states = torch.randn(2500, 16)  # (N, D): more rows than one chunk
    weight = torch.randn(37, 16)  # (V, D)
    bias = torch.randn(37) if with_bias else None
    target = torch.randint(0, 37, (2500,))
    target[::7] = 0
    h1, w1 = states.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = states.clone().requires_grad_(), weight.clone().requires_grad_()
    b1 = bias.clone().requires_grad_() if with_bias else None
    b2 = bias.clone().requires_grad_() if with_bias else None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        la, na = chunked_label_smoothed_cross_entropy(h1, w1, target, 0.1, 0, b1)
        logits = F.linear(h2, w2, b2)  # bf16 logits under autocast
        lb, nb = label_smoothed_cross_entropy(logits, target, 0.1, 0)
    (0.25 * la).backward()
    (0.25 * lb).backward()
    assert la.item() == pytest.approx(lb.item(), rel=1e-5)
    assert na.item() == pytest.approx(nb.item(), rel=1e-5)
    assert not na.requires_grad
    tol = 1e-6 if not autocast else 2e-2
    assert h1.grad.dtype == w1.grad.dtype == torch.float32
    assert torch.allclose(h1.grad, h2.grad, atol=tol, rtol=1e-3)
    assert torch.allclose(w1.grad, w2.grad, atol=10 * tol, rtol=1e-2)
    if with_bias:
        assert torch.allclose(b1.grad, b2.grad, atol=10 * tol, rtol=1e-3)
    assert torch.all(h1.grad[::7] == 0)  # padding rows get no gradient


def test_chunked_loss_without_gradients_does_no_gradient_work():
    states, weight = torch.randn(10, 4, requires_grad=True), torch.randn(6, 4, requires_grad=True)
    target = torch.randint(1, 6, (10,))
    with torch.no_grad():
        loss, _ = chunked_label_smoothed_cross_entropy(states, weight, target, 0.1, 0)
    reference, _ = label_smoothed_cross_entropy(states @ weight.T, target, 0.1, 0)
    assert loss.grad_fn is None
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)


def test_noam_schedule_values():
    d, warmup = 512, 4000
    assert noam_lr(1, d, warmup) == pytest.approx(512 ** -0.5 * 4000 ** -1.5)
    assert noam_lr(4000, d, warmup) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)  # the peak
    assert noam_lr(16000, d, warmup, factor=2.0) == pytest.approx(2 * 512 ** -0.5 / 126.491106, rel=1e-6)
    assert noam_lr(3999, d, warmup) < noam_lr(4000, d, warmup) > noam_lr(4001, d, warmup)


def test_constant_and_inverse_sqrt():
    assert constant_lr(5, 1e-3, warmup_steps=10) == pytest.approx(5e-4)
    assert constant_lr(50, 1e-3, warmup_steps=10) == 1e-3
    assert inverse_sqrt_lr(100, 1e-3, 400) == pytest.approx(2.5e-4)
    assert inverse_sqrt_lr(1600, 1e-3, 400) == pytest.approx(5e-4)
    assert learning_rate("noam", 10, d_model=256, lr=1.0, lr_factor=1.0, warmup_steps=100) == noam_lr(10, 256, 100)


def test_lambda_lr_gives_the_schedule_to_every_update():
    # The trainer's LambdaLR over a base rate of 1.0: update n (1-based) runs at learning_rate(n).
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([param], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: learning_rate("noam", i + 1, d_model=64, lr=1.0, lr_factor=2.0, warmup_steps=10))
    for update in range(1, 25):
        assert optimizer.param_groups[0]["lr"] == noam_lr(update, 64, 10, 2.0)
        optimizer.step()
        scheduler.step()
