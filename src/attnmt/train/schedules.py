"""Learning-rate schedules as pure functions of the update number (1-based).

noam (paper section 5.3, equation 3):
    lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
constant: ``lr`` throughout, with an optional linear warmup.
inverse_sqrt (fairseq-style): linear warmup to ``lr``, then lr * sqrt(warmup / step).
cosine_restarts (SGDR, Loshchilov and Hutter, 2017, eq. 5; the parameterisation of TensorFlow's
    ``CosineDecayRestarts``): cosine decay from ``lr`` to ``alpha * lr`` over periods that grow by
    ``t_mul``, each restart's peak ``m_mul`` times the previous one.
time_budget: the noam curve (or a cosine) over the fraction f of the wall-clock budget used
    rather than over update counts, so the warmup and decay fit the budget on a fast machine and
    on a slow one: f = step / expected updates in the budget, the expectation refitted to the
    measured update rate as training goes (:func:`expected_updates`).

Curriculum dropout (Morerio et al., 2017): not a learning rate but a schedule of the
same kind, :func:`curriculum_dropout` gives the share of the configured dropout probabilities
in use after a number of updates.
"""

from __future__ import annotations

import math


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


def cosine_restarts_lr(step: int, lr: float, first_decay_steps: int, t_mul: float = 2.0, m_mul: float = 1.0,
                       alpha: float = 0.0) -> float:
    """Cosine decay with warm restarts at update ``step`` (1-based; TensorFlow counts from 0, so
    update 1 gets the initial rate ``lr``).

    With c = (step - 1) / first_decay_steps, the restart i and the fraction x of its period are
    i = floor(c), x = c - i when t_mul = 1, else i = floor(log(1 - c (1 - t_mul)) / log(t_mul))
    and x = (c - (1 - t_mul^i) / (1 - t_mul)) / t_mul^i. The rate is
    lr * ((1 - alpha) * 0.5 * m_mul^i * (1 + cos(pi x)) + alpha).
    With t_mul < 1 the periods shrink and all of them together last first_decay_steps /
    (1 - t_mul) updates; after that (where TensorFlow's formula has no value) the rate stays at
    its floor lr * alpha.
    """
    c = (step - 1) / first_decay_steps
    if t_mul == 1.0:
        i = math.floor(c)
        x = c - i
    else:
        inner = 1.0 - c * (1.0 - t_mul)
        if inner <= 0.0:  # past the end of infinitely many shrinking periods (t_mul < 1)
            return lr * alpha
        i = math.floor(math.log(inner) / math.log(t_mul))
        x = (c - (1.0 - t_mul ** i) / (1.0 - t_mul)) / t_mul ** i
    cosine = 0.5 * m_mul ** i * (1.0 + math.cos(math.pi * x))
    return lr * ((1.0 - alpha) * cosine + alpha)


def time_budget_lr(step: int, expected_steps: float, lr: float, warmup_fraction: float,
                   decay: str = "inverse_sqrt") -> float:
    """The rate at update ``step`` when the budget is expected to hold ``expected_steps`` updates.

    With f = step / expected_steps (the fraction of the budget used, at most 1) and w =
    ``warmup_fraction``: lr * f / w during the warmup, then lr * sqrt(w / f) ('inverse_sqrt',
    the shape of equation 3) or lr * 0.5 * (1 + cos(pi (f - w) / (1 - w))) ('cosine', 0 at the
    end of the budget).
    """
    f = min(step / max(expected_steps, 1.0), 1.0)
    if f < warmup_fraction:
        return lr * f / warmup_fraction
    if decay == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * (f - warmup_fraction) / (1.0 - warmup_fraction)))
    return lr * math.sqrt(warmup_fraction / f)


def curriculum_dropout(step: int, time_constant: float) -> float:
    """Share of each configured dropout probability in use after ``step`` updates (step >= 0),
    1 - exp(-step / time_constant): Morerio et al.'s (2017) retain probability
    theta(t) = (1 - theta_bar) exp(-gamma t) + theta_bar written for the drop probability, with
    gamma = 1 / time_constant (in updates). It starts at 0 and reaches 0.63 after
    ``time_constant`` updates and 0.95 after three times as many: early updates, far from
    overfitting, learn without the noise, later ones get the whole p.
    """
    return 1.0 - math.exp(-step / time_constant)


def expected_updates(steps: int, elapsed_seconds: float, budget_seconds: float) -> float:
    """The updates a wall-clock budget will hold at the rate measured so far: ``steps`` done in
    ``elapsed_seconds`` (validation time included, so that it is budgeted too), extrapolated to
    ``budget_seconds``. Before any measurement (``steps`` 0) it is infinite, so the first
    update's rate is (nearly) zero, as at the start of any warmup."""
    if steps <= 0 or elapsed_seconds <= 0:
        return float("inf")
    return steps * budget_seconds / elapsed_seconds


def learning_rate(schedule: str, step: int, *, d_model: int, lr: float, lr_factor: float,
                  warmup_steps: int, **options: float) -> float:
    """Dispatch on a schedule name: 'noam', 'constant', 'inverse_sqrt', 'cosine_restarts'
    (options first_decay_steps, t_mul, m_mul, alpha) or 'time_budget' (options
    expected_steps, warmup_fraction, budget_decay)."""
    if schedule == "noam":
        return noam_lr(step, d_model, warmup_steps, lr_factor)
    if schedule == "constant":
        return constant_lr(step, lr, warmup_steps)
    if schedule == "inverse_sqrt":
        return inverse_sqrt_lr(step, lr, warmup_steps)
    if schedule == "cosine_restarts":
        return cosine_restarts_lr(step, lr, int(options["first_decay_steps"]), options["t_mul"], options["m_mul"],
                                  options["alpha"])
    if schedule == "time_budget":
        return time_budget_lr(step, options["expected_steps"], lr, options["warmup_fraction"],
                              str(options["budget_decay"]))
    raise ValueError(f"unknown schedule {schedule!r}")
