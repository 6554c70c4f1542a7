"""Learning-rate schedules as pure functions of the update number (1-based).

noam (paper section 5.3, equation 3):
    lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
constant: ``lr`` throughout, with an optional linear warmup.
inverse_sqrt (fairseq-style): linear warmup to ``lr``, then lr * sqrt(warmup / step).
"""

from __future__ import annotations


def noam_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """Equation 3; ``step`` >= 1. With warmup_steps 0 the rate simply decays as step^-0.5."""
    step = max(step, 1)
    if warmup_steps == 0:
        return factor * d_model ** -0.5 * step ** -0.5
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def constant_lr(step: int, lr: float, warmup_steps: int = 0) -> float:
    """``lr``, reached linearly over ``warmup_steps`` updates."""
    if warmup_steps and step < warmup_steps:
        return lr * max(step, 1) / warmup_steps
    return lr


def inverse_sqrt_lr(step: int, lr: float, warmup_steps: int) -> float:
    """Linear warmup to ``lr``, then decay proportional to step^-0.5."""
    step = max(step, 1)
    if warmup_steps and step < warmup_steps:
        return lr * step / warmup_steps
    return lr * (max(warmup_steps, 1) / step) ** 0.5


def learning_rate(schedule: str, step: int, *, d_model: int, lr: float, lr_factor: float,
                  warmup_steps: int) -> float:
    """Dispatch on a schedule name: 'noam', 'constant' or 'inverse_sqrt'."""
    if schedule == "noam":
        return noam_lr(step, d_model, warmup_steps, lr_factor)
    if schedule == "constant":
        return constant_lr(step, lr, warmup_steps)
    if schedule == "inverse_sqrt":
        return inverse_sqrt_lr(step, lr, warmup_steps)
    raise ValueError(f"unknown schedule {schedule!r}")
