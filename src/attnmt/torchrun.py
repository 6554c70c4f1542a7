"""This process's place in a torchrun job, read from the environment torchrun sets: ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` (a process started without torchrun is rank 0 of 1).

Read here only, without PyTorch, so that the command line asks it for every command
(``--help`` included) at no import cost; ``attnmt.train.distributed`` joins the process group
the job describes.

Library: the environment variables of ``torch.distributed.run`` (PyTorch's torchrun).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job: ``rank`` of ``world_size`` processes, ``local_rank``
    among those on its machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes logs, checkpoints and the model directory."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def from_env(environ: Mapping[str, str] | None = None) -> Ranks:
    """The :class:`Ranks` that torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` variables give
    (rank 0 of 1 without them).

    Raises:
        ValueError: a rank outside ``[0, WORLD_SIZE)``, or a variable that is not an integer.
    """
    env = os.environ if environ is None else environ
    ranks = Ranks(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))
    if not 0 <= ranks.rank < ranks.world_size:
        raise ValueError(f"RANK {ranks.rank} outside WORLD_SIZE {ranks.world_size}")
    return ranks


def is_main_process(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is the one that writes and prints: ``RANK`` unset or ``"0"``.

    The text is compared, not parsed, so that every command runs (and ``--help`` prints) whatever
    ``RANK`` holds; training refuses a malformed one where it starts (:func:`from_env`).
    """
    env = os.environ if environ is None else environ
    return env.get("RANK", "0") == "0"
