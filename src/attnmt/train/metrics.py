"""Training metrics: the run's JSON-lines log (and TensorBoard), and the throughput window.

``RUN_DIR/train_log.jsonl`` holds one JSON object per line: ``kind`` 'train' every
``train.log_every`` updates (loss, perplexity, learning rate, target tokens per second, peak
resident memory), 'valid' after every validation, 'nonfinite' for an update skipped because
its loss or gradient norm was not finite, 'average' for checkpoint averaging and 'done' at the
end. The file is strict JSON: a number that is not finite (NaN, infinity) is written as
``null``. Each record is appended with one write, flushed and fsynced; the resumable state
remembers the log's length, and a resume cuts the log back to it, so records between the
checkpoint and a crash are not kept twice, and a line torn by a crash or a full disk is cut. When the ``tensorboard`` package is installed the same numbers are also
written as TensorBoard scalars under ``RUN_DIR/tensorboard`` (tags ``train/loss``,
``valid/valid_bleu``, ...).

Library: json; torch.utils.tensorboard (optional).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

from attnmt.errors import DataError, write_error
from attnmt.oneline import finite_or_none

log = logging.getLogger(__name__)


class MetricsLog:
    """Append-only JSON-lines file plus optional TensorBoard scalars (module docstring).

    Args:
        path: the log file.
        truncate_to: cut the file to this many bytes first (0 for a new run, the checkpoint's
            :attr:`size` on resume); None keeps it as it is.
    """

    def __init__(self, path: Path, truncate_to: int | None = None):
        self.path = path
        self.size = path.stat().st_size if path.exists() else 0  # bytes of whole records written
        if truncate_to is not None and self.size > truncate_to:
            os.truncate(path, truncate_to)
            self.size = truncate_to
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            self.tensorboard = None
        else:
            self.tensorboard = SummaryWriter(log_dir=str(path.parent / "tensorboard"))

    def write(self, kind: str, **record) -> None:
        """Append ``{"kind": kind, **record}`` as one line (non-finite numbers as null), flushed and
        fsynced; numbers also go to TensorBoard.

        Raises:
            WriteError: the line cannot be written (a full disk: ``DiskFull``); the file is cut back to
                its last whole record.
        """
        line = (json.dumps(finite_or_none({"kind": kind, **record}), allow_nan=False) + "\n").encode("utf-8")
        try:
            with open(self.path, "ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            if self.path.exists() and self.path.stat().st_size > self.size:
                os.truncate(self.path, self.size)
            raise write_error(f"{self.path}: cannot write: {e.strerror or e}", e) from e
        self.size += len(line)
        if self.tensorboard is not None and "step" in record:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                    self.tensorboard.add_scalar(f"{kind}/{key}", value, record["step"])
            self.tensorboard.flush()


def read_log(path: str | Path) -> list[dict]:
    """The records of a JSON-lines training log. A torn last line (a crash while writing) is
    skipped with a warning.

    Raises:
        DataError: the file is unreadable, or a line other than the last is not a JSON object
            (``path:line``).
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}") from None
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            if number == len(lines):  # the last line has no newline: torn by a crash
                log.warning("%s:%d: torn last record skipped", path, number)
                continue
            raise DataError(f"{path}:{number}: not a JSON record") from None
        records.append(record)
    return records


class Window:
    """Loss and throughput over the updates since the last log line.

    Sums of the label-smoothed loss, of the negative log-likelihood and of the target tokens
    (non-padding, EOS included) of the updates added since :meth:`reset`, and the wall-clock
    seconds since then.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.tokens = 0
        self.loss = 0.0
        self.nll = 0.0
        self.start = time.monotonic()

    def add(self, tokens: int, loss: float, nll: float) -> None:
        self.tokens += tokens
        self.loss += loss
        self.nll += nll

    def summary(self) -> dict[str, float]:
        """{'loss': per target token, 'ppl': exp(nll per token), 'tgt_tokens_per_s'}."""
        tokens = max(self.tokens, 1)
        return {"loss": self.loss / tokens, "ppl": math.exp(min(self.nll / tokens, 50)),
                "tgt_tokens_per_s": self.tokens / max(time.monotonic() - self.start, 1e-9)}
