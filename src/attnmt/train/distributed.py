"""Data-parallel training over several processes: torchrun's environment, the process group,
each rank's share of an update, the few collectives the trainer needs, and a clean stop on
SIGINT/SIGTERM.

torchrun (``python -m torch.distributed.run``) starts one process per GPU or CPU slot and sets
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (and the rendezvous address) in each one's
environment; :func:`attnmt.torchrun.from_env` reads them (a plain ``attnmt train`` is rank 0
of 1), and :class:`~attnmt.torchrun.Ranks` is importable from here too. The
process group is gloo on CPUs and NCCL on CUDA GPUs. Every rank starts from rank 0's
parameters, and the gradients are averaged over the ranks once an update's backward passes
are done (:func:`average_gradients`), so a process needs no more memory than a single one; on
CUDA, ``torch.nn.parallel.DistributedDataParallel`` averages them during the backward pass
instead, overlapping the communication with it (:func:`wrap`, ``train.ddp_overlap``).

One update takes the next ``world_size x accum_steps`` token batches of the epoch's batch
order (the same order on every rank: it depends on the seed and the epoch only); rank r takes
every ``world_size``-th of them from the r-th on (:func:`share`), so the ranks' shares are
disjoint and together are what one process with ``accum_steps x world_size`` accumulation
steps would take. The trainer divides the summed loss by the target tokens of the whole update
(all ranks, :func:`all_reduce_sum`) and multiplies it by ``world_size`` to undo the averaging,
so N processes x B tokens, one process x N*B tokens and one process x B tokens x N steps give
the same update, up to the order of floating-point sums.

Every collective waits at most ``train.dist_timeout`` seconds (:func:`init`) for the other
ranks: the training group's, and the exchange of rank 0's training data before training
(:func:`broadcast_data`, :func:`gather_data`, over a second, gloo group). So a lost network or a
machine gone silent ends every process within that time, each with one line naming the peer
(``attnmt.train.peers``), instead of waiting for ever. The timeout must cover rank 0's
validations (the others wait for them) and, for a configuration that names text, rank 0's
preparation of it (a large corpus: prepare it first with ``attnmt prepare``).

The data position in a checkpoint is global (batches of the epoch consumed), so a run saved
under N processes resumes under M. The dropout masks of every batch are drawn from a seed of
the update and the batch's place in it (:func:`batch_seed`), so they too are the same for any
world size. What cannot be exact across world sizes: the last batches of an epoch, too few to
give every rank one (fewer than ``world_size``), are skipped, so which are skipped depends on
the world size (one process with accumulation makes a smaller last update of them); and the
rounding of the gradient sums.

A stop signal (SIGINT, SIGTERM; torchrun forwards both to its workers as SIGTERM) only sets a
flag (:class:`attnmt.signals.StopSignals`); the ranks add their flags up at the start of every
update, so all of them stop at the same update boundary, rank 0 writes a resumable checkpoint,
and every process exits. A second SIGINT in the same process raises ``KeyboardInterrupt`` at
once. A signal that reaches rank 0 during a validation (which it runs while the others wait)
ends the evaluation at once; rank 0 tells the others, nothing is saved, and the checkpoint of
the previous validation is the one to resume from (files are written atomically, so none is
torn).

Library: torch.distributed, torch.nn.parallel.DistributedDataParallel.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from attnmt.errors import library_call
from attnmt.train import peers, rounds
from attnmt.torchrun import Ranks, from_env  # noqa: F401 (from_env: torchrun's environment, for the trainer)

log = logging.getLogger(__name__)

T = TypeVar("T")

_data_group: Any = None  # a gloo group beside the training group, for the data exchange
_timeout = 0.0  # train.dist_timeout of the groups, in seconds
_addresses: list[str] = []  # every rank's network address, in rank order (attnmt.train.peers)


def backend_for(device: torch.device) -> str:
    """The process-group backend: NCCL for CUDA tensors, gloo for CPU ones."""
    return "nccl" if device.type == "cuda" else "gloo"


def init(ranks: Ranks, device: torch.device, timeout: float) -> None:
    """Join the process group (rendezvous at torchrun's ``MASTER_ADDR:MASTER_PORT``, under keys
    of this start of the workers alone: ``attnmt.train.rounds``) unless this is a single process
    or the group exists already; learn every rank's address.

    Args:
        timeout: how long every collective waits for the other ranks, in seconds
            (``train.dist_timeout``).

    Raises:
        EnvironmentFailure: the rendezvous failed (torch.distributed's ``DistError``, a RuntimeError).
    """
    global _data_group, _timeout, _addresses
    if ranks.distributed and not dist.is_initialized():
        limit = datetime.timedelta(seconds=timeout)
        with library_call("torch.distributed (joining the process group)", "start every rank with torchrun, and "
                          "check MASTER_ADDR, MASTER_PORT and the network between the machines", RuntimeError):
            store = rounds.fresh_store(ranks.rank, ranks.world_size, limit)  # none of a previous start's keys
            dist.init_process_group(backend_for(device), store=store, rank=ranks.rank, world_size=ranks.world_size,
                                    timeout=limit, device_id=device if device.type == "cuda" else None)
            _data_group = dist.new_group(backend="gloo", timeout=limit)
        _timeout = timeout
        _addresses = gather_data(peers.own_address())
        log.info("rank %d of %d joined the %s process group", ranks.rank, ranks.world_size, backend_for(device))


def shutdown() -> None:
    """Leave the process group, if this process joined one."""
    global _data_group, _addresses
    if dist.is_initialized():
        dist.destroy_process_group()
    _data_group = None
    _addresses = []


@contextlib.contextmanager
def peer_failures(state: Path) -> Iterator[None]:
    """Around a run: a failed collective (a peer silent for ``train.dist_timeout`` seconds, or
    gone) raises the one-line :class:`~attnmt.errors.EnvironmentFailure` of :func:`failure`,
    naming the peer and where the last checkpoint ``state`` is (on rank 0's machine)."""
    try:
        yield
    except RuntimeError as e:  # torch.distributed.DistError is one
        ranks = from_env()
        where = "on rank 0's machine"
        if ranks.is_main:
            where = str(state) if state.is_file() else "not written yet"
        failed = failure(e, ranks, where)
        if failed is None:
            raise
        raise failed from None


def failure(error: BaseException, ranks: Ranks, checkpoint: str) -> peers.PeerLost | None:
    """The one-line :class:`~attnmt.errors.EnvironmentFailure` for ``error`` where it is a failed
    collective (a peer silent for ``train.dist_timeout`` seconds, or gone), naming the peer
    (``attnmt.train.peers``); None for any other error, or outside a process group."""
    if not _addresses or not peers.is_collective_failure(error):
        return None
    return peers.failure(error, ranks.rank, _addresses, _timeout, checkpoint)


def wrap(module: torch.nn.Module, ranks: Ranks, device: torch.device, overlap: bool | None = None
         ) -> torch.nn.Module:
    """``module`` with rank 0's parameters and buffers on every rank; for one process, itself.

    The plain way: ``module`` itself, its parameters and buffers broadcast from rank 0, and
    the gradients averaged once the update's last backward pass is done
    (:func:`average_gradients`); no memory beyond one process's. ``overlap`` (None: on CUDA)
    wraps it in ``DistributedDataParallel`` instead, which all-reduces buckets of gradients
    while the backward pass goes on. Its buckets are a second gradient-sized buffer per process;
    the gradients are views into them (``gradient_as_bucket_view``), not a third.
    """
    if not ranks.distributed:
        return module
    overlap = device.type == "cuda" if overlap is None else overlap
    if not overlap:
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src=0)
        return module
    # speed: the all-reduce of each bucket of gradients runs while the backward pass goes on
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids, gradient_as_bucket_view=True)


