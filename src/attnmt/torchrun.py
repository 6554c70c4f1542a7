"""This process's place in a torchrun job, read from the environment torchrun sets: ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` (a process started without torchrun is rank 0 of 1), each
checked by :mod:`attnmt.environment` as the parser checks a number.

Read here only, without PyTorch, so that the command line asks it for every command
(``--help`` included) at no import cost; ``attnmt.train.distributed`` joins the process group
the job describes.

Library: the environment variables of ``torch.distributed.run`` (PyTorch's torchrun).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from attnmt import environment
from attnmt.errors import ConfigError


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
        ConfigError: a variable that is not a whole number of its range, or a rank outside
            ``[0, WORLD_SIZE)``.
    """
    ranks = Ranks(int(environment.number(environment.RANK, 0, environ)),
                  int(environment.number(environment.WORLD_SIZE, 1, environ)),
                  int(environment.number(environment.LOCAL_RANK, 0, environ)))
    if not ranks.rank < ranks.world_size:
        raise ConfigError(f"RANK={ranks.rank} is outside WORLD_SIZE={ranks.world_size}: use a rank from 0 to "
                          f"{ranks.world_size - 1}")
    if not ranks.local_rank < ranks.world_size:
        raise ConfigError(f"LOCAL_RANK={ranks.local_rank} is outside WORLD_SIZE={ranks.world_size}: use a rank "
                          f"from 0 to {ranks.world_size - 1}")
    return ranks


def is_main_process(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is the one that writes and prints: ``RANK`` unset or ``"0"``.

    The text is compared, not parsed, so that every command runs (and ``--help`` prints) whatever
    ``RANK`` holds; training refuses a malformed one where it starts (:func:`from_env`).
    """
    return environment.raw(environment.RANK, environ) in (None, "0")
