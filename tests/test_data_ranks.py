"""Several processes and their training data: the ranks wait for rank 0's preparation up to
``train.dist_timeout``, and past it end with one line naming rank 0; a rank that reads other data
than rank 0 stops the run in one line naming the rank and what differs."""

from __future__ import annotations

import multiprocessing
import os
import socket
import time

import pytest

from attnmt import rundir
from attnmt.config import config_from_dict
from attnmt.data.prepare import prepare
from attnmt.errors import DataError
from attnmt.train import data as train_data
from attnmt.train import distributed

from .conftest import copy_task_config


def _wait_for_rank_0(rank: int, port: int, results, preparing: float, timeout: float) -> None:
    """One of two gloo processes: rank 0 'prepares' for ``preparing`` seconds before it sends
    its directory; the groups' timeout is ``timeout`` seconds."""
    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ranks = distributed.Ranks(rank, 2)
    distributed.init(ranks, torch.device("cpu"), timeout)
    started = time.monotonic()
    try:
        if rank == 0:
            time.sleep(preparing)
        found = distributed.broadcast_data("the directory" if rank == 0 else None)
        results.put((rank, found, distributed.gather_data(rank * 10)))
    except RuntimeError as e:
        failed = distributed.failure(e, ranks, "none")
        results.put((rank, str(failed) if failed else repr(e), round(time.monotonic() - started)))
    finally:
        distributed.shutdown()


def _two_ranks(preparing: float, timeout: float) -> list[tuple]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    procs = [context.Process(target=_wait_for_rank_0, args=(r, port, results, preparing, timeout)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    return sorted(results.get(timeout=5) for _ in procs)


def test_ranks_wait_for_rank_0s_data_up_to_the_timeout():
    assert _two_ranks(2, 20) == [(0, "the directory", [0, 10]), (1, "the directory", [0, 10])]


def test_rank_0s_data_later_than_the_timeout_ends_the_others_in_one_line():
    found = dict((rank, rest) for rank, *rest in _two_ranks(8, 2))
    line, seconds = found[1]
    assert line.startswith("rank 1: no answer from rank 0 at 127.0.0.1 within train.dist_timeout (2 s)"), line
    assert seconds < 8  # it did not wait for rank 0


def test_a_rank_reading_other_data_stops_the_run_in_one_line(tmp_path):
    raw = copy_task_config(tmp_path, max_steps=1)
    rank0 = prepare(config_from_dict(raw), tmp_path / "rank0")
    raw["data"]["max_len"] = 3  # another corpus at the path the other machine reads
    prepare(config_from_dict(raw), tmp_path / "rank1")
    src_tok, tgt_tok = rundir.read_tokenizers(tmp_path / "rank0")
    rank1 = distributed.Ranks(1, 2)
    prepared = config_from_dict({"data": {"prepared": str(tmp_path / "rank1")}})
    found = (str(tmp_path / "rank1"), rank0.fingerprint, train_data._protos(src_tok, tgt_tok, rank1))
    directory = train_data._rank_directory(prepared, found, None, rank1)  # this machine's copy, read as it is
    mine = train_data._what_is_read(train_data._open(directory, *_parts(tmp_path / "rank1")))
    theirs = train_data._what_is_read(train_data._open(tmp_path / "rank0", *_parts(tmp_path / "rank0")))
    train_data.check_same_data([theirs, dict(theirs, directory="elsewhere")])  # the same data anywhere: fine
    with pytest.raises(DataError, match=r"rank 1 reads other training data than rank 0: fingerprint \w{12} in "
                                        r".*rank1, \w{12} in rank 0's .*rank0$") as e:
        train_data.check_same_data([theirs, mine])
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match=r"rank 2 reads other training data than rank 0: pairs 7 in x, "):
        train_data.check_same_data([theirs, theirs, dict(theirs, pairs=7, directory="x")])
    with pytest.raises(DataError, match=r"rank 1 reads other training data than rank 0: shards 3 in x, 1 in "):
        train_data.check_same_data([theirs, dict(theirs, shards=3, directory="x")])


def _parts(directory):
    from attnmt.data.manifest import Manifest

    return (Manifest.load(directory), *rundir.read_tokenizers(directory))