def no_sync(module: torch.nn.Module):
    """The context for a backward pass that is not an update's last on this process:
    ``DistributedDataParallel.no_sync`` (the gradients accumulate locally), else nothing."""
    return module.no_sync() if isinstance(module, DistributedDataParallel) else contextlib.nullcontext()


def average_gradients(module: torch.nn.Module, ranks: Ranks) -> None:
    """After an update's last backward pass: each gradient of ``module`` becomes its mean over
    the ranks (all-reduced in place, one tensor at a time: no extra buffer). Nothing for one
    process or a ``DistributedDataParallel`` module, which did it during the backward pass.
    A parameter without a gradient on this rank takes part with zeros, so every rank makes
    the same calls."""
    if not ranks.distributed or isinstance(module, DistributedDataParallel):
        return
    for p in module.parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad.div_(ranks.world_size)


def share(group: list[T], ranks: Ranks) -> list[T]:
    """Rank ``r``'s part of one update's ``group`` of batches: ``group[r::world_size]`` (module
    docstring). Empty when the group has fewer than ``world_size`` batches."""
    return group[ranks.rank:: ranks.world_size]


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sums of ``values`` over all ranks (float64); ``values`` for one process.

    ``device`` is where the collective's tensor lives: the training device (NCCL needs a CUDA
    tensor; gloo takes CPU ones).
    """
    if not dist.is_initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def broadcast(obj: T, device: torch.device) -> T:
    """Rank 0's ``obj`` on every rank (pickled; for small objects and, once, the resumed
    state); ``obj`` itself for one process."""
    if not dist.is_initialized():
        return obj
    box: list[Any] = [obj]
    dist.broadcast_object_list(box, src=0, device=device if device.type == "cuda" else None)
    return box[0]


def broadcast_data(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (pickled), waiting for rank 0 up to ``train.dist_timeout``:
    for what rank 0 sends once its training data is ready."""
    if _data_group is None:
        return obj
    box: list[Any] = [obj]
    dist.broadcast_object_list(box, src=0, group=_data_group)
    return box[0]


def gather_data(obj: T) -> list[T]:
    """Every rank's ``obj`` (pickled), in rank order, on every rank, waiting up to
    ``train.dist_timeout``: for what each rank says of the data it has opened."""
    if _data_group is None:
        return [obj]
    found: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(found, obj, group=_data_group)
    return found


def barrier() -> None:
    """Wait until every rank gets here (nothing for one process)."""
    if dist.is_initialized():
        dist.barrier()


def batch_seed(seed: int, step: int, index: int) -> int:
    """The seed of the dropout masks of the ``index``-th batch (in the update's whole group,
    all processes) of update ``step``: rank r's i-th batch is index r + i x world_size
    (:func:`share`). So N processes x k accumulated batches and 1 process x N k batches draw the
    same masks, and a run resumed under any number of processes draws what it would have."""
    return ((seed * 1_000_003 + step) * 1_000_033 + index) % 2**63


def rank_seed(seed: int, rank: int, step: int) -> int:
    """The random seed of rank ``rank > 0`` when a run starts or resumes at update ``step``:
    distinct per rank, for any random draw outside the updates (whose dropout masks come from
    :func:`batch_seed`)."""
    return (seed * 1_000_003 + rank) * 1_000_033 + step
