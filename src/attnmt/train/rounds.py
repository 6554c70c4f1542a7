"""A fresh namespace in torchrun's store for each start of a job's workers, so that a restarted
worker never reads what a worker of an earlier start left there.

torchrun's agents keep one store for the workers across restarts (the rendezvous' shared
TCPStore, ``TORCHELASTIC_USE_AGENT_STORE``), and the process group's keys (gloo publishes each
rank's listening address under a fixed key) are the same at every start. After
``--max-restarts`` restarted the workers, a worker that came up before its peer read the
peer's address of the previous start, a process that is gone, and failed to join with
"Connection refused", using up the restarts. ``TORCHELASTIC_RESTART_COUNT`` cannot name the
start: an agent whose own workers did not fail restarts them without counting.

So the ranks first agree on a name no earlier start used (:func:`fresh_store`): each rank
``r > 0`` writes a new random word under ``ask/r`` and waits for the key ``answer/<its word>``,
which only a rank 0 that read it can have written; rank 0 answers every word it reads with its
own new random word, until each rank has confirmed under ``ok/<rank 0's word>/r`` (a key no
earlier start can have made). The process group then keeps its keys under rank 0's word.
Every waiting is bounded by ``train.dist_timeout``.

Library: torch.distributed (``rendezvous``, ``PrefixStore``), secrets.
"""

from __future__ import annotations

import datetime
import secrets
import time
from typing import Any

import torch.distributed as dist

from attnmt.errors import EnvironmentFailure

PREFIX = "attnmt/start/"
POLL = 0.05  # seconds between rank 0's looks at the store


def fresh_store(rank: int, world_size: int, timeout: datetime.timedelta) -> Any:
    """torchrun's store (``env://``: ``MASTER_ADDR``, ``MASTER_PORT``, read by torch) with a
    prefix that this start of the job's workers alone uses (module docstring).

    Raises:
        RuntimeError, EnvironmentFailure: as :func:`agree`.
    """
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
    return dist.PrefixStore(f"{PREFIX}{agree(store, rank, world_size, timeout)}/", store)


def agree(store: Any, rank: int, world_size: int, timeout: datetime.timedelta) -> str:
    """The name of this start, the same on every rank and new (rank 0's random word), agreed
    over ``store`` whatever an earlier start left in it (module docstring).

    Raises:
        RuntimeError: the store's ``DistStoreError``: a rank waited for rank 0 longer than
            ``timeout`` (the store's own timeout).
        EnvironmentFailure: rank 0 waited for the other ranks longer than ``timeout``.
    """
    word = secrets.token_hex(16)
    if rank == 0:
        _answer(store, word, world_size, time.monotonic() + timeout.total_seconds())
        return word
    store.set(f"{PREFIX}ask/{rank}", word)
    start = store.get(f"{PREFIX}answer/{word}").decode()  # waits up to the store's timeout
    store.set(f"{PREFIX}ok/{start}/{rank}", "1")
    return start


def _answer(store: Any, word: str, world_size: int, deadline: float) -> None:
    """Rank 0's part: answer each rank's latest word with ``word`` until all have confirmed."""
    answered: dict[int, str] = {}
    waiting = set(range(1, world_size))
    while waiting:
        for r in sorted(waiting):
            if store.check([f"{PREFIX}ask/{r}"]):
                asked = store.get(f"{PREFIX}ask/{r}").decode()
                if answered.get(r) != asked:
                    store.set(f"{PREFIX}answer/{asked}", word)
                    answered[r] = asked
            if store.check([f"{PREFIX}ok/{word}/{r}"]):
                waiting.discard(r)
        if waiting and time.monotonic() > deadline:
            raise EnvironmentFailure(f"torch.distributed (joining the process group) failed: rank(s) "
                                     f"{', '.join(map(str, sorted(waiting)))} did not join within "
                                     f"train.dist_timeout; check that machine and the network")
        if waiting:
            time.sleep(POLL)
