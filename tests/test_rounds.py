"""attnmt.train.rounds: each start of torchrun's workers agrees on keys no earlier start used,
over the one store torchrun's agents keep across restarts."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch.distributed as dist

from attnmt.errors import EnvironmentFailure
from attnmt.train import rounds

TIMEOUT = datetime.timedelta(seconds=20)


def _store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False)


def _start(store: dist.TCPStore, world_size: int, rank0_delay: float = 0.0) -> list[str]:
    """One start of ``world_size`` ranks over ``store``: each rank's agreed name (rank 0 comes
    ``rank0_delay`` seconds after the others, as a slow machine's worker does)."""
    names: list[str | None] = [None] * world_size

    def rank(r: int) -> None:
        client = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=TIMEOUT)
        if r == 0:
            time.sleep(rank0_delay)
        names[r] = rounds.agree(client, r, world_size, TIMEOUT)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert None not in names
    return names  # type: ignore[return-value]


def test_a_restart_agrees_on_a_new_name_though_rank_0_comes_last():
    """The failure it prevents: a restarted rank 1, up before rank 0, read the previous start's
    keys (gloo's address of a gone rank 0) and failed with 'Connection refused'."""
    store = _store()
    first = _start(store, 3)
    assert len(set(first)) == 1
    again = _start(store, 3, rank0_delay=1.0)  # the earlier start's ask/answer/ok keys are all there
    assert len(set(again)) == 1 and again[0] != first[0]
    third = _start(store, 3, rank0_delay=0.5)
    assert len(set(third)) == 1 and third[0] not in (first[0], again[0])


def test_rank_0_alone_ends_in_one_environment_line_after_the_timeout():
    store = _store()
    with pytest.raises(EnvironmentFailure, match=r"rank\(s\) 1 did not join within train.dist_timeout"):
        rounds.agree(store, 0, 2, datetime.timedelta(seconds=0.5))
