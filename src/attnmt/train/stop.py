"""Why a training run stops: the one stop policy, and the stop for non-finite updates.

:func:`stop_reason` reads every stop condition of ``train`` (``max_steps``, ``max_minutes``,
``max_epochs``, ``stop_patience``) at the moments the loop (``attnmt.train.loop``) asks it.
"""

from __future__ import annotations

from pathlib import Path

from attnmt.config import TrainConfig
from attnmt.errors import TrainingError
from attnmt.train.trainer import Progress

AFTER_UPDATE = "update"
AFTER_VALIDATION = "validation"
AT_EPOCH_END = "epoch"
ANY_MOMENT = "any"


class NonFiniteError(TrainingError):
    """``train.max_nonfinite_updates`` updates in a row had a non-finite loss or gradient norm;
    the last finite state is saved in ``last_state``, to resume from (with a lower learning
    rate, say)."""

    def __init__(self, limit: int, step: int, last_state: Path):
        super().__init__(f"{limit} updates in a row with a non-finite loss or gradient norm after step {step}; "
                         f"the last finite state is in {last_state}")
        self.last_state = last_state


def stop_reason(train: TrainConfig, progress: Progress, moment: str, seconds: float = 0.0,
                valid_seconds: float = 0.0) -> str | None:
    """The stop policy: why training must stop at ``moment``, or None to go on.

    After an update (``AFTER_UPDATE``): ``max_steps``, then ``max_minutes`` (``seconds`` of the
    run so far, leaving 1.5 times the last validation's ``valid_seconds`` and 5 s for the
    final one). After a ``valid_every`` validation (``AFTER_VALIDATION``): ``stop_patience``.
    At an epoch's end (``AT_EPOCH_END``): ``max_epochs``. ``ANY_MOMENT``: all four, in that
    order, so that a resumed run sees that it is already over.
    """
    after_update = moment in (AFTER_UPDATE, ANY_MOMENT)
    if after_update and train.max_steps and progress.step >= train.max_steps:
        return f"reached max_steps {train.max_steps}"
    if after_update and train.max_minutes and seconds + 1.5 * valid_seconds + 5 >= train.max_minutes * 60:
        return f"reached the {train.max_minutes:g}-minute budget"
    if moment in (AT_EPOCH_END, ANY_MOMENT) and train.max_epochs and progress.epoch >= train.max_epochs:
        return f"reached max_epochs {train.max_epochs}"
    patience = train.stop_patience
    if moment in (AFTER_VALIDATION, ANY_MOMENT) and patience and progress.bad_validations >= patience:
        return f"no improvement in {patience} validations"
    return None
