"""Training metrics: the run's JSON-lines log (and TensorBoard), and the throughput window.

``RUN_DIR/train_log.jsonl`` holds one JSON object per line: ``kind`` 'train' every
``train.log_every`` updates (loss, perplexity, learning rate, target tokens per second, peak
resident memory), 'valid' after every validation, 'average' for checkpoint averaging and
'done' at the end. When the ``tensorboard`` package is installed the same numbers are also
written as TensorBoard scalars under ``RUN_DIR/tensorboard`` (tags ``train/loss``,
``valid/valid_bleu``, ...).

Library: json; torch.utils.tensorboard (optional).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path


class MetricsLog:
    """Append-only JSON-lines file plus optional TensorBoard scalars (module docstring)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            self.tensorboard = None
        else:
            self.tensorboard = SummaryWriter(log_dir=str(path.parent / "tensorboard"))

    def write(self, kind: str, **record) -> None:
        """Append ``{"kind": kind, **record}`` as one line; numbers also go to TensorBoard."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, **record}) + "\n")
        if self.tensorboard is not None and "step" in record:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                    self.tensorboard.add_scalar(f"{kind}/{key}", value, record["step"])
            self.tensorboard.flush()


class Window:
    """Loss and throughput over the updates since the last log line.

    Sums of the label-smoothed loss, of the negative log-likelihood and of the target tokens
    (non-padding, EOS included) of the updates added since :meth:`reset`, and the wall-clock
    seconds since then.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.tokens, self.loss, self.nll, self.start = 0, 0.0, 0.0, time.monotonic()

    def add(self, tokens: int, loss: float, nll: float) -> None:
        self.tokens += tokens
        self.loss += loss
        self.nll += nll

    def summary(self) -> dict[str, float]:
        """{'loss': per target token, 'ppl': exp(nll per token), 'tgt_tokens_per_s'}."""
        tokens = max(self.tokens, 1)
        return {"loss": self.loss / tokens, "ppl": math.exp(min(self.nll / tokens, 50)),
                "tgt_tokens_per_s": self.tokens / max(time.monotonic() - self.start, 1e-9)}
